"""Anchor chains (two contractions in one fused group, e.g. `Gemm -> Relu -> Gemm -> Relu`) on the
Triton targets: one tiled `tl.dot` kernel per contraction, the tensor between them written once.

A Triton anchor kernel holds one accumulator tile; the second contraction needs whole rows of the
first one's result, which other programs compute. So the group is cut before each later
contraction: the first part is everything the later contraction's in-group operands depend on,
the rest is the second part, and the tensors crossing the cut become outputs of the first kernel
and inputs of the second (device tensors named after the step, never seen by the user). The
group still runs without going back to the host; the report lists it as the same one kernel node.
"""

from __future__ import annotations

from dataclasses import replace

import onnx

from ...lower.values import Unsupported
from ...plan.anchor_match import ANCHOR_OPS
from ..cpu.extract import ExecutionPlan, KernelStep
from ..cpu.kernel_spec import KernelSpec, TensorInfo


def split_chain(spec: KernelSpec) -> list[KernelSpec]:
    """The group as kernels of one contraction each, in order (`Unsupported` when it cannot be cut)."""
    contractions = [k for k, n in enumerate(spec.nodes) if n.op_type in ANCHOR_OPS]
    if len(contractions) < 2:
        raise Unsupported("not an anchor chain")
    producer = {o: k for k, n in enumerate(spec.nodes) for o in n.output if o}
    second = spec.nodes[contractions[1]]
    first: set[int] = set()
    stack = [producer[i] for i in second.input if i in producer]
    while stack:
        k = stack.pop()
        if k not in first:
            first.add(k)
            stack.extend(producer[i] for i in spec.nodes[k].input if i in producer)
    if contractions[1] in first or not first:
        raise Unsupported("the later contraction does not depend on the earlier one")
    head = [n for k, n in enumerate(spec.nodes) if k in first]
    tail = [n for k, n in enumerate(spec.nodes) if k not in first]
    outputs = {t.name for t in spec.outputs}
    made = {o for n in head for o in n.output if o}
    used_later = {i for n in tail for i in n.input if i}
    crossing = [o for n in head for o in n.output if o and (o in used_later or o in outputs)]
    head_spec = _part(spec, head, crossing, 0)
    tail_outputs = [t.name for t in spec.outputs if t.name not in made]
    tail_spec = _part(spec, tail, tail_outputs, 1)
    parts = [head_spec]
    if sum(1 for n in tail if n.op_type in ANCHOR_OPS) > 1:
        parts.extend(split_chain(tail_spec))
    else:
        parts.append(tail_spec)
    return parts


def _part(spec: KernelSpec, nodes: list[onnx.NodeProto], outputs: list[str], k: int) -> KernelSpec:
    """The kernel of `nodes`: it reads the group's inputs and the crossing tensors it needs, and
    keeps the group's body constants as constants."""
    made = {o for n in nodes for o in n.output if o}
    formal = {t.name for t in spec.inputs}
    inputs = [
        spec.tensors[name]
        for name in dict.fromkeys(i for n in nodes for i in n.input if i and i not in made)
        if name in formal or name not in spec.constants
    ]
    return replace(
        spec,
        symbol=f"{spec.symbol}_part{k}",
        template="anchor",
        nodes=tuple(nodes),
        inputs=tuple(inputs),
        outputs=tuple(spec.tensors[o] for o in outputs),
    )


def expand_steps(plan: ExecutionPlan, parts: dict[str, list[KernelSpec]]) -> None:
    """Replace each step of a split spec by one step per part, with step-private tensors between."""
    steps = []
    for step in plan.steps:
        if not (isinstance(step, KernelStep) and step.symbol in parts):
            steps.append(step)
            continue
        spec = plan.specs[step.symbol]
        formals = (*spec.inputs, *spec.outputs)
        actual = {t.name: a for t, a in zip(formals, (*step.inputs, *step.outputs), strict=True)}
        for part in parts[step.symbol]:
            for t in part.outputs:
                if t.name not in actual:
                    actual[t.name] = f"{step.node_name}/{t.name}"
                    plan.tensors[actual[t.name]] = TensorInfo(actual[t.name], t.shape, t.elem_type)
            plan.specs.setdefault(part.symbol, part)
            steps.append(
                KernelStep(
                    part.symbol,
                    tuple(actual[t.name] for t in part.inputs),
                    tuple(actual[t.name] for t in part.outputs),
                    step.node_name,
                    step.node,
                )
            )
    plan.steps = steps
