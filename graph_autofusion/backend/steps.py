"""What every runtime does with an execution plan around its kernels, in one place: the CPU's
`CompiledModel` (backend/cpu/runtime.py) and the Triton targets' `TritonCompiledModel`
(backend/triton/runtime.py) differ only in how a kernel step runs.

    refuse_object_tensors(plan)                      # strings never reach a kernel or an arena
    steps = resolve_steps(plan, built, declined)     # a kernel not built runs as a host op, saying why
    stats = plan_stats(plan, steps, template, extra) # the counts and entries every report carries
    feeds = check_inputs(plan.inputs, inputs)        # the same RuntimeInputError codes everywhere

The plan itself (views, kernels and host ops in order) is backend/cpu/extract.py's. `PlannedModel`
gives both runtimes the same call surface (`compiled(inputs)`, `input_names`, `output_names`).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from ..errors import RuntimeInputError, UnsupportedModelError
from .cpu.extract import ExecutionPlan, HostStep, KernelStep, Step, ViewStep
from .cpu.hostops import HostOp, host_op_entry
from .cpu.kernel_spec import TensorInfo

NOT_BUILT = "kernel not available"


def with_host_fallbacks(steps: Sequence[Step], declined: Mapping[str, str]) -> list[Step]:
    """Steps with every kernel the generator declined turned into a host op saying why."""
    out: list[Step] = []
    for step in steps:
        if isinstance(step, KernelStep) and step.symbol in declined:
            assert step.node is not None
            out.append(
                HostStep(step.node, f"no code generated: {declined[step.symbol]}", "codegen_unsupported")
            )
        else:
            out.append(step)
    return out


def resolve_steps(plan: ExecutionPlan, built: Container[str], declined: Mapping[str, str]) -> list[Step]:
    """`plan.steps` with each kernel step whose symbol is not `built` run as a host op, for the
    reason in `declined` (a kernel neither built nor declined: NOT_BUILT)."""
    missing = {
        s.symbol: declined.get(s.symbol, NOT_BUILT)
        for s in plan.steps
        if isinstance(s, KernelStep) and s.symbol not in built
    }
    return with_host_fallbacks(plan.steps, missing)


def plan_stats(
    plan: ExecutionPlan,
    steps: Sequence[Step],
    template: Callable[[str], str],
    extra: Callable[[KernelStep], Mapping[str, Any]],
) -> dict[str, Any]:
    """The fields every runtime's `stats` has: kernel launches and unique kernels, host ops (the
    report's entries), views, and one entry per launch (`template(symbol)` and `extra(step)` are
    the backend's own)."""
    per_kernel = []
    for step in steps:
        if isinstance(step, KernelStep):
            spec = plan.specs[step.symbol]
            per_kernel.append(
                {
                    "node": step.node_name,
                    "symbol": step.symbol,
                    "template": template(step.symbol),
                    "pattern": spec.pattern,
                    "ops": len(spec.nodes),
                    **extra(step),
                }
            )
    return {
        "kernels": len(per_kernel),
        "unique_kernels": len({k["symbol"] for k in per_kernel}),
        "host_ops": [host_op_entry(s) for s in steps if isinstance(s, HostStep)],
        "views": sum(1 for s in steps if isinstance(s, ViewStep)),
        "per_kernel": per_kernel,
    }


def host_shape_error(op: HostOp, got: Sequence[int], declared: Sequence[int]) -> RuntimeInputError:
    """A host op's result of another shape than the model declares (a dynamic shape the plan
    fixed at compile time)."""
    return RuntimeInputError(
        f"host op {op.node.op_type} ({op.node.name!r}) produced shape {tuple(got)}, "
        f"but the model declares {tuple(declared)}",
        code="dynamic_shape_mismatch",
    )


def refuse_object_tensors(plan: ExecutionPlan) -> None:
    """Strings cannot live in the arena (raw bytes): such a model is refused, with a code."""
    for info in plan.tensors.values():
        if info.elem_type == onnx.TensorProto.STRING:
            raise UnsupportedModelError(
                f"tensor {info.name!r} holds strings; the runtimes run numeric tensors only",
                code="unsupported_dtype",
                tensor=info.name,
            )


class PlannedModel:
    """The call surface every compiled model shares: inputs by name or position, outputs by
    name, the plan's input and output names."""

    plan: ExecutionPlan

    def run(self, inputs: Mapping[str, Any] | Sequence[Any] | np.ndarray) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def __call__(self, inputs: Mapping[str, Any] | Sequence[Any] | np.ndarray) -> dict[str, np.ndarray]:
        return self.run(inputs)

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.plan.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.plan.outputs]


def check_inputs(
    expected: Sequence[TensorInfo], inputs: Mapping[str, Any] | Sequence[Any] | np.ndarray
) -> dict[str, np.ndarray]:
    """The inputs by name, checked against the model's names, dtypes and shapes (every runtime
    raises the same `RuntimeInputError` codes)."""
    names = [t.name for t in expected]
    if isinstance(inputs, np.ndarray):
        inputs = [inputs]
    if isinstance(inputs, Mapping):
        unknown = [k for k in inputs if k not in names]
        if unknown:
            raise RuntimeInputError(
                f"unknown input {unknown[0]!r}; the model's inputs are: {', '.join(names)}",
                code="unknown_input",
                input=str(unknown[0]),
            )
        missing = [n for n in names if n not in inputs]
        if missing:
            raise RuntimeInputError(
                f"missing input {missing[0]!r}; the model's inputs are: {', '.join(names)}",
                code="missing_input",
                input=missing[0],
            )
        given = [inputs[n] for n in names]
    else:
        given = list(inputs)
        if len(given) != len(names):
            raise RuntimeInputError(
                f"the model takes {len(names)} input(s) ({', '.join(names)}), {len(given)} were given",
                code="wrong_input_count",
            )
    feeds: dict[str, np.ndarray] = {}
    for info, value in zip(expected, given, strict=True):
        if not isinstance(value, np.ndarray):
            try:
                value = np.asarray(value, dtype=info.dtype)
            except (TypeError, ValueError) as exc:
                raise RuntimeInputError(
                    f"input {info.name!r} is not an array of {info.dtype}: {exc}",
                    code="wrong_input_dtype",
                    input=info.name,
                ) from exc
        if value.dtype != info.dtype:
            raise RuntimeInputError(
                f"input {info.name!r} has dtype {value.dtype}, the model expects {info.dtype}",
                code="wrong_input_dtype",
                input=info.name,
                expected=str(info.dtype),
                got=str(value.dtype),
            )
        if tuple(value.shape) != tuple(info.shape):
            raise RuntimeInputError(
                f"input {info.name!r} has shape {list(value.shape)}, the model expects {list(info.shape)}",
                code="wrong_input_shape",
                input=info.name,
                expected=list(info.shape),
                got=list(value.shape),
            )
        feeds[info.name] = value
    return feeds
