"""Numerical verification: the fused model against onnxruntime running the original model.

The rule (README, "Verification"): fp32 results of a reordered computation are not bitwise
equal, and how far apart two correct ones may be depends on the output's scale and on how many
roundings fed it — so the tolerance is derived from the graph, per output, not fixed:

    noise² of a tensor  =  the largest noise² among its inputs + u² · K(node)
    K(node)             =  terms each output element accumulates: C_in/groups·kh·kw for Conv, the
                           contracted length for MatMul/Gemm, the reduced length for Reduce*,
                           Softmax, LayerNorm and average pools (+1 for a bias or rescale), 16
                           for a transcendental (a few ulp), 1 for other arithmetic, 0 for exact
                           ops (views, data movement, max/min, comparisons)
    u                   =  the unit roundoff of the node's output type: 2^-24 fp32, 2^-11 fp16,
                           2^-8 bf16, 2^-53 fp64

Each rounding of a sum of K terms errs by up to u of a partial sum; independent errors add in
variance, so a chain of reductions drifts like a random walk: u·sqrt(ΣK), not u·ΣK (the worst
case, which would pass anything). Taking the largest input's noise assumes every op passes
relative error on with unit gain — what numerically stable networks (normalization, bounded
activations) do, and what was measured. A product's operands' relative errors do add, but charging
their sum compounds exponentially through attention (Q·Kᵀ, then ·V, in every layer): on a 12-layer
BERT it charged 10^13 roundings and would have passed anything, while the measured error is that
of one deep chain of contractions. An element then passes when

    |fused − reference|  ≤  SAFETY · noise · (|reference| + rms(reference output))

with SAFETY = 4: four standard deviations of the modelled noise, which blocked (BLAS, tiled)
summation keeps well below. The `rms` term is the output's scale: an element that is near zero
because of cancellation carries the absolute error of the magnitudes it was computed from.
Integer and boolean outputs must be equal; NaN and ±inf must be where the reference has them.
An explicit `rtol`/`atol` replaces the rule with the classic |d| ≤ atol + rtol·|ref|.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

from .errors import VerificationError
from .ir import Graph, Node
from .onnx_utils import node_inputs
from .ops import OpKind

ORT_MAX_IR_VERSION = 10
SAFETY = 4.0
RTOL = 1e-5  # the classic fixed rule, used only when a caller passes rtol or atol
ATOL = 1e-5

#: Unit roundoff (half an ulp at 1.0) per floating element type.
UNIT_ROUNDOFF: dict[int, float] = {
    onnx.TensorProto.FLOAT: 2.0**-24,
    onnx.TensorProto.FLOAT16: 2.0**-11,
    onnx.TensorProto.BFLOAT16: 2.0**-8,
    onnx.TensorProto.DOUBLE: 2.0**-53,
}
#: Ops that never round: they move, select or compare values.
EXACT = frozenset(
    {
        "ReduceMax", "ReduceMin", "ArgMax", "ArgMin", "MaxPool", "GlobalMaxPool", "Max", "Min",
        "Relu", "Abs", "Neg", "Sign", "Floor", "Ceil", "Round", "Where", "Clip", "Equal", "Less",
        "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Xor", "IsNaN", "IsInf",
        "Shape", "Size", "TopK", "NonZero", "ConstantOfShape", "Range",
    }
)  # fmt: skip
#: Library functions (expf, tanhf, erff, ...) differ between implementations by a few ulp.
TRANSCENDENTAL = frozenset(
    {
        "Exp", "Log", "Tanh", "Erf", "Sigmoid", "Pow", "Softplus", "Mish", "Gelu", "Sin", "Cos",
        "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Elu", "Selu",
        "Celu", "HardSigmoid", "HardSwish", "ThresholdedRelu", "Softsign", "ReduceLogSumExp",
        "ReduceLogSum", "ReduceL2", "LpNormalization",
    }
)  # fmt: skip
TRANSCENDENTAL_ULPS2 = 16  # (4 ulp)²: what a vectorized or libm expf/tanhf/erff may differ by


@dataclass(frozen=True)
class OutputError:
    """How one output compares. `worst_ratio` = max over elements of |d| / tolerance; ≤ 1 passes."""

    name: str
    max_abs: float
    max_rel: float
    worst_ratio: float
    rtol: float = 0.0  # the tolerance of element i is atol + rtol·|ref_i|
    atol: float = 0.0
    noise: float = 0.0  # modelled relative noise (one standard deviation); 0 under fixed rtol/atol
    roundings: float = 0.0  # noise² / u²: the accumulation length the rule charged this output
    scale: float = 0.0  # rms of the reference output
    error_at_worst: float = 0.0  # |d| and tolerance at the element with the worst ratio
    tolerance_at_worst: float = 0.0

    @property
    def passed(self) -> bool:
        return self.worst_ratio <= 1.0


@dataclass(frozen=True)
class VerificationResult:
    outputs: list[OutputError]
    rtol: float | None  # None: per-output tolerances derived from the graph (module docstring)
    atol: float | None
    runner: str
    safety: float = SAFETY

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    @property
    def worst(self) -> OutputError | None:
        """The output closest to (or furthest over) its tolerance."""
        return max(self.outputs, key=lambda o: o.worst_ratio, default=None)

    def to_dict(self) -> dict[str, Any]:
        worst = self.worst
        return {
            "passed": self.passed,
            "rule": "derived" if self.rtol is None else "fixed",
            "rtol": self.rtol,
            "atol": self.atol,
            "safety": self.safety if self.rtol is None else None,
            "runner": self.runner,
            "worst_ratio": worst.worst_ratio if worst else 0.0,
            "outputs": [o.__dict__ | {"passed": o.passed} for o in self.outputs],
        }

    def summary(self) -> str:
        """One line for people: the worst output's error against its tolerance."""
        worst = self.worst
        if worst is None:
            return "no outputs compared"
        return (
            f"worst output {worst.name!r}: max abs error {worst.max_abs:.3g}, "
            f"{worst.worst_ratio:.3g}x its tolerance (error {worst.error_at_worst:.3g} vs "
            f"{worst.tolerance_at_worst:.3g} at the worst element)"
        )


def output_noise(model: onnx.ModelProto) -> dict[str, tuple[float, float]]:
    """(noise, roundings) per graph output of a model with static shapes (the canonical one).

    noise is the modelled relative standard deviation of a correct fp result; roundings is
    noise²/u² of the output's type, the effective accumulation length (module docstring).
    """

    graph = Graph(model)
    if any(v.elem_type == onnx.TensorProto.UNDEFINED for v in graph.values.values()):
        graph = Graph(onnx.shape_inference.infer_shapes(model))  # the canonical model never needs this
    var: dict[str, float] = {}
    for node in graph.nodes:
        proto = node.proto
        ins = [var.get(x, 0.0) for x in node_inputs(proto)]  # If/Loop/Scan bodies' reads count
        base = max(ins, default=0.0)  # unit error gain (module docstring)
        for out in node.outputs:
            if not out:
                continue
            u = UNIT_ROUNDOFF.get(graph.values[out].elem_type)
            if u is None:  # integers and booleans are compared exactly
                var[out] = 0.0
                continue
            var[out] = base + u * u * _roundings(graph, node)
    result = {}
    for name in graph.outputs:
        u = UNIT_ROUNDOFF.get(graph.values[name].elem_type, 0.0)
        v = max(var.get(name, 0.0), u * u)  # at least the rounding of the output itself
        result[name] = (float(np.sqrt(v)), v / (u * u) if u else 0.0)
    return result


def _roundings(graph: Graph, node: Node) -> float:
    """K(node): how many roundings each output element of `node` accumulates (docstring)."""
    op = node.op_type
    shape = lambda i: graph.values[node.inputs[i]].shape or ()  # noqa: E731
    prod = lambda dims: float(np.prod(dims)) if len(dims) else 1.0  # noqa: E731
    if node.kind in (OpKind.VIEW, OpKind.INJECTIVE) or op in EXACT:
        return 0.0
    if op in ("Conv", "ConvTranspose"):
        w = shape(1)
        groups = int(node.attrs.get("group", 1) or 1)
        k = prod(w[1:]) if op == "Conv" else w[0] / groups * prod(w[2:])
        return k + 1
    if op == "MatMul":
        return shape(0)[-1] + 1 if shape(0) else 1.0
    if op == "Gemm":
        a = shape(0)
        return a[0 if node.attrs.get("transA", 0) else 1] + 2.0
    if op in ("Softmax", "LogSoftmax", "CumSum", "LpNormalization"):
        x = shape(0)
        axis = int(node.attrs.get("axis", -1))
        n = x[axis] if x else 1
        return n + (TRANSCENDENTAL_ULPS2 if op != "CumSum" else 0) + 2
    if op == "LayerNormalization":
        x = shape(0)
        axis = int(node.attrs.get("axis", -1)) % max(len(x), 1)
        return 2 * prod(x[axis:]) + 4
    if op in ("InstanceNormalization", "GroupNormalization", "MeanVarianceNormalization"):
        x = shape(0)
        return 2 * prod(x[2:]) * (x[1] / int(node.attrs.get("num_groups", x[1])) if len(x) > 1 else 1) + 4
    if op in ("AveragePool", "LpPool"):
        return prod(node.attrs.get("kernel_shape") or []) + 1
    if node.kind == OpKind.REDUCE:
        out = graph.values[node.outputs[0]].shape or ()
        n = prod(shape(0)) / max(prod(out), 1.0)
        return n + 1 + (TRANSCENDENTAL_ULPS2 if op in TRANSCENDENTAL else 0)
    if op in TRANSCENDENTAL:
        return float(TRANSCENDENTAL_ULPS2)
    return 1.0


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
    rtol: float | None = None,
    atol: float | None = None,
    noise: Mapping[str, tuple[float, float]] | None = None,
    runner: str,
    safety: float = SAFETY,
) -> VerificationResult:
    """Compare outputs element by element.

    With `rtol` and `atol` both None, output o's tolerance is safety·noise_o·(|ref| + rms(ref_o)),
    noise_o from `noise` (see `output_noise`; fp32 unit roundoff when an output is missing there).
    """
    derived = rtol is None and atol is None
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
        if not np.issubdtype(ref.dtype, np.floating):  # integers and booleans: equal or wrong
            wrong = got != ref
            diff = float(
                np.abs(got[wrong].astype(np.float64) - ref[wrong].astype(np.float64)).max(initial=0.0)
            )
            bad = float(np.count_nonzero(wrong))
            ratio = float("inf") if bad else 0.0
            errors.append(OutputError(name, diff, ratio, ratio, error_at_worst=diff))
            continue
        r = ref.astype(np.float64)
        g = got.astype(np.float64)
        finite = np.where(np.isfinite(r), r, 0.0)
        with np.errstate(invalid="ignore"):  # inf - inf: judged just below
            d = np.abs(g - r)
        d = np.where(~np.isfinite(r) & (g == r), 0.0, d)  # the same inf (or nan, below) is no error
        d = np.where(np.isnan(r) & np.isnan(g), 0.0, d)
        d = np.where(np.isnan(d), np.inf, d)
        scale = float(np.sqrt(np.mean(finite * finite)))
        if derived:
            sigma, roundings = (noise or {}).get(name, (2.0**-24, 1.0))
            o_rtol = safety * sigma
            o_atol = o_rtol * scale
        else:
            sigma, roundings = 0.0, 0.0
            o_rtol = RTOL if rtol is None else rtol
            o_atol = ATOL if atol is None else atol
        tol = o_atol + o_rtol * np.abs(finite)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(d == 0.0, 0.0, d / tol)  # a zero tolerance admits only exact equality
        worst = int(np.argmax(ratio))
        rel = d / np.maximum(np.abs(finite), 1e-30)
        errors.append(
            OutputError(
                name,
                max_abs=float(d.max()),
                max_rel=float(rel.max()),
                worst_ratio=float(ratio.flat[worst]),
                rtol=float(o_rtol),
                atol=float(o_atol),
                noise=float(sigma),
                roundings=float(roundings),
                scale=scale,
                error_at_worst=float(d.flat[worst]),
                tolerance_at_worst=float(tol.flat[worst]),
            )
        )
    return VerificationResult(errors, None if derived else rtol, None if derived else atol, runner, safety)


def verify(
    reference_model: onnx.ModelProto,
    run: Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]],
    *,
    inputs: Mapping[str, np.ndarray] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    noise_model: onnx.ModelProto | None = None,
    runner: str,
) -> VerificationResult:
    """Run `reference_model` in onnxruntime and `run` on the same inputs and compare.

    The derived tolerances come from `noise_model` (a model with static shapes and the same
    outputs, e.g. the canonical one; `reference_model` itself when omitted).
    """
    feeds = dict(inputs) if inputs is not None else random_inputs(reference_model)
    reference = run_onnxruntime(reference_model, feeds)
    noise = output_noise(noise_model or reference_model) if rtol is None and atol is None else None
    return compare(reference, run(feeds), rtol=rtol, atol=atol, noise=noise, runner=runner)
