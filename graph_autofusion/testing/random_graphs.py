"""Seeded random ONNX graphs drawn from the op registry, for differential testing.

    graph = generate(seed)            # the same seed always gives the same model, inputs and truth
    graph.model, graph.inputs         # a checked ONNX model (opset 11-23) and its input arrays
    graph.truth[name]                 # float64 value of every tensor (exact for integer/bool ones)

A graph has 2-12 nodes: elementwise and broadcast chains (operands of broadcasting shapes, fresh
inputs, constants or earlier tensors), injective ops (Transpose, Slice, Concat, Gather, Expand,
Pad, Tile, Split, ...), views, reductions with random axes and keepdims (axes as an attribute or
an input, as the drawn opset wants), Softmax/LogSoftmax, normalizations, pooling, and MatMul /
Gemm / Conv / ConvTranspose anchors whose consumers become their epilogues. Most data is fp32;
int32/int64/bool graphs and fp16 casts appear too. Every tensor that nothing consumes is a graph
output, and sometimes an intermediate that is consumed is an output as well (it must then escape
a fused group).

Why values are computed while drawing: each node is evaluated at once by `onnx.reference` in the
model's element types *and* in float64 (the "shadow"), so the generator knows every value. That
is how inputs stay in safe domains without interval guesswork (Log only sees positive data, Floor
and comparisons never see values within rounding distance of a step, Exp never overflows), and
the float64 values are the truth a comparator uses to tell the reference's own rounding noise
from a real error. A node whose result is non-finite, huge, empty or too large is dropped and
another is drawn.

Known bugs fixed elsewhere are not drawn while `avoid_known_bugs` is set (see KNOWN_BUGS).
"""

from __future__ import annotations

import contextlib
import io
import math
import random
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..backend.cpu.hostops import reference_evaluator

FLOAT, FLOAT16, DOUBLE = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE
INT32, INT64, BOOL = TensorProto.INT32, TensorProto.INT64, TensorProto.BOOL
FLOATS = frozenset({FLOAT, FLOAT16})
INTS = frozenset({INT32, INT64})

MIN_OPSET, MAX_OPSET = 11, 23
MAX_ELEMENTS = 4096  # per tensor: keeps reference evaluation and kernels fast
MAX_MAGNITUDE = 1e4  # values beyond this are drawn again (overflow, not rounding, would dominate)
# Base relative tolerance per float type; a tensor inherits the coarsest on its path, since a
# reference may compute an fp16 op in fp32 (onnxruntime's CPU casts around fp16 MatMul) or not.
_RTOL = {FLOAT: 1e-5, FLOAT16: 2e-3}
STEP_MARGIN = 1e-3  # floats feeding a step (Floor, Sign, <, ArgMax ties, ...) stay this far from it

# Configurations with a known wrong answer whose fix belongs to another change; not drawn while
# `avoid_known_bugs` is set, so the CI slice stays meaningful. Each names the bug.
# Keys the drawers check (each names one configuration): "softmax_opset_lt_13" (Softmax and
# LogSoftmax before opset 13), "mod_fmod1_int" (integer Mod with fmod=1). Both bugs are fixed
# on main, so nothing is avoided now; put a key back with the bug's sentence to avoid it again.
KNOWN_BUGS: dict[str, str] = {}


@dataclass(frozen=True)
class RandomGraph:
    """One drawn graph: the model, its inputs, and the float64 truth of every tensor."""

    seed: int
    opset: int
    model: onnx.ModelProto
    inputs: dict[str, np.ndarray]
    truth: dict[str, np.ndarray]  # every tensor (inputs, constants, node outputs)
    accumulation: dict[str, int]  # per tensor: elements summed along its longest path (tolerance)
    types: dict[str, int]  # per tensor: its ONNX element type
    rtol: dict[str, float]  # per tensor: base relative tolerance (fp16 anywhere upstream: fp16's)
    notes: tuple[str, ...] = ()

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(n.op_type for n in self.model.graph.node)

    @property
    def output_names(self) -> list[str]:
        return [o.name for o in self.model.graph.output]

    def describe(self) -> str:
        ins = ", ".join(f"{k}:{_dtype_name(v)}{list(v.shape)}" for k, v in self.inputs.items())
        return f"seed={self.seed} opset={self.opset} ops={'>'.join(self.ops)} inputs=({ins})"

    def subgraph(self, output: str) -> RandomGraph:
        """The graph cut down to the ancestors of one tensor, which becomes the only output.

        Used to shrink a failing graph to a minimal repro: values and truth carry over unchanged.
        """
        g = self.model.graph
        producers = {o: n for n in g.node for o in n.output}
        keep: list[onnx.NodeProto] = []
        needed = [output]
        seen: set[str] = set()
        while needed:
            name = needed.pop()
            if name in seen:
                continue
            seen.add(name)
            node = producers.get(name)
            if node is not None and node not in keep:
                keep.append(node)
                needed.extend(i for i in node.input if i)
        nodes = [n for n in g.node if n in keep]
        inits = [t for t in g.initializer if t.name in seen]
        ins = [vi for vi in g.input if vi.name in seen]
        value = self.truth[output]
        out = helper.make_tensor_value_info(output, self.types[output], list(value.shape))
        graph = helper.make_graph(nodes, g.name, ins, [out], initializer=inits)
        model = _make_model(graph, self.opset)
        return RandomGraph(
            self.seed,
            self.opset,
            model,
            {k: v for k, v in self.inputs.items() if k in seen},
            self.truth,
            self.accumulation,
            self.types,
            self.rtol,
            (*self.notes, f"cut to {output}"),
        )


def _dtype_name(a: np.ndarray) -> str:
    return {"float32": "f32", "float16": "f16", "int32": "i32", "int64": "i64", "bool": "b"}.get(
        str(a.dtype), str(a.dtype)
    )


def _make_model(graph: onnx.GraphProto, opset: int) -> onnx.ModelProto:
    ops = [helper.make_opsetid("", opset)]
    return helper.make_model(graph, opset_imports=ops, ir_version=helper.find_min_ir_version_for(ops))


class Rejected(Exception):
    """A drawn node cannot be used (bad domain, invalid at this opset, too large): draw another."""


@dataclass
class _Tensor:
    name: str
    value: np.ndarray  # as the model computes it (its own element type)
    truth: np.ndarray  # float64 for float tensors; the value itself otherwise
    acc: int = 0
    elem: int = FLOAT
    rtol: float = 0.0  # relative rounding of the coarsest float type on the path (fp16 > fp32)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)

    @property
    def rank(self) -> int:
        return self.value.ndim

    @property
    def is_float(self) -> bool:
        return self.elem in FLOATS


@dataclass
class _Builder:
    rng: random.Random
    opset: int
    avoid_known_bugs: bool
    max_nodes: int = 12
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    input_types: dict[str, int] = field(default_factory=dict)
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    tensors: dict[str, _Tensor] = field(default_factory=dict)
    data: list[str] = field(default_factory=list)  # tensors a node may consume (not constants)
    uses: dict[str, int] = field(default_factory=dict)
    counter: int = 0
    notes: list[str] = field(default_factory=list)

    # -- naming and leaves ---------------------------------------------------------------------
    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def np_rng(self) -> np.random.Generator:
        return np.random.default_rng(self.rng.getrandbits(63))

    def input(self, shape: Sequence[int], elem: int, lo: float = -2.0, hi: float = 2.0) -> str:
        """A fresh graph input whose data is drawn uniformly in [lo, hi]."""
        value = _draw(self.np_rng(), shape, elem, lo, hi)
        name = self.fresh("in")
        self.inputs[name] = value
        self.input_types[name] = elem
        self._leaf(name, value, elem)
        self.data.append(name)
        return name

    def const(self, value: np.ndarray, elem: int | None = None) -> str:
        """An initializer (weights, shapes, axes, indices): never a node's data source."""
        name = self.fresh("c")
        value = np.asarray(value)
        self.consts[name] = value
        self._leaf(name, value, elem if elem is not None else helper.np_dtype_to_tensor_dtype(value.dtype))
        return name

    def data_const(self, shape: Sequence[int], elem: int, lo: float = -2.0, hi: float = 2.0) -> str:
        return self.const(_draw(self.np_rng(), shape, elem, lo, hi), elem)

    def _leaf(self, name: str, value: np.ndarray, elem: int) -> None:
        truth = value.astype(np.float64) if elem in FLOATS else value
        self.tensors[name] = _Tensor(name, value, truth, 0, elem, _RTOL.get(elem, 0.0))

    def operand(self, shape: Sequence[int], elem: int, lo: float = -2.0, hi: float = 2.0) -> str:
        """A new operand: a graph input (runtime data) or, as often, a constant."""
        if self.rng.random() < 0.5:
            return self.input(shape, elem, lo, hi)
        return self.data_const(shape, elem, lo, hi)

    # -- nodes ---------------------------------------------------------------------------------
    def emit(self, op: str, inputs: Sequence[str], n_out: int = 1, **attrs: object) -> list[_Tensor]:
        """Add one node after evaluating it (model types and float64); raise Rejected if unusable."""
        if len(self.nodes) >= self.max_nodes:
            raise Rejected("the graph is full")
        try:
            schema = onnx.defs.get_schema(op, self.opset)
        except onnx.defs.SchemaError:
            raise Rejected(f"{op} does not exist at opset {self.opset}") from None
        if schema.deprecated:
            raise Rejected(f"{op} is deprecated at opset {self.opset}")
        outs = [self.fresh("t") for _ in range(n_out)]
        node = helper.make_node(op, list(inputs), outs, name=f"n{len(self.nodes)}_{op}", **attrs)
        ins = [self.tensors[i] for i in inputs if i]
        elems = _infer_types(node, ins, self.opset, [t for t in ins if t.name in self.consts])
        values = _evaluate(node, ins, self.opset, shadow=False)
        truths = _evaluate(node, ins, self.opset, shadow=True)
        made = []
        acc = max((t.acc for t in ins), default=0) + _accumulates(op, ins, attrs)
        upstream = max((t.rtol for t in ins), default=0.0)
        for name, (elem, shape), value, truth in zip(outs, elems, values, truths, strict=True):
            np_type = helper.tensor_dtype_to_np_dtype(elem)
            value = np.asarray(value)
            if shape is not None and shape != value.shape:
                raise Rejected(f"{op}: inference says {shape}, the reference made {value.shape}")
            if value.dtype != np_type:
                value = value.astype(np_type)
            truth = np.asarray(truth, dtype=np.float64) if elem in FLOATS else value
            if value.size == 0 or value.size > MAX_ELEMENTS or truth.shape != value.shape:
                raise Rejected(f"{op}: {value.size} elements")
            if elem in FLOATS and not (
                np.all(np.isfinite(value))
                and np.all(np.isfinite(truth))
                and float(np.max(np.abs(truth))) < MAX_MAGNITUDE
            ):
                raise Rejected(f"{op}: non-finite or huge values")
            made.append(_Tensor(name, value, truth, acc, elem, max(upstream, _RTOL.get(elem, 0.0))))
        self.nodes.append(node)
        for i in inputs:
            if i:
                self.uses[i] = self.uses.get(i, 0) + 1
        for t in made:
            self.tensors[t.name] = t
            self.data.append(t.name)
        return made

    # -- the finished graph --------------------------------------------------------------------
    def finish(self, seed: int) -> RandomGraph:
        produced = [o for n in self.nodes for o in n.output]
        outputs = [o for o in produced if self.uses.get(o, 0) == 0]
        consumed = [o for o in produced if self.uses.get(o, 0) > 0]
        if consumed and self.rng.random() < 0.3:
            outputs.append(self.rng.choice(consumed))
        used = {i for n in self.nodes for i in n.input if i}
        graph_inputs = [
            helper.make_tensor_value_info(k, self.input_types[k], list(v.shape))
            for k, v in self.inputs.items()
            if k in used
        ]
        graph_outputs = [
            helper.make_tensor_value_info(o, self.tensors[o].elem, list(self.tensors[o].shape))
            for o in outputs
        ]
        inits = [_initializer(k, v, self.tensors[k].elem) for k, v in self.consts.items() if k in used]
        graph = helper.make_graph(
            self.nodes, f"random_{seed}", graph_inputs, graph_outputs, initializer=inits
        )
        model = _make_model(graph, self.opset)
        onnx.checker.check_model(model, full_check=True)
        return RandomGraph(
            seed=seed,
            opset=self.opset,
            model=model,
            inputs={k: v for k, v in self.inputs.items() if k in used},
            truth={k: t.truth for k, t in self.tensors.items()},
            accumulation={k: t.acc for k, t in self.tensors.items()},
            types={k: t.elem for k, t in self.tensors.items()},
            rtol={k: t.rtol for k, t in self.tensors.items()},
            notes=tuple(self.notes),
        )


def _initializer(name: str, value: np.ndarray, elem: int) -> TensorProto:
    return numpy_helper.from_array(value.astype(helper.tensor_dtype_to_np_dtype(elem)), name)


def _draw(rng: np.random.Generator, shape: Sequence[int], elem: int, lo: float, hi: float) -> np.ndarray:
    shape = tuple(int(d) for d in shape)
    np_type = helper.tensor_dtype_to_np_dtype(elem)
    if elem == BOOL:  # np.asarray: a 0-d draw is a numpy scalar, which onnxruntime refuses
        return np.asarray(rng.random(shape) < 0.5)
    if elem in INTS:
        return np.asarray(rng.integers(math.ceil(lo), math.floor(hi) + 1, size=shape), dtype=np_type)
    return np.asarray(rng.uniform(lo, hi, size=shape), dtype=np_type)


def _single_model(
    node: onnx.NodeProto, ins: Sequence[_Tensor], opset: int, elems: Sequence[int]
) -> onnx.ModelProto:
    inputs = [
        helper.make_tensor_value_info(t.name, e, list(t.shape)) for t, e in zip(ins, elems, strict=True)
    ]
    outputs = [helper.make_empty_tensor_value_info(o) for o in node.output]
    graph = helper.make_graph([node], "one", inputs, outputs)
    return _make_model(graph, opset)


def _infer_types(
    node: onnx.NodeProto, ins: Sequence[_Tensor], opset: int, inits: Sequence[_Tensor]
) -> list[tuple[int, tuple[int, ...] | None]]:
    """Output (element type, shape) by strict ONNX inference, constants known as initializers.

    Raises Rejected when the node is invalid at `opset` (types included): such a node would
    make the whole model fail the checker.
    """
    consts = {t.name for t in inits}
    data = [t for t in ins if t.name not in consts]
    model = _single_model(node, data, opset, [t.elem for t in data])
    model.graph.initializer.extend(_initializer(t.name, t.value, t.elem) for t in inits)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
        onnx.checker.check_model(inferred)
    except Exception as exc:  # any inference or checker error means: draw another node
        raise Rejected(f"{node.op_type}: {exc}") from None
    found: list[tuple[int, tuple[int, ...] | None]] = []
    for o in node.output:
        vi = next((v for v in inferred.graph.output if v.name == o), None)
        if vi is None or not vi.type.tensor_type.elem_type:
            raise Rejected(f"{node.op_type}: no inferred type")
        tt = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        shape = tuple(dims) if tt.HasField("shape") and None not in dims else None
        found.append((int(tt.elem_type), shape))  # type: ignore[arg-type]
    return found


def _evaluate(node: onnx.NodeProto, ins: Sequence[_Tensor], opset: int, *, shadow: bool) -> list[np.ndarray]:
    """Run one node in onnx.reference; `shadow` runs it in float64 (Cast to a float type → double)."""
    if shadow:
        node_copy = onnx.NodeProto()
        node_copy.CopyFrom(node)
        for attr in node_copy.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i in FLOATS:
                attr.i = DOUBLE
        feeds = {t.name: (t.truth if t.is_float else t.value) for t in ins}
        elems = [DOUBLE if t.is_float else t.elem for t in ins]
        node = node_copy
    else:
        feeds = {t.name: t.value for t in ins}
        elems = [t.elem for t in ins]
    model = _single_model(node, ins, opset, elems)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            out = reference_evaluator(model).run(None, feeds)
    except Exception as exc:  # the reference cannot run it: not a graph we can judge
        raise Rejected(f"{node.op_type}: reference failed: {exc}") from None
    return [np.asarray(v) for v in out]


_ACCUMULATING = {
    "ReduceSum", "ReduceMean", "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum",
    "ReduceLogSumExp", "ReduceProd", "Softmax", "LogSoftmax", "LayerNormalization", "GroupNormalization",
    "InstanceNormalization", "LpNormalization", "MeanVarianceNormalization", "CumSum",
    "GlobalAveragePool", "AveragePool", "LpPool",
}  # fmt: skip


def _accumulates(op: str, ins: Sequence[_Tensor], attrs: dict[str, object]) -> int:
    """How many elements one output element sums (0 for ops that do not sum): tolerance scale."""
    if not ins:
        return 0
    x = ins[0]
    if op in ("MatMul", "Gemm"):
        return int(x.shape[-1]) if x.rank else 1
    if op in ("Conv", "ConvTranspose"):
        return int(np.prod(ins[1].shape[1:]))
    if op in _ACCUMULATING:
        return max(1, x.value.size // max(1, x.shape[0] if x.rank else 1))
    return 0


# -- drawing ops --------------------------------------------------------------------------------
Drawer = Callable[[_Builder, _Tensor], None]


def _far_from_steps(v: np.ndarray, steps: np.ndarray | float) -> bool:
    return bool(np.all(np.abs(v - steps) > STEP_MARGIN * np.maximum(1.0, np.abs(v))))


def _near_int_free(v: np.ndarray, offset: float = 0.0) -> bool:
    return _far_from_steps(v, np.round(v - offset) + offset)


# (op, min opset, dtypes it takes, predicate on the float64 truth, attributes drawer)
Predicate = Callable[[np.ndarray], bool]
AttrDraw = Callable[[random.Random], dict]
_UNARY: list[tuple[str, int, frozenset[int], Predicate, AttrDraw]] = []


def _u(
    op: str,
    ok: Predicate = lambda v: True,
    since: int = 1,
    types: frozenset[int] = FLOATS,
    attrs: AttrDraw = lambda r: {},
) -> None:
    _UNARY.append((op, since, types, ok, attrs))


def _alpha(lo: float, hi: float, name: str = "alpha") -> Callable[[random.Random], dict]:
    return lambda r: {name: round(r.uniform(lo, hi), 3)} if r.random() < 0.7 else {}


_u("Abs", types=FLOATS | INTS)
_u("Neg", types=FLOATS | INTS)
_u("Exp", lambda v: v.max() < 8)
_u("Log", lambda v: v.min() > 0.05)
_u("Sqrt", lambda v: v.min() >= 0.0)
_u("Reciprocal", lambda v: np.abs(v).min() > 0.05)
_u("Relu")
_u("Relu", since=14, types=INTS)
_u("Sigmoid")
_u("Tanh")
_u("Erf")
_u("Floor", _near_int_free)
_u("Ceil", _near_int_free)
_u("Round", lambda v: _near_int_free(v, 0.5))
_u("Sign", lambda v: np.abs(v).min() > STEP_MARGIN, types=FLOATS)
_u("Sign", types=INTS)
_u("Sin", lambda v: np.abs(v).max() < 50)
_u("Cos", lambda v: np.abs(v).max() < 50)
_u("Tan", lambda v: np.abs(v).max() < 1.3)
_u("Asin", lambda v: np.abs(v).max() < 0.95)
_u("Acos", lambda v: np.abs(v).max() < 0.95)
_u("Atan")
_u("Sinh", lambda v: np.abs(v).max() < 8)
_u("Cosh", lambda v: np.abs(v).max() < 8)
_u("Asinh")
_u("Acosh", lambda v: v.min() > 1.05)
_u("Atanh", lambda v: np.abs(v).max() < 0.95)
_u("Softsign")
_u("Softplus", lambda v: v.max() < 30)
_u("Mish", lambda v: v.max() < 30, since=18)
_u("LeakyRelu", attrs=_alpha(0.01, 0.5))
_u("Elu", attrs=_alpha(0.1, 2.0))
_u("Selu", attrs=lambda r: {"alpha": round(r.uniform(1, 2), 3), "gamma": round(r.uniform(0.5, 1.5), 3)}
   if r.random() < 0.5 else {})  # fmt: skip
_u("Celu", since=12, attrs=_alpha(0.3, 2.0))
_u(
    "HardSigmoid",
    attrs=lambda r: (
        {"alpha": round(r.uniform(0.1, 0.5), 3), "beta": round(r.uniform(0.2, 0.7), 3)}
        if r.random() < 0.5
        else {}
    ),
)
_u("HardSwish", since=14)
_u("Gelu", since=20, attrs=lambda r: {"approximate": r.choice(["none", "tanh"])})
_u("Not", types=frozenset({BOOL}))
_u("IsNaN", types=frozenset({FLOAT}))
_u("IsInf", since=10, types=frozenset({FLOAT}),
   attrs=lambda r: {"detect_negative": r.randint(0, 1), "detect_positive": r.randint(0, 1)})  # fmt: skip
_u("Identity", types=FLOATS | INTS | frozenset({BOOL}))
_u("Dropout", types=frozenset({FLOAT}))


def _avoid(b: _Builder, bug: str) -> None:
    """Reject the configuration `bug` names while it is a known, open bug (KNOWN_BUGS)."""
    if b.avoid_known_bugs and bug in KNOWN_BUGS:
        raise Rejected(KNOWN_BUGS[bug])


def _thresholded(b: _Builder, x: _Tensor) -> None:
    alpha = round(b.rng.uniform(-0.5, 1.0), 3)
    if not _far_from_steps(x.truth, alpha):
        raise Rejected("ThresholdedRelu at its step")
    b.emit("ThresholdedRelu", [x.name], alpha=alpha)


# On fp16 data these amplify one rounding step of their input (an fp16 ulp of 32 is 0.03) far
# past fp16's tolerance, and references differ in where they round (onnxruntime's CPU computes
# fp16 chains in fp32): their inputs stay small.
_FP16_ILL_CONDITIONED = {"Sin": 4.0, "Cos": 4.0, "Exp": 3.0, "Sinh": 3.0, "Cosh": 3.0}


def _unary(b: _Builder, x: _Tensor) -> None:
    def fits_fp16(op: str) -> bool:
        bound = _FP16_ILL_CONDITIONED.get(op)
        return x.rtol <= _RTOL[FLOAT] or bound is None or float(np.abs(x.truth).max()) < bound

    fits = [u for u in _UNARY if x.elem in u[2] and b.opset >= u[1] and u[3](x.truth) and fits_fp16(u[0])]
    if not fits:
        raise Rejected("no unary op fits")
    op, _, _, _, attrs = b.rng.choice(fits)
    b.emit(op, [x.name], **attrs(b.rng))


# Ops with a restricted domain, and the guard chain that puts any data inside it: random data
# is signed, so without a guard these would seldom be drawn.
_GUARDED = {
    "Log": [("Abs", None), ("Add", 0.1)],
    "Sqrt": [("Abs", None)],
    "Reciprocal": [("Abs", None), ("Add", 0.2)],
    "Acosh": [("Abs", None), ("Add", 1.1)],
    "Asin": [("Tanh", None), ("Mul", 0.9)],
    "Acos": [("Tanh", None), ("Mul", 0.9)],
    "Atanh": [("Tanh", None), ("Mul", 0.9)],
    "Pow": [("Sigmoid", None), ("Add", 0.1)],
}


def _guarded(b: _Builder, x: _Tensor) -> None:
    """A domain-restricted op behind the guard that makes its input valid (Abs > Add > Log)."""
    if x.elem != FLOAT or not x.rank:
        raise Rejected("guards are drawn on fp32")
    op = b.rng.choice(sorted(_GUARDED))
    y = x
    for guard, operand in _GUARDED[op]:
        args = [y.name] if operand is None else [y.name, b.const(np.array(operand, dtype=np.float32))]
        y = b.emit(guard, args)[0]
    if op == "Pow":
        b.emit("Pow", [y.name, b.const(np.array(b.rng.choice([0.5, 1.7, -1.5]), dtype=np.float32))])
    else:
        b.emit(op, [y.name])


def _clip(b: _Builder, x: _Tensor) -> None:
    if x.elem != FLOAT and b.opset < 12:
        raise Rejected("Clip on integers needs opset 12")
    lo, hi = sorted(b.rng.sample(sorted(set(np.round(x.truth.ravel(), 1).tolist()) | {0.0, 1.0}), 2))
    np_type = x.value.dtype
    args = [x.name]
    form = b.rng.random()
    if form < 0.4:
        args += [b.const(np.array(lo, dtype=np_type)), b.const(np.array(hi, dtype=np_type))]
    elif form < 0.7:
        args += [b.const(np.array(lo, dtype=np_type))]
    else:
        args += ["", b.const(np.array(hi, dtype=np_type))]
    b.emit("Clip", args)


def _cast(b: _Builder, x: _Tensor) -> None:
    targets = {FLOAT: [FLOAT16, INT32, INT64, BOOL], FLOAT16: [FLOAT], INT32: [FLOAT, INT64, BOOL],
               INT64: [FLOAT, INT32], BOOL: [FLOAT, INT32, INT64]}[x.elem]  # fmt: skip
    to = b.rng.choice(targets)
    if x.is_float and to in INTS and not _near_int_free(x.truth):
        raise Rejected("Cast to int near an integer")
    if x.is_float and to == BOOL and np.abs(x.truth).min() < STEP_MARGIN:
        raise Rejected("Cast to bool near zero")
    b.emit("Cast", [x.name], to=to)


# -- broadcasting binary ops --------------------------------------------------------------------
def _broadcast_shape(rng: random.Random, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts with `shape` (same, suffix, 1-dims, scalar, or a larger one)."""
    r = rng.random()
    s = list(shape)
    if r < 0.25:
        return tuple(s)
    if r < 0.45:
        s = s[rng.randint(0, len(s)) :]
    if r < 0.75:
        return tuple(1 if rng.random() < 0.4 else d for d in s)
    if r < 0.85:
        return ()
    if len(s) < 4 and rng.random() < 0.5:
        return (rng.randint(2, 3), *s)
    ones = [k for k, d in enumerate(s) if d == 1]
    if ones:
        s[rng.choice(ones)] = rng.randint(2, 4)
    return tuple(s)


def _partner(b: _Builder, x: _Tensor, elem: int, lo: float = -2.0, hi: float = 2.0,
             ok: Callable[[np.ndarray], bool] = lambda v: True) -> _Tensor:  # fmt: skip
    """A second operand that broadcasts with x: an earlier tensor, a fresh input or a constant."""
    if b.rng.random() < 0.35:
        cands = []
        for name in b.data:
            t = b.tensors[name]
            if name == x.name or t.elem != elem or not ok(t.truth):
                continue
            try:
                out = np.broadcast_shapes(x.shape, t.shape)
            except ValueError:
                continue
            if math.prod(out) <= MAX_ELEMENTS:
                cands.append(t)
        if cands:
            return b.rng.choice(cands)
    shape = _broadcast_shape(b.rng, x.shape)
    return b.tensors[b.operand(shape, elem, lo, hi)]


_ARITH = ["Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Mean", "Pow", "Mod", "PRelu"]


def _binary(b: _Builder, x: _Tensor) -> None:
    op = b.rng.choice(_ARITH if x.is_float else ["Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Mod"])
    if x.elem in INTS and op in ("Max", "Min") and b.opset < 12:
        raise Rejected("integer Max/Min need opset 12")
    if op == "Div":
        lo, hi = (0.5, 2.0) if x.is_float else (1, 5)
        y = _partner(b, x, x.elem, lo, hi, ok=lambda v: np.abs(v).min() > (0.05 if x.is_float else 0.5))
        if b.rng.random() < 0.5 and x.is_float:
            y = b.tensors[b.emit("Neg", [y.name])[0].name] if b.rng.random() < 0.3 else y
        b.emit("Div", [x.name, y.name])
        return
    if op == "Pow":
        if x.truth.min() <= 0.05:
            raise Rejected("Pow base not positive")
        if b.rng.random() < 0.6:
            e = b.rng.choice([2.0, 3.0, 0.5, -1.0, 1.0, 1.7, -0.5])
            shape = () if b.rng.random() < 0.7 else (1,)
            y = b.const(np.full(shape, e, dtype=np.float32).astype(x.value.dtype))
        else:
            y = _partner(b, x, x.elem, -1.5, 1.5).name
        b.emit("Pow", [x.name, y])
        return
    if op == "Mod":
        fmod = 1 if x.is_float else b.rng.randint(0, 1)
        if fmod and not x.is_float:
            _avoid(b, "mod_fmod1_int")
        lo, hi = (0.5, 2.0) if x.is_float else (1, 5)
        y = _partner(b, x, x.elem, lo, hi, ok=lambda v: np.abs(v).min() > (0.3 if x.is_float else 0.5))
        if x.is_float:
            q = x.truth / y.truth
            if not _near_int_free(q):
                raise Rejected("fmod at a step")
        b.emit("Mod", [x.name, y.name], fmod=fmod)
        return
    if op == "PRelu":
        slope = _broadcast_shape(b.rng, x.shape)
        if np.broadcast_shapes(x.shape, slope) != x.shape:
            raise Rejected("PRelu slope must broadcast to x")
        b.emit("PRelu", [x.name, b.operand(slope, x.elem, -1.0, 1.0)])
        return
    if x.elem == INT32 and op in ("Mul",) and np.abs(x.value).max() > 1000:
        raise Rejected("integer overflow")
    y = _partner(b, x, x.elem, -2.0 if x.is_float else -5, 2.0 if x.is_float else 5)
    args = [x.name, y.name] if b.rng.random() < 0.7 else [y.name, x.name]
    if op in ("Sum", "Mean", "Max", "Min") and b.rng.random() < 0.3:
        args.append(_partner(b, x, x.elem).name)
    b.emit(op, args)


def _compare(b: _Builder, x: _Tensor) -> None:
    ops = ["Less", "Greater", "Equal"] + (["LessOrEqual", "GreaterOrEqual"] if b.opset >= 12 else [])
    op = b.rng.choice(ops)
    if x.elem == BOOL:
        op = "Equal"
    lo, hi = (-2.0, 2.0) if x.is_float else (-3, 3)
    y = _partner(b, x, x.elem, lo, hi)
    if x.is_float:
        if op == "Equal":
            raise Rejected("float equality of computed values")
        if not _far_from_steps(x.truth, y.truth):
            raise Rejected("comparison at its step")
    b.emit(op, [x.name, y.name])


def _logic(b: _Builder, x: _Tensor) -> None:
    op = b.rng.choice(["And", "Or", "Xor"])
    y = _partner(b, x, BOOL)
    b.emit(op, [x.name, y.name])


def _where(b: _Builder, x: _Tensor) -> None:
    if x.elem == BOOL:
        cond = x
        y = b.tensors[b.operand(_broadcast_shape(b.rng, x.shape), FLOAT)]
        z = _partner(b, y, FLOAT)
    else:
        cond = b.tensors[b.operand(_broadcast_shape(b.rng, x.shape), BOOL)]
        y, z = x, _partner(b, x, x.elem)
    args = [cond.name, y.name, z.name]
    if b.rng.random() < 0.3:
        args[1], args[2] = args[2], args[1]
    b.emit("Where", args)


# -- injective ops and views --------------------------------------------------------------------
def _i64(values: Sequence[int] | int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def _transpose(b: _Builder, x: _Tensor) -> None:
    if x.rank < 2:
        raise Rejected("rank < 2")
    perm = list(range(x.rank))
    b.rng.shuffle(perm)
    b.emit("Transpose", [x.name], **({"perm": perm} if b.rng.random() < 0.85 else {}))


def _slice(b: _Builder, x: _Tensor) -> None:
    if not x.rank:
        raise Rejected("scalar")
    axes = sorted(b.rng.sample(range(x.rank), b.rng.randint(1, x.rank)))
    starts, ends, steps = [], [], []
    for a in axes:
        d = x.shape[a]
        step = b.rng.choice([1, 1, 1, 2, -1, -2]) if d > 1 else 1
        s = b.rng.randint(0, d - 1)
        e = b.rng.randint(s + 1, d) if step > 0 else b.rng.randint(-1, s - 1) if s > 0 else -1
        if step < 0 and e == -1:
            e = -(2**31)  # "to the start": INT_MIN-like sentinel, clamped by the op
        if step > 0 and b.rng.random() < 0.2:
            e = 2**31  # past the end: clamped
        if b.rng.random() < 0.25 and s > 0:
            s -= d  # negative start
        starts.append(s)
        ends.append(e)
        steps.append(step)
    args = [x.name, b.const(_i64(starts)), b.const(_i64(ends))]
    if axes != list(range(len(axes))) or b.rng.random() < 0.6 or any(st != 1 for st in steps):
        neg = [a - x.rank if b.rng.random() < 0.3 else a for a in axes]
        args.append(b.const(_i64(neg)))
        if any(st != 1 for st in steps) or b.rng.random() < 0.4:
            args.append(b.const(_i64(steps)))
    b.emit("Slice", args)


def _concat(b: _Builder, x: _Tensor) -> None:
    axis = b.rng.randrange(x.rank) if x.rank else None
    if axis is None:
        raise Rejected("scalar")
    parts = [x.name]
    for _ in range(b.rng.randint(1, 2)):
        shape = list(x.shape)
        shape[axis] = b.rng.randint(1, 4)
        same = [n for n in b.data if b.tensors[n].elem == x.elem and b.tensors[n].rank == x.rank
                and all(d == e for k, (d, e) in enumerate(zip(b.tensors[n].shape, x.shape, strict=True))
                        if k != axis)]  # fmt: skip
        if same and b.rng.random() < 0.5:
            parts.append(b.rng.choice(same))
        else:
            parts.append(b.operand(shape, x.elem))
    b.rng.shuffle(parts)
    b.emit("Concat", parts, axis=axis - x.rank if b.rng.random() < 0.3 else axis)


def _gather(b: _Builder, x: _Tensor) -> None:
    if not x.rank:
        raise Rejected("scalar")
    axis = b.rng.randrange(x.rank)
    d = x.shape[axis]
    shape = b.rng.choice([(), (b.rng.randint(1, 4),), (2, b.rng.randint(1, 3))])
    idx = np.array(b.np_rng().integers(-d, d, size=shape))
    elem = b.rng.choice([INT64, INT64, INT32])
    idx = idx.astype(helper.tensor_dtype_to_np_dtype(elem))
    if b.rng.random() < 0.25:
        name = b.fresh("in")
        b.inputs[name] = idx
        b.input_types[name] = elem
        b._leaf(name, idx, elem)
    else:
        name = b.const(idx, elem)
    b.emit("Gather", [x.name, name], axis=axis - x.rank if b.rng.random() < 0.3 else axis)


def _gather_elements(b: _Builder, x: _Tensor) -> None:
    if not x.rank:
        raise Rejected("scalar")
    axis = b.rng.randrange(x.rank)
    shape = [b.rng.randint(1, d) for d in x.shape]
    shape[axis] = b.rng.randint(1, 4)
    idx = b.np_rng().integers(-x.shape[axis], x.shape[axis], size=shape).astype(np.int64)
    b.emit("GatherElements", [x.name, b.const(idx)], axis=axis)


def _expand(b: _Builder, x: _Tensor) -> None:
    target = [b.rng.randint(2, 3) if d == 1 and b.rng.random() < 0.7 else d for d in x.shape]
    if b.rng.random() < 0.4 and len(target) < 4:
        target.insert(0, b.rng.randint(1, 3))
    if b.rng.random() < 0.3:  # a 1 in the target keeps the input's dim
        lead = len(target) - x.rank
        target = [
            1 if k >= lead and d == x.shape[k - lead] and b.rng.random() < 0.5 else d
            for k, d in enumerate(target)
        ]
    b.emit("Expand", [x.name, b.const(_i64(target))])


def _pad(b: _Builder, x: _Tensor) -> None:
    if not x.rank:
        raise Rejected("scalar")
    mode = b.rng.choice(["constant", "constant", "reflect", "edge"])
    pads = []
    for d in [*x.shape, *x.shape]:  # begins, then ends
        p = b.rng.randint(0, max(0, min(2, d - 1 if mode == "reflect" else 2)))
        if mode == "constant" and b.rng.random() < 0.1 and d > 1:
            p = -1  # a negative pad crops
        pads.append(p)
    args = [x.name, b.const(_i64(pads))]
    if mode == "constant" and b.rng.random() < 0.6:
        args.append(b.const(np.array(round(b.rng.uniform(-1, 1), 2), dtype=x.value.dtype)))
    b.emit("Pad", args, mode=mode)


def _tile(b: _Builder, x: _Tensor) -> None:
    if not x.rank:
        raise Rejected("scalar")
    reps = [b.rng.choice([1, 1, 2, 3]) for _ in x.shape]
    b.emit("Tile", [x.name, b.const(_i64(reps))])


def _split(b: _Builder, x: _Tensor) -> None:
    axes = [a for a in range(x.rank) if x.shape[a] >= 2]
    if not axes:
        raise Rejected("nothing to split")
    axis = b.rng.choice(axes)
    d = x.shape[axis]
    n = b.rng.randint(2, min(3, d))
    cuts = sorted(b.rng.sample(range(1, d), n - 1))
    sizes = [e - s for s, e in zip([0, *cuts], [*cuts, d], strict=True)]
    attrs: dict[str, object] = {"axis": axis}
    args = [x.name]
    if b.opset >= 18 and b.rng.random() < 0.4 and d % n == 0:
        attrs["num_outputs"] = n
    elif b.opset >= 13:
        args.append(b.const(_i64(sizes)))
    else:
        attrs["split"] = sizes
    b.emit("Split", args, n_out=n, **attrs)


def _depth_space(b: _Builder, x: _Tensor) -> None:
    if x.rank != 4:
        raise Rejected("rank 4 only")
    _, c, h, w = x.shape
    if b.rng.random() < 0.5 and c % 4 == 0:
        b.emit("DepthToSpace", [x.name], blocksize=2, mode=b.rng.choice(["DCR", "CRD"]))
    elif h % 2 == 0 and w % 2 == 0:
        b.emit("SpaceToDepth", [x.name], blocksize=2)
    else:
        raise Rejected("no block fits")


def _trilu(b: _Builder, x: _Tensor) -> None:
    if x.rank < 2:
        raise Rejected("rank < 2")
    args = [x.name]
    if b.rng.random() < 0.6:
        args.append(b.const(_i64(b.rng.randint(-2, 2))))
    b.emit("Trilu", args, upper=b.rng.randint(0, 1))


def _reverse_sequence(b: _Builder, x: _Tensor) -> None:
    if x.rank < 2:
        raise Rejected("rank < 2")
    batch_axis = b.rng.randint(0, 1)
    time_axis = 1 - batch_axis
    lens = b.np_rng().integers(1, x.shape[time_axis] + 1, size=x.shape[batch_axis]).astype(np.int64)
    b.emit("ReverseSequence", [x.name, b.const(lens)], batch_axis=batch_axis, time_axis=time_axis)


def _reshape(b: _Builder, x: _Tensor) -> None:
    size = x.value.size
    dims = []
    left = size
    for _ in range(b.rng.randint(1, 4)):
        divs = [k for k in range(1, left + 1) if left % k == 0]
        k = b.rng.choice(divs)
        dims.append(k)
        left //= k
    dims.append(left)
    b.rng.shuffle(dims)
    if b.rng.random() < 0.4:
        dims[b.rng.randrange(len(dims))] = -1
    b.emit("Reshape", [x.name, b.const(_i64(dims))])


def _flatten(b: _Builder, x: _Tensor) -> None:
    b.emit("Flatten", [x.name], axis=b.rng.randint(-x.rank, x.rank) if x.rank else 0)


def _squeeze(b: _Builder, x: _Tensor) -> None:
    ones = [k for k, d in enumerate(x.shape) if d == 1]
    if ones and b.rng.random() < 0.6:
        axes = sorted(b.rng.sample(ones, b.rng.randint(1, len(ones))))
        op = "Squeeze"
    else:
        if x.rank >= 5:
            raise Rejected("rank")
        axes = sorted(b.rng.sample(range(x.rank + 1), 1))
        op = "Unsqueeze"
    if b.opset >= 13:
        b.emit(op, [x.name, b.const(_i64(axes))])
    else:
        b.emit(op, [x.name], axes=axes)


# -- reductions ---------------------------------------------------------------------------------
_REDUCE = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
           "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"]  # fmt: skip


def _reduce(b: _Builder, x: _Tensor) -> None:
    op = b.rng.choice(_REDUCE if x.is_float else ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"])
    if not x.rank:
        raise Rejected("scalar")
    if op == "ReduceLogSum" and x.truth.min() <= 0.05:
        raise Rejected("ReduceLogSum of non-positive data")
    if op == "ReduceProd" and np.abs(x.value).max() > (1.5 if x.is_float else 3):
        raise Rejected("product would blow up")
    axes = sorted(b.rng.sample(range(x.rank), b.rng.randint(1, x.rank)))
    axes = [a - x.rank if b.rng.random() < 0.3 else a for a in axes]
    keep = b.rng.randint(0, 1)
    as_input = b.opset >= (13 if op == "ReduceSum" else 18)
    attrs: dict[str, object] = {"keepdims": keep}
    args = [x.name]
    if b.rng.random() < 0.15:  # no axes: reduce everything
        pass
    elif as_input:
        args.append(b.const(_i64(axes)))
    else:
        attrs["axes"] = axes
    b.emit(op, args, **attrs)


def _arg(b: _Builder, x: _Tensor) -> None:
    if not x.rank:
        raise Rejected("scalar")
    axis = b.rng.randrange(x.rank)
    if x.is_float:
        top = np.sort(x.truth, axis=axis)
        if x.shape[axis] > 1:
            gap = np.take(top, -1, axis=axis) - np.take(top, -2, axis=axis)
            low = np.take(top, 1, axis=axis) - np.take(top, 0, axis=axis)
            if gap.min() < STEP_MARGIN or low.min() < STEP_MARGIN:
                raise Rejected("ArgMax tie")
    attrs: dict[str, object] = {"axis": axis - x.rank if b.rng.random() < 0.3 else axis,
                                "keepdims": b.rng.randint(0, 1)}  # fmt: skip
    if b.opset >= 12 and b.rng.random() < 0.4:
        attrs["select_last_index"] = 1
    b.emit(b.rng.choice(["ArgMax", "ArgMin"]), [x.name], **attrs)


def _softmax(b: _Builder, x: _Tensor) -> None:
    if not x.rank:
        raise Rejected("scalar")
    if b.opset < 13:
        _avoid(b, "softmax_opset_lt_13")
    attrs = {"axis": b.rng.randint(-x.rank, x.rank - 1)} if b.rng.random() < 0.7 else {}
    b.emit(b.rng.choice(["Softmax", "LogSoftmax"]), [x.name], **attrs)


def _layer_norm(b: _Builder, x: _Tensor) -> None:
    if not x.rank or b.opset < 17:
        raise Rejected("LayerNormalization needs opset 17")
    axis = b.rng.randint(-x.rank, x.rank - 1)
    norm_shape = x.shape[axis:]
    if math.prod(norm_shape) < 2:
        raise Rejected("one-element normalization")
    args = [x.name, b.data_const(norm_shape, x.elem, 0.5, 1.5)]
    if b.rng.random() < 0.7:
        args.append(b.data_const(norm_shape, x.elem, -0.5, 0.5))
    attrs: dict[str, object] = {"axis": axis}
    if b.rng.random() < 0.4:
        attrs["epsilon"] = b.rng.choice([1e-5, 1e-3, 0.1])
    b.emit("LayerNormalization", args, **attrs)


def _channel_norm(b: _Builder, x: _Tensor) -> None:
    if x.rank < 3:
        raise Rejected("rank < 3")
    c = x.shape[1]
    r = b.rng.random()
    if r < 0.3:
        b.emit(b.rng.choice(["GlobalAveragePool", "GlobalMaxPool"]), [x.name])
    elif r < 0.55:
        if math.prod(x.shape[2:]) < 2:
            raise Rejected("one-element instance")
        b.emit("InstanceNormalization", [x.name, b.data_const((c,), x.elem, 0.5, 1.5),
                                         b.data_const((c,), x.elem, -0.5, 0.5)], epsilon=1e-5)  # fmt: skip
    elif r < 0.75:
        if b.opset < 15:
            raise Rejected("inference BatchNormalization drawn from opset 15")
        args = [x.name, b.data_const((c,), x.elem, 0.5, 1.5), b.data_const((c,), x.elem, -0.5, 0.5),
                b.data_const((c,), x.elem, -0.5, 0.5), b.data_const((c,), x.elem, 0.2, 2.0)]  # fmt: skip
        b.emit("BatchNormalization", args, epsilon=1e-5)
    elif r < 0.9:
        axes = [0, 2, 3] if x.rank == 4 and b.rng.random() < 0.5 else sorted(b.rng.sample(range(x.rank), 2))
        b.emit("MeanVarianceNormalization", [x.name], axes=axes)
    else:
        if b.opset < 18:
            raise Rejected("GroupNormalization needs opset 18")
        groups = b.rng.choice([g for g in (1, 2, 3) if c % g == 0])
        per = c if b.opset >= 21 else groups
        scale, bias = b.data_const((per,), x.elem, 0.5, 1.5), b.data_const((per,), x.elem, -0.5, 0.5)
        b.emit("GroupNormalization", [x.name, scale, bias], num_groups=groups)


def _lp_norm(b: _Builder, x: _Tensor) -> None:
    if not x.rank:
        raise Rejected("scalar")
    b.emit("LpNormalization", [x.name], axis=b.rng.randint(-x.rank, x.rank - 1), p=b.rng.choice([1, 2]))


def _cumsum(b: _Builder, x: _Tensor) -> None:
    if not x.rank:
        raise Rejected("scalar")
    axis = b.rng.randint(-x.rank, x.rank - 1)
    ax = b.const(np.array(axis, dtype=b.rng.choice([np.int64, np.int32])))
    b.emit("CumSum", [x.name, ax], exclusive=b.rng.randint(0, 1), reverse=b.rng.randint(0, 1))


def _pool(b: _Builder, x: _Tensor) -> None:
    if x.rank not in (3, 4):
        raise Rejected("pooling wants NCW or NCHW")
    spatial = x.shape[2:]
    op = b.rng.choice(["MaxPool", "AveragePool", "LpPool"])
    kernel = [b.rng.randint(1, min(3, d)) for d in spatial]
    attrs: dict[str, object] = {"kernel_shape": kernel}
    if b.rng.random() < 0.5:
        attrs["strides"] = [b.rng.randint(1, 2) for _ in spatial]
    if b.rng.random() < 0.5:
        attrs["pads"] = [b.rng.randint(0, k - 1) for k in kernel] * 2
    if op != "LpPool" and b.rng.random() < 0.3:
        attrs["ceil_mode"] = 1
    if (op == "MaxPool" or (op == "AveragePool" and b.opset >= 19)) and b.rng.random() < 0.3:
        attrs["dilations"] = [b.rng.randint(1, 2) for _ in spatial]
    if op == "AveragePool" and b.rng.random() < 0.5:
        attrs["count_include_pad"] = 1
    if op == "LpPool":
        attrs["p"] = b.rng.choice([1, 2, 3])
    b.emit(op, [x.name], **attrs)


# -- anchors ------------------------------------------------------------------------------------
def _weight(b: _Builder, shape: Sequence[int], elem: int) -> str:
    scale = 1.0 / math.sqrt(max(1, math.prod(shape[1:]) if len(shape) > 1 else shape[0]))
    if b.rng.random() < 0.2:
        return b.input(shape, elem, -scale * 2, scale * 2)
    return b.data_const(shape, elem, -scale * 2, scale * 2)


def _matmul(b: _Builder, x: _Tensor) -> None:
    if not x.rank:
        raise Rejected("scalar")
    k = x.shape[-1]
    n = b.rng.randint(1, 12)
    r = b.rng.random()
    if r < 0.6 or x.rank == 1:
        w = _weight(b, (k, n), x.elem)
    elif r < 0.8:
        w = _weight(b, (*x.shape[:-2], k, n), x.elem)
    else:
        w = _weight(b, (k,), x.elem)
    b.emit("MatMul", [x.name, w])


def _gemm(b: _Builder, x: _Tensor) -> None:
    if x.rank != 2:
        raise Rejected("Gemm wants 2-D")
    trans_a = b.rng.random() < 0.25
    m, k = (x.shape[1], x.shape[0]) if trans_a else x.shape
    n = b.rng.randint(1, 12)
    trans_b = b.rng.random() < 0.5
    args = [x.name, _weight(b, (n, k) if trans_b else (k, n), x.elem)]
    if b.rng.random() < 0.7:
        c = b.rng.choice([(), (n,), (1, n), (m, 1), (m, n)])
        args.append(b.data_const(c, x.elem, -1.0, 1.0))
    attrs: dict[str, object] = {}
    if trans_a:
        attrs["transA"] = 1
    if trans_b:
        attrs["transB"] = 1
    if b.rng.random() < 0.3:
        attrs["alpha"] = b.rng.choice([0.5, 2.0, -1.0])
    if len(args) == 3 and b.rng.random() < 0.3:
        attrs["beta"] = b.rng.choice([0.5, 2.0, 0.0])
    b.emit("Gemm", args, **attrs)


def _conv(b: _Builder, x: _Tensor) -> None:
    if x.rank not in (3, 4) or x.elem != FLOAT:
        raise Rejected("Conv wants fp32 NCW/NCHW")
    c = x.shape[1]
    spatial = x.shape[2:]
    transpose = b.rng.random() < 0.2
    group = b.rng.choice([g for g in (1, 1, 2, 3, c) if c % g == 0])
    m = group * b.rng.randint(1, 3)
    kernel = [b.rng.randint(1, min(3, d)) for d in spatial]
    attrs: dict[str, object] = {}
    if group > 1:
        attrs["group"] = group
    strides = [b.rng.randint(1, 2) for _ in spatial]
    if b.rng.random() < 0.5:
        attrs["strides"] = strides
    else:
        strides = [1] * len(spatial)
    if b.rng.random() < 0.5:
        attrs["pads"] = [b.rng.randint(0, k - 1) for k in kernel] * 2
    if not transpose and b.rng.random() < 0.25:
        attrs["dilations"] = [b.rng.randint(1, 2) for _ in spatial]
    if transpose:
        w_shape = (c, m // group, *kernel)
        if b.rng.random() < 0.3:
            attrs["output_padding"] = [b.rng.randint(0, s - 1) for s in strides]
        op = "ConvTranspose"
    else:
        w_shape = (m, c // group, *kernel)
        op = "Conv"
    args = [x.name, _weight(b, w_shape, x.elem)]
    if b.rng.random() < 0.6:
        args.append(b.data_const((m,), x.elem, -0.5, 0.5))
    b.emit(op, args, **attrs)


# -- the draw -----------------------------------------------------------------------------------
# (weight, dtypes the drawer takes, drawer)
_ANY = FLOATS | INTS | frozenset({BOOL})
_DRAWERS: list[tuple[float, frozenset[int], Drawer]] = [
    (22, FLOATS | INTS | frozenset({BOOL}), _unary),
    (3, frozenset({FLOAT}), _thresholded),
    (3, frozenset({FLOAT}), _guarded),
    (3, FLOATS | INTS, _clip),
    (3, _ANY, _cast),
    (24, FLOATS | INTS, _binary),
    (4, _ANY, _compare),
    (2, frozenset({BOOL}), _logic),
    (3, _ANY, _where),
    (3, _ANY, _transpose),
    (4, _ANY, _slice),
    (3, _ANY, _concat),
    (3, _ANY, _gather),
    (1, _ANY, _gather_elements),
    (2, _ANY, _expand),
    (2, FLOATS | INTS, _pad),
    (1, _ANY, _tile),
    (2, _ANY, _split),
    (1, _ANY, _depth_space),
    (1, FLOATS | INTS, _trilu),
    (1, _ANY, _reverse_sequence),
    (3, _ANY, _reshape),
    (1, _ANY, _flatten),
    (2, _ANY, _squeeze),
    (8, FLOATS | INTS, _reduce),
    (2, FLOATS | INTS, _arg),
    (5, FLOATS, _softmax),
    (3, FLOATS, _layer_norm),
    (3, FLOATS, _channel_norm),
    (1, FLOATS, _lp_norm),
    (2, frozenset({FLOAT}) | INTS, _cumsum),
    (4, frozenset({FLOAT}), _pool),
    (6, FLOATS, _matmul),
    (3, FLOATS, _gemm),
    (5, frozenset({FLOAT}), _conv),
]


def _start(b: _Builder) -> None:
    """The first inputs: plain fp32 (most), an image (NCHW/NCW), integer, bool or fp16 data."""
    r = b.rng.random()
    rank = b.rng.choice([1, 2, 2, 3, 3, 4])
    shape = tuple(b.rng.randint(1, 6) for _ in range(rank))
    if r < 0.25:
        spatial = [b.rng.randint(3, 8) for _ in range(b.rng.choice([1, 2, 2]))]
        b.input((b.rng.randint(1, 2), b.rng.randint(1, 6), *spatial), FLOAT)
    elif r < 0.75:
        b.input(shape, FLOAT)
        if b.rng.random() < 0.4:
            b.input(_broadcast_shape(b.rng, shape), FLOAT, 0.1, 3.0)
    elif r < 0.87:
        b.input(shape, b.rng.choice([INT32, INT64]), -6, 6)
    elif r < 0.93:
        b.input(shape, BOOL)
        b.input(_broadcast_shape(b.rng, shape), FLOAT)
    else:
        b.input(shape, FLOAT16)


def _pick(b: _Builder) -> _Tensor:
    """A source tensor: usually one of the newest (chains), sometimes any earlier one."""
    if b.rng.random() < 0.75:
        return b.tensors[b.data[-1 - min(len(b.data) - 1, int(b.rng.expovariate(1.5)))]]
    return b.tensors[b.rng.choice(b.data)]


def generate(
    seed: int,
    *,
    max_nodes: int = 12,
    opsets: Sequence[int] = tuple(range(MIN_OPSET, MAX_OPSET + 1)),
    avoid_known_bugs: bool = True,
) -> RandomGraph:
    """The graph of `seed` (2..max_nodes nodes): same seed, same model, inputs and truth."""
    rng = random.Random(seed)
    opset = rng.choice(list(opsets))
    for _ in range(20):
        b = _Builder(random.Random(rng.getrandbits(64)), opset, avoid_known_bugs, max_nodes)
        _start(b)
        target = b.rng.randint(2, max_nodes)
        attempts = 0
        while len(b.nodes) < target and attempts < 30 * target:
            attempts += 1
            x = _pick(b)
            choices = [(w, d) for w, types, d in _DRAWERS if x.elem in types]
            drawer = b.rng.choices([d for _, d in choices], weights=[w for w, _ in choices])[0]
            with contextlib.suppress(Rejected):
                drawer(b, x)
        if len(b.nodes) >= 2:
            return b.finish(seed)
    raise RuntimeError(f"seed {seed}: could not draw a graph of two nodes")  # pragma: no cover


def drawable_ops() -> frozenset[str]:
    """Every op type the generator can emit (for coverage against the registry)."""
    ops = {u[0] for u in _UNARY}
    ops |= {"ThresholdedRelu", "Clip", "Cast", *_ARITH, "Less", "Greater", "Equal", "LessOrEqual",
            "GreaterOrEqual", "And", "Or", "Xor", "Where", "Transpose", "Slice", "Concat", "Gather",
            "GatherElements", "Expand", "Pad", "Tile", "Split", "DepthToSpace", "SpaceToDepth", "Trilu",
            "ReverseSequence", "Reshape", "Flatten", "Squeeze", "Unsqueeze", *_REDUCE, "ArgMax", "ArgMin",
            "Softmax", "LogSoftmax", "LayerNormalization", "GlobalAveragePool", "GlobalMaxPool",
            "InstanceNormalization", "BatchNormalization", "MeanVarianceNormalization",
            "GroupNormalization", "LpNormalization", "CumSum", "MaxPool", "AveragePool", "LpPool",
            "MatMul", "Gemm", "Conv", "ConvTranspose"}  # fmt: skip
    return frozenset(ops)
