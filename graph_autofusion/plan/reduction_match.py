"""`ReductionMatch`: what a row-reduction kernel is, decided once for the planner and the lowering.

    match = match_reduction(spec)          # raises Unsupported with the sentence saying why not
    kernel = lower_reduction(spec, match)  # lower/reduction.py renders the match as kernel IR

The planner builds the spec a group would become (`group_spec`) and asks the same function the
lowering asks, so a group it accepts as a `reduction` always lowers: legality is "the match
succeeds". Compound ops are expanded into primitive accumulators (sum, max, min, prod) plus
elementwise nodes, e.g.

    Softmax(x)            m = max(x); e = Exp(x - m); s = sum(e); y = e / s
    LayerNormalization    mean = sum(x)/n; d = x - mean; var = sum(d*d)/n; y = d/sqrt(var+eps)*g+b
    ReduceLogSumExp(x)    m = max(x); y = Log(sum(Exp(x - m))) + m

so a decomposed LayerNorm coming from an exporter and the fused op generate the same code. Every
accumulator runs over one domain: the full shape of its input split into kept axes (one row per
kept index) and reduced axes (the row). Accumulators whose inputs have different shapes share a
kernel when they reduce trailing axes into the same rows (`outer` x `inner`); the domain is then
the two-axis `(outer, inner)`, which each input reaches by a reshape of the index.

What the row kernel cannot compute (checked here, each a refusal with its reason): ops that are
neither views, elementwise, broadcasts nor injective; an op after a reduction that moves elements
across rows (it would need values of rows the kernel does not hold); a value after a reduction,
or any value leaving the kernel, off both the full and the per-row domain; a per-row value
broadcast across rows (`r[18] + x[4,18]` puts 18 reductions along each output row).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx

from ..backend.cpu.kernel_spec import KernelSpec, TensorInfo
from ..ir import Graph
from ..lower.values import Unsupported, Values, attrs_of, normalize_axis
from ..ops import OpKind, lookup
from ..ops.registry import ops_tagged
from .cost import group_boundary

REDUCTIONS = ops_tagged("row")  # the ops the expansion rewrites into accumulators
# Kinds a row kernel computes besides its reductions (injective ones only before a reduction,
# but for ROW_PRESERVING_OPS).
ROW_KINDS = {OpKind.VIEW, OpKind.ELEMENTWISE, OpKind.BROADCAST, OpKind.INJECTIVE}
# Injective ops that may follow a reduction in a row kernel: they broadcast a per-row value over
# its own row (a kept-dims reduction's result expanded back to the full domain).
ROW_PRESERVING_OPS = {"Expand"}
EXP_SHIFTED = "AfExpShifted"  # internal: exp(d) for d = x - max(x) <= 0 (lower/reduction.py)


@dataclass(frozen=True)
class Acc:
    """One accumulator: `dst` = `kind` of `src` over the match's reduced axes."""

    kind: str  # sum | max | min | prod
    src: str
    dst: str


@dataclass(frozen=True)
class ReductionMatch:
    """A row-reduction kernel: elementwise nodes and accumulators over one domain.

    `full` is None when no accumulator is left (a Reduce with `noop_with_empty_axes`): the kernel
    is then a copy. `tensors` and `constants` are the spec's plus those the expansion added."""

    items: tuple[onnx.NodeProto | Acc, ...]
    full: tuple[int, ...] | None
    axes: tuple[int, ...] | None
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    constants: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def inner(self) -> int:
        """Elements per row."""
        assert self.full is not None and self.axes is not None
        return math.prod(self.full[a] for a in self.axes)

    @property
    def outer(self) -> int:
        """Rows."""
        assert self.full is not None
        return math.prod(self.full) // max(1, self.inner)

    @property
    def accumulators(self) -> list[Acc]:
        return [it for it in self.items if isinstance(it, Acc)]


def match_reduction(spec: KernelSpec) -> ReductionMatch:
    """The row kernel `spec` forms; raises `Unsupported` saying why it forms none."""
    expansion = _Expansion(spec)
    for node in spec.nodes:
        expansion.expand(node)
    expansion.settle_domain()
    match = ReductionMatch(
        tuple(expansion.items), expansion.full, expansion.axes, expansion.tensors, expansion.constants
    )
    if match.full is not None:
        _check_rows(spec, match)
    return match


def group_spec(
    graph: Graph, members: Collection[int], private: Collection[int] = (), max_constant: int | None = None
) -> KernelSpec:
    """The spec a planned group becomes once exported and extracted (backend/cpu/extract.py):
    its nodes, boundary (values of `private` members never leave) and constants (only those up to
    `max_constant` elements when given: a match that reads shapes and windows need not copy
    every weight on each of the planner's many questions)."""
    inputs, outputs = group_boundary(graph, members, private)
    nodes = tuple(graph.nodes[i].proto for i in sorted(members))
    tensors: dict[str, TensorInfo] = {}
    for n in nodes:
        for name in (*n.input, *n.output):
            v = graph.values.get(name) if name else None
            if v is not None and v.shape is not None:
                tensors[name] = TensorInfo(name, tuple(int(d) for d in v.shape), v.elem_type)
    constants = {}
    for x in inputs:
        v = graph.values[x]
        small = max_constant is None or (v.shape is not None and math.prod(v.shape) <= max_constant)
        value = graph.const_value(x) if v.is_const and small else None
        if value is not None:
            constants[x] = value
    info = [tensors[x] for x in (*inputs, *outputs) if x in tensors]
    if len(info) != len(inputs) + len(outputs):
        missing = next(x for x in (*inputs, *outputs) if x not in tensors)
        raise Unsupported(f"no shape known for tensor {missing!r}")
    return KernelSpec(
        symbol="",
        template="reduction",
        nodes=nodes,
        inputs=tuple(info[: len(inputs)]),
        outputs=tuple(info[len(inputs) :]),
        tensors=tensors,
        constants=constants,
        members=tuple(n.name for n in nodes),
    )


# -- the expansion ---------------------------------------------------------------------------------
class _Expansion(Values):
    """Rewrites the body into elementwise nodes + accumulators, in topological order."""

    def __init__(self, spec: KernelSpec) -> None:
        super().__init__(dict(spec.tensors), {k: np.asarray(v) for k, v in spec.constants.items()})
        self.tensors: dict[str, TensorInfo]
        self.constants: dict[str, np.ndarray]
        self.items: list[onnx.NodeProto | Acc] = []
        self.full: tuple[int, ...] | None = None
        self.axes: tuple[int, ...] | None = None
        self._domains: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
        self._counter = 0

    def fresh(self, prefix: str) -> str:
        self._counter += 1
        return f"{prefix}{self._counter}"

    def _add(self, name: str, shape: Sequence[int], elem: int) -> None:
        self.tensors[name] = TensorInfo(name, tuple(int(d) for d in shape), elem)

    def node(self, op: str, inputs: Sequence[str], shape: Sequence[int], elem_type: int | None = None,
             out: str | None = None, **attrs: object) -> str:  # fmt: skip
        out = out or self.fresh("_r")
        elem = elem_type if elem_type is not None else self.tensors[inputs[0]].elem_type
        self._add(out, shape, elem)
        self.items.append(onnx.helper.make_node(op, list(inputs), [out], **attrs))
        return out

    def const(self, value: float, elem_type: int) -> str:
        name = self.fresh("_k")
        self._add(name, (), elem_type)
        self.constants[name] = np.array(value, dtype=onnx.helper.tensor_dtype_to_np_dtype(elem_type))
        return name

    def acc(self, kind: str, src: str, axes: Sequence[int], out: str | None = None) -> str:
        shape = self.shape(src)
        axes_t = tuple(sorted(axes))
        if (shape, axes_t) not in self._domains:
            self._domains.append((shape, axes_t))
        reduced = [1 if a in axes_t else d for a, d in enumerate(shape)]
        dst = out or self.fresh("_a")
        self._add(dst, reduced, self.tensors[src].elem_type)
        self.items.append(Acc(kind, src, dst))
        return dst

    def settle_domain(self) -> None:
        """One domain for every accumulator: theirs when they agree, else the two-axis rows
        `(outer, inner)` they share when each reduces trailing axes into the same rows."""
        if not self._domains:
            return
        if len(self._domains) == 1:
            self.full, self.axes = self._domains[0]
            return
        rows = set()
        for shape, axes in self._domains:
            if axes != tuple(range(len(shape) - len(axes), len(shape))):
                break
            inner = math.prod(shape[a] for a in axes)
            rows.add((math.prod(shape) // max(1, inner), inner))
        else:
            if len(rows) == 1:
                outer, inner = rows.pop()
                self.full, self.axes = (outer, inner), (1,)
                return
        (s0, a0), (s1, a1) = self._domains[:2]
        raise Unsupported(f"reductions over different domains in one kernel: {s0}/{a0} vs {s1}/{a1}")

    def view(self, src: str, out: str) -> str:
        self.items.append(onnx.helper.make_node("Reshape", [src], [out]))
        return out

    def exp_shifted(self, d: str, shape: Sequence[int]) -> str:
        """exp(d) for d = x - max(x) <= 0, flushed to 0 below d = -87.

        The flush changes a result by less than 2e-38 absolute. It keeps masked positions
        (-inf, -1e4, finfo.min) on the fast path of the vectorized expf, which falls back to
        scalar code for lanes that underflow, and keeps denormals (slow to divide) out of the
        row that is normalized next.
        """
        return self.node(EXP_SHIFTED, [d], shape)

    def count(self, src: str, axes: Sequence[int]) -> int:
        shape = self.shape(src)
        return math.prod(shape[a] for a in axes)

    # -- one original node -----------------------------------------------------------------------
    def expand(self, node: onnx.NodeProto) -> None:
        op = node.op_type
        if op not in REDUCTIONS:
            self.items.append(node)
            return
        attrs = attrs_of(node)
        x = node.input[0]
        shape = self.shape(x)
        rank = len(shape)
        elem = self.tensors[x].elem_type
        if op in ("Softmax", "LogSoftmax"):
            axes = [normalize_axis(int(attrs.get("axis", -1)), rank)]  # type: ignore[call-overload]
            m = self.acc("max", x, axes)
            d = self.node("Sub", [x, m], shape)
            e = self.exp_shifted(d, shape)
            s = self.acc("sum", e, axes)
            if op == "Softmax":
                self.node("Div", [e, s], shape, out=node.output[0])
            else:
                ls = self.node("Log", [s], self.shape(s))
                self.node("Sub", [d, ls], shape, out=node.output[0])
            return
        if op == "LayerNormalization":
            axis = normalize_axis(int(attrs.get("axis", -1)), rank)  # type: ignore[call-overload]
            axes = list(range(axis, rank))
            eps = float(attrs.get("epsilon", 1e-5))  # type: ignore[arg-type]
            n = self.const(float(self.count(x, axes)), elem)
            red_shape = [1 if a in axes else d for a, d in enumerate(shape)]
            mean_out = node.output[1] if len(node.output) > 1 and node.output[1] else None
            s = self.acc("sum", x, axes)
            mean = self.node("Div", [s, n], red_shape, out=mean_out)
            d = self.node("Sub", [x, mean], shape)
            d2 = self.node("Mul", [d, d], shape)
            v = self.acc("sum", d2, axes)
            var = self.node("Div", [v, n], red_shape)
            ve = self.node("Add", [var, self.const(eps, elem)], red_shape)
            sd = self.node("Sqrt", [ve], red_shape)
            if len(node.output) > 2 and node.output[2]:
                self.node("Reciprocal", [sd], red_shape, out=node.output[2])
            y = self.node("Div", [d, sd], shape)
            has_bias = len(node.input) > 2 and node.input[2]
            y = self.node("Mul", [y, node.input[1]], shape, out=None if has_bias else node.output[0])
            if has_bias:
                self.node("Add", [y, node.input[2]], shape, out=node.output[0])
            return
        if op in ("InstanceNormalization", "MeanVarianceNormalization"):
            if op == "InstanceNormalization":
                axes = list(range(2, rank))
                eps = float(attrs.get("epsilon", 1e-5))  # type: ignore[arg-type]
            else:
                axes = sorted(normalize_axis(int(a), rank) for a in attrs.get("axes", [0, 2, 3]))  # type: ignore[union-attr]
                eps = 1e-9
            n = self.const(float(self.count(x, axes)), elem)
            red_shape = [1 if a in axes else d for a, d in enumerate(shape)]
            mean = self.node("Div", [self.acc("sum", x, axes), n], red_shape)
            d = self.node("Sub", [x, mean], shape)
            var = self.node("Div", [self.acc("sum", self.node("Mul", [d, d], shape), axes), n], red_shape)
            sd = self.node("Sqrt", [self.node("Add", [var, self.const(eps, elem)], red_shape)], red_shape)
            if op == "MeanVarianceNormalization":
                self.node("Div", [d, sd], shape, out=node.output[0])
                return
            y = self.node("Div", [d, sd], shape)
            per_channel = [shape[1], *([1] * (rank - 2))]  # (C,) -> (C, 1, ...) to broadcast over NCHW
            scale = self.node("Reshape", [node.input[1]], per_channel)
            bias = self.node("Reshape", [node.input[2]], per_channel)
            self.node("Add", [self.node("Mul", [y, scale], shape), bias], shape, out=node.output[0])
            return
        if op == "LpNormalization":
            axis = normalize_axis(int(attrs.get("axis", -1)), rank)  # type: ignore[call-overload]
            p = int(attrs.get("p", 2))  # type: ignore[call-overload]
            red_shape = [1 if a == axis else d for a, d in enumerate(shape)]
            if p == 1:
                norm = self.acc("sum", self.node("Abs", [x], shape), [axis])
            else:
                norm = self.node(
                    "Sqrt", [self.acc("sum", self.node("Mul", [x, x], shape), [axis])], red_shape
                )
            zero = self.const(0.0, elem)
            is_zero = self.node("Equal", [norm, zero], red_shape, onnx.TensorProto.BOOL)
            self.node(
                "Where", [is_zero, zero, self.node("Div", [x, norm], shape)], shape, elem, out=node.output[0]
            )
            return
        if op in ("GlobalAveragePool", "GlobalMaxPool"):
            axes = list(range(2, rank))
            kind = "sum" if op == "GlobalAveragePool" else "max"
            r = self.acc(kind, x, axes, out=None if kind == "sum" else node.output[0])
            if kind == "sum":
                count = self.const(float(self.count(x, axes)), elem)
                self.node("Div", [r, count], self.shape(r), out=node.output[0])
            return
        # Reduce*
        if len(node.input) > 1 and node.input[1]:
            axes = self.const_ints(node.input[1], f"{op} axes")
        else:
            axes = [int(a) for a in attrs.get("axes", [])]  # type: ignore[union-attr]
        if not axes:
            if int(attrs.get("noop_with_empty_axes", 0)):  # type: ignore[call-overload]
                self.node("Identity", [x], shape, out=node.output[0])
                return
            axes = list(range(rank))
        axes = sorted({normalize_axis(a, rank) for a in axes})
        keep = int(attrs.get("keepdims", 1))  # type: ignore[call-overload]
        out = node.output[0]
        red_shape = tuple(1 if a in axes else d for a, d in enumerate(shape))
        final = out if keep or self.shape(out) == red_shape else None
        result = self._reduce(op, x, axes, red_shape, elem, final)
        if final is None:
            self.view(result, out)

    def _reduce(
        self, op: str, x: str, axes: list[int], red: tuple[int, ...], elem: int, out: str | None
    ) -> str:
        shape = self.shape(x)
        if op in ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"):
            kind = {"ReduceSum": "sum", "ReduceMax": "max", "ReduceMin": "min", "ReduceProd": "prod"}[op]
            return self.acc(kind, x, axes, out=out)
        if op == "ReduceMean":
            s = self.acc("sum", x, axes)
            return self.node("Div", [s, self.const(float(self.count(x, axes)), elem)], red, out=out)
        if op in ("ReduceSumSquare", "ReduceL2"):
            sq = self.node("Mul", [x, x], shape)
            if op == "ReduceSumSquare":
                return self.acc("sum", sq, axes, out=out)
            return self.node("Sqrt", [self.acc("sum", sq, axes)], red, out=out)
        if op == "ReduceL1":
            return self.acc("sum", self.node("Abs", [x], shape), axes, out=out)
        if op == "ReduceLogSum":
            return self.node("Log", [self.acc("sum", x, axes)], red, out=out)
        if op == "ReduceLogSumExp":
            m = self.acc("max", x, axes)
            e = self.exp_shifted(self.node("Sub", [x, m], shape), shape)
            ls = self.node("Log", [self.acc("sum", e, axes)], red)
            return self.node("Add", [ls, m], red, out=out)
        raise Unsupported(f"reduction {op}")


# -- what one row at a time can compute ----------------------------------------------------------
def _check_rows(spec: KernelSpec, match: ReductionMatch) -> None:
    assert match.full is not None and match.axes is not None
    outer, inner = match.outer, match.inner
    total = outer * inner
    if total == 0:
        raise Unsupported("a reduction over an empty tensor")
    producer = {o: n for n in spec.nodes for o in n.output if o}

    def numel(name: str) -> int:
        return math.prod(match.tensors[name].shape) if name in match.tensors else -1

    def who(node: onnx.NodeProto) -> str:
        return f"{node.op_type} '{node.name}'"

    after = _after_reductions(spec)
    for node in spec.nodes:
        if node.op_type in REDUCTIONS:
            continue
        kind = lookup(node.op_type).kind
        if kind not in ROW_KINDS:
            raise Unsupported(f"{who(node)} cannot join a row reduction")
        if kind == OpKind.INJECTIVE and id(node) in after and node.op_type not in ROW_PRESERVING_OPS:
            # The kernel computes one row at a time: an epilogue that moves elements (Transpose
            # back, Slice, Gather) would need values of other rows, which it does not hold.
            raise Unsupported(f"{who(node)} reorders a reduction's results across rows")
    for t in spec.outputs:
        if t.numel not in (total, outer):
            node = producer.get(t.name)
            what = who(node) if node is not None else f"output {t.name}"
            raise Unsupported(f"{what} works on {t.numel} elements, rows are {outer}x{inner}")
    _check_row_broadcasts(spec, match, after, numel, who)


def _after_reductions(spec: KernelSpec) -> set[int]:
    """ids of the spec's nodes downstream of a reduction."""
    tainted: set[str] = set()
    after: set[int] = set()
    for node in spec.nodes:
        if node.op_type in REDUCTIONS or any(i in tainted for i in node.input if i):
            if node.op_type not in REDUCTIONS:
                after.add(id(node))
            tainted.update(o for o in node.output if o)
    return after


def _check_row_broadcasts(spec: KernelSpec, match: ReductionMatch, after: set[int], numel, who) -> None:  # type: ignore[no-untyped-def]
    """An op after a reduction works on one value per row or on the row domain, and a per-row
    value (a reduction's result) must broadcast along its own row.

    The row kernel hands each epilogue op the value of the row it is computing: right only when
    the op's output holds that row's elements where the row's kept index puts them. With trailing
    reduced axes that is flat offsets [row*inner, (row+1)*inner): the per-row value has the
    output's leading dims and ones after them. `r[18] + x[4,18]` broadcasts r along the last axis
    instead (each output row mixes 18 reductions): a misfit.
    """
    assert match.full is not None and match.axes is not None
    outer, inner = match.outer, match.inner
    full, axes = match.full, match.axes
    trailing = axes == tuple(range(len(full) - len(axes), len(full)))
    per_row = {o for n in spec.nodes if n.op_type in REDUCTIONS for o in n.output if o and numel(o) == outer}
    for node in spec.nodes:
        if id(node) not in after:
            continue
        out_name = node.output[0]
        if out_name not in match.tensors:
            continue
        out = match.tensors[out_name].shape
        size = math.prod(out)
        if size not in (outer, outer * inner):
            # Neither one value per row nor the row domain: the row loop cannot produce it.
            raise Unsupported(
                f"{who(node)} after a reduction works on {size} elements, rows are {outer}x{inner}"
            )
        kind = lookup(node.op_type).kind
        for v in node.input:
            if v not in per_row:
                continue
            shape = match.tensors[v].shape if v in match.tensors else None
            if size == outer and kind != OpKind.INJECTIVE:
                per_row.update(o for o in node.output if o)  # still one value per row
            elif shape is None or not _row_aligned(tuple(shape), tuple(out), outer, full, axes, trailing):
                raise Unsupported(
                    f"{who(node)} broadcasts a per-row value {list(shape or [])} across rows "
                    f"of its output {list(out)}"
                )


def _row_aligned(
    shape: tuple[int, ...], out: tuple[int, ...], outer: int, full: tuple[int, ...], axes: tuple[int, ...],
    trailing: bool,
) -> bool:  # fmt: skip
    """Whether `shape` broadcast to `out` is constant along each row. With trailing reduced axes:
    over each run of out's last axes covering `numel(out) / outer` elements (the leading dims
    equal out's, product `outer`, then ones). Otherwise `out` must be the full domain and `shape`
    the full domain with ones at the reduced axes."""
    padded = (1,) * (len(out) - len(shape)) + shape
    if not trailing:
        reduced = tuple(1 if a in axes else d for a, d in enumerate(full))
        return out == full and padded == reduced
    return any(
        math.prod(out[:k]) == outer and padded[:k] == out[:k] and all(d == 1 for d in padded[k:])
        for k in range(len(out) + 1)
    )
