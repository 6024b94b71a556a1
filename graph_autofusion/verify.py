"""Numerical verification: the fused model against onnxruntime running the original model.

Tolerance (fp32): every element must satisfy |fused − reference| ≤ atol + rtol·|reference|,
with rtol = 1e-5 and atol = 1e-5 by default — reordered fp32 sums (BLAS tiling, folded
BatchNorm) stay well inside that, a wrong kernel does not.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

from .errors import VerificationError

ORT_MAX_IR_VERSION = 10
RTOL = 1e-5
ATOL = 1e-5


@dataclass(frozen=True)
class OutputError:
    name: str
    max_abs: float
    max_rel: float
    worst_ratio: float  # max |d| / (atol + rtol·|ref|); ≤ 1 passes

    @property
    def passed(self) -> bool:
        return self.worst_ratio <= 1.0


@dataclass(frozen=True)
class VerificationResult:
    outputs: list[OutputError]
    rtol: float
    atol: float
    runner: str

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "rtol": self.rtol,
            "atol": self.atol,
            "runner": self.runner,
            "outputs": [o.__dict__ | {"passed": o.passed} for o in self.outputs],
        }


def random_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs of the model's static shapes: N(0,1) floats; integers bounded by the
    smallest table any Gather indexes with them, so embedding lookups stay in range."""
    rng = np.random.default_rng(seed)
    inits = {t.name: tuple(t.dims) for t in model.graph.initializer}
    bounds: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[0] in inits:
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            bound = inits[node.input[0]][axis]
            bounds[node.input[1]] = min(bounds.get(node.input[1], bound), bound)
    out = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        t = vi.type.tensor_type
        shape = [d.dim_value for d in t.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(t.elem_type)
        if np.issubdtype(dtype, np.floating):
            out[vi.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            out[vi.name] = rng.integers(0, 2, shape).astype(bool)
        else:
            out[vi.name] = rng.integers(0, bounds.get(vi.name, 2), shape).astype(dtype)
    return out


def run_onnxruntime(
    model: onnx.ModelProto, inputs: Mapping[str, np.ndarray], optimize: bool = False
) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    opts.log_severity_level = 3
    ir_version = model.ir_version
    try:  # onnxruntime lags onnx's newest IR version; the graph itself is unaffected
        model.ir_version = min(ir_version, ORT_MAX_IR_VERSION)
        data = model.SerializeToString()
    finally:
        model.ir_version = ir_version
    session = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, dict(inputs)), strict=True))


def compare(
    reference: Mapping[str, np.ndarray],
    actual: Mapping[str, np.ndarray],
    *,
    rtol: float,
    atol: float,
    runner: str,
) -> VerificationResult:
    errors = []
    for name, ref in reference.items():
        got = np.asarray(actual[name])
        ref = np.asarray(ref)
        if got.shape != ref.shape:
            raise VerificationError(
                f"output {name!r} has shape {got.shape}, expected {ref.shape}", output=name
            )
        if ref.size == 0:
            errors.append(OutputError(name, 0.0, 0.0, 0.0))
            continue
        if not np.issubdtype(ref.dtype, np.floating):
            bad = float(np.count_nonzero(got != ref))
            errors.append(OutputError(name, bad, bad, bad))
            continue
        r = ref.astype(np.float64)
        d = np.abs(got.astype(np.float64) - r)
        same_nonfinite = ~np.isfinite(r) & (got.astype(np.float64) == r)
        d = np.where(same_nonfinite, 0.0, d)
        d = np.where(np.isnan(d), np.inf, d)
        ratio = d / (atol + rtol * np.abs(np.where(np.isfinite(r), r, 0.0)))
        rel = d / np.maximum(np.abs(np.where(np.isfinite(r), r, 0.0)), 1e-30)
        errors.append(OutputError(name, float(d.max()), float(rel.max()), float(ratio.max())))
    return VerificationResult(errors, rtol, atol, runner)


def verify(
    reference_model: onnx.ModelProto,
    run: Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]],
    *,
    inputs: Mapping[str, np.ndarray] | None = None,
    rtol: float = RTOL,
    atol: float = ATOL,
    runner: str,
) -> VerificationResult:
    feeds = dict(inputs) if inputs is not None else random_inputs(reference_model)
    reference = run_onnxruntime(reference_model, feeds)
    return compare(reference, run(feeds), rtol=rtol, atol=atol, runner=runner)
