"""Anchor chains (two contractions in one fused group, e.g. `Gemm -> Relu -> Gemm -> Relu`) on the
Triton targets: one tiled `tl.dot` kernel per contraction, the tensor between them written once.

A Triton anchor kernel holds one accumulator tile; the second contraction needs whole rows of the
first one's result, which other programs compute. So the group is cut before each later
contraction: the first part is everything the later contraction's in-group operands depend on,
the rest is the second part, and the tensors crossing the cut become outputs of the first kernel
and inputs of the second (device tensors named after the step, never seen by the user). The
group still runs without going back to the host; the report lists it as the same one kernel node.

Groups planned for the CPU may also carry a row stage in an anchor (plan/anchor_match.py: a
LayerNormalization closing it, a GlobalAveragePool opening it), which the Triton anchors do not
render: `split_row_stages` cuts the stage off as a `reduction` kernel of its own, the same way.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

import onnx

from ...lower.values import Unsupported
from ...plan.anchor_match import ANCHOR_OPS, EPILOGUE_VIEW_OPS
from ..cpu.extract import ExecutionPlan, KernelStep
from ..cpu.kernel_spec import KernelSpec, TensorInfo

ROW_STAGES = ("LayerNormalization", "GlobalAveragePool")


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


def split_row_stages(spec: KernelSpec) -> list[KernelSpec]:
    """A group with a row stage as a `reduction` kernel for the stage and the contraction(s) for
    the rest, in order, a chain among them split per contraction (`Unsupported`: no stage)."""
    stages = [k for k, n in enumerate(spec.nodes) if n.op_type in ROW_STAGES]
    if len(stages) != 1:
        raise Unsupported(f"{len(stages)} row stages in one group, not one")
    k = stages[0]
    if spec.nodes[k].op_type == "GlobalAveragePool":  # it opens the group, with the views after it
        stage, first_template, second_template = (
            _downstream(spec, k, EPILOGUE_VIEW_OPS),
            "reduction",
            "anchor",
        )
    else:  # the LayerNormalization and the views after it close the group
        stage, first_template, second_template = _downstream(spec, k), "anchor", "reduction"
    compute = [j for j, n in enumerate(spec.nodes) if n.op_type != "Constant"]
    first = stage if first_template == "reduction" else {j for j in compute if j not in stage}
    head, tail = _cut(spec, first)
    head = replace(head, template=first_template)
    tail = replace(tail, template=second_template)
    parts: list[KernelSpec] = []
    for part in (head, tail):
        chain = sum(1 for n in part.nodes if n.op_type in ANCHOR_OPS) > 1
        parts.extend(split_chain(part) if chain else [part])
    return parts


def _downstream(spec: KernelSpec, k: int, through: Collection[str] | None = None) -> set[int]:
    """Node `k` and every node reading its results, directly or not (only through ops in
    `through` when given)."""
    made = set(spec.nodes[k].output)
    found = {k}
    for j in range(k + 1, len(spec.nodes)):
        if through is not None and spec.nodes[j].op_type not in through:
            continue
        if any(i in made for i in spec.nodes[j].input if i):
            found.add(j)
            made.update(o for o in spec.nodes[j].output if o)
    return found


def _cut(spec: KernelSpec, first: set[int]) -> tuple[KernelSpec, KernelSpec]:
    """The group as two kernels: the nodes `first` and the others (each with the Constant nodes
    it reads), the tensors crossing between them outputs of the first and inputs of the second."""
    consts = {o: j for j, n in enumerate(spec.nodes) if n.op_type == "Constant" for o in n.output}

    def nodes_of(idx: set[int]) -> list[onnx.NodeProto]:
        reads = {i for j in idx for i in spec.nodes[j].input if i}
        keep = idx | {consts[i] for i in reads if i in consts}
        return [n for j, n in enumerate(spec.nodes) if j in keep]

    rest = {j for j, n in enumerate(spec.nodes) if j not in first and n.op_type != "Constant"}
    head, tail = nodes_of(first), nodes_of(rest)
    outputs = {t.name for t in spec.outputs}
    made = {o for n in head for o in n.output if o}
    used_later = {i for n in tail for i in n.input if i}
    crossing = [
        o
        for n in head
        if n.op_type != "Constant"
        for o in n.output
        if o and (o in used_later or o in outputs)
    ]
    tail_outputs = [t.name for t in spec.outputs if t.name not in made]
    return _part(spec, head, crossing, 0), _part(spec, tail, tail_outputs, 1)


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
