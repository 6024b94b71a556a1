"""The `reduction` (row) template as kernel IR: reductions over shared axes with fused prologue
and epilogue.

The domain is the full shape F of the reductions' input, split into kept axes (the outer loop `o`,
parallel when big enough) and reduced axes (the row `j`). Compound ops are first rewritten into
primitive accumulators (sum, max, min, prod) plus elementwise nodes, e.g.

    Softmax(x)            m = max(x); e = Exp(x - m); s = sum(e); y = e / s
    LayerNormalization    mean = sum(x)/n; d = x - mean; var = sum(d*d)/n; y = d/sqrt(var+eps)*g+b
    ReduceLogSumExp(x)    m = max(x); y = Log(sum(Exp(x - m))) + m

so a decomposed LayerNorm coming from an exporter and the fused op generate the same code. Each
tensor gets a *level*: inputs 0, an accumulator's result one more than its input's level,
everything else the max of its inputs. Pass p over the row runs every accumulator whose input is
at level p and writes every full-domain output at level p; between passes the per-row scalars
(reduced-domain elementwise ops: `var + eps`, `sqrt`) are computed once. Full-domain values are
recomputed in a later pass when cheap and kept in a per-thread row buffer (loop scratch) when
expensive (exp, erf, ...), which a dry run of the lowering decides. Float sums run in blocks of
SUM_BLOCK: fp32 lanes inside a block (vectorizes even next to 1-byte masks and libm calls), blocks
added in double, which keeps results within fp32 rounding of onnxruntime; integer sums are exact
in int64.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from ..backend.cpu.kernel_spec import KernelSpec, TensorInfo
from ..kernel_ir import Assign, Buffer, Declare, DType, Expr, Kernel, Let, Loop, Stmt, Store, TensorAt
from ..kernel_ir import nodes as ir
from ..ops import OpKind, lookup
from ..ops.registry import NodeShapes, ops_tagged
from .pointwise import PARALLEL_MIN_ELEMENTS, KernelValues, loop_nest
from .values import Index, IndexGroup, Unsupported, Values, attrs_of, index_rule, normalize_axis

REDUCTIONS = ops_tagged("row")  # what _Builder.expand rewrites
# Full-domain ops at least this costly (registry flops per element) are buffered, not recomputed.
_EXPENSIVE = 8
# Elements a float partial sum covers before it is added into the double total (8 lanes of 16).
SUM_BLOCK = 128

EXP_SHIFTED = "AfExpShifted"  # internal: exp(d) for d = x - max(x) <= 0 (see _Builder.exp_shifted)
_EXP_FLOOR = -87.0  # exp(-87) ~ 1.6e-38, the smallest normal float; vector expf is fast above it


@index_rule(EXP_SHIFTED)
def _exp_shifted(v: Values, node: onnx.NodeProto, k: int, idx: Index) -> Expr:
    x = v.at(node.input[0], idx)
    floor = ir.const(_EXP_FLOOR, x.dtype)
    # A multiply, not a select: with a select the C compiler proves the clamp useless where the
    # result is kept and calls expf on the raw (masked, slow-path) value.
    keep = ir.select(ir.lt(x, floor), ir.const(0.0, x.dtype), ir.const(1.0, x.dtype))
    return ir.unary("exp", ir.select(ir.lt(x, floor), floor, x)) * keep


@dataclass(frozen=True)
class Acc:
    kind: str  # sum | max | min | prod
    src: str
    dst: str


class RowValues(KernelValues):
    """Values of a row kernel: per-row scalars by name once computed, buffered row values."""

    def __init__(self, spec: KernelSpec) -> None:
        super().__init__(spec)
        self.overrides: dict[str, Expr] = {}
        self.hook = None  # set by the generator while it writes a pass
        self._counter = 0

    def fresh(self, prefix: str) -> str:
        self._counter += 1
        return f"{prefix}{self._counter}"

    def _leaf(self, at: TensorAt) -> Expr | None:
        if at.tensor in self.overrides:
            return self.overrides[at.tensor]
        if self.hook is not None:
            found = self.hook(at.tensor)
            if found is not None:
                return found
        return super()._leaf(at)


class _Builder:
    """Rewrites the body into elementwise nodes + accumulators, in topological order."""

    def __init__(self, values: RowValues) -> None:
        self.v = values
        self.items: list[onnx.NodeProto | Acc] = []
        self.full: tuple[int, ...] | None = None
        self.axes: tuple[int, ...] | None = None

    def _add(self, name: str, shape: Sequence[int], elem: int) -> None:
        self.v.tensors[name] = TensorInfo(name, tuple(int(d) for d in shape), elem)  # type: ignore[index]

    def node(self, op: str, inputs: Sequence[str], shape: Sequence[int], elem_type: int | None = None,
             out: str | None = None, **attrs: object) -> str:  # fmt: skip
        out = out or self.v.fresh("_r")
        elem = elem_type if elem_type is not None else self.v.tensors[inputs[0]].elem_type
        self._add(out, shape, elem)
        node = onnx.helper.make_node(op, list(inputs), [out], **attrs)
        self.v.producer[out] = (node, 0)
        self.items.append(node)
        return out

    def const(self, value: float, elem_type: int) -> str:
        name = self.v.fresh("_k")
        self._add(name, (), elem_type)
        self.v.constants[name] = np.array(value, dtype=onnx.helper.tensor_dtype_to_np_dtype(elem_type))  # type: ignore[index]
        return name

    def acc(self, kind: str, src: str, axes: Sequence[int], out: str | None = None) -> str:
        shape = self.v.shape(src)
        axes_t = tuple(sorted(axes))
        if self.full is None:
            self.full, self.axes = shape, axes_t
        elif (self.full, self.axes) != (shape, axes_t):
            raise Unsupported(
                f"reductions over different domains in one kernel: {self.full}/{self.axes} "
                f"vs {shape}/{axes_t}"
            )
        reduced = [1 if a in axes_t else d for a, d in enumerate(shape)]
        dst = out or self.v.fresh("_a")
        self._add(dst, reduced, self.v.tensors[src].elem_type)
        self.items.append(Acc(kind, src, dst))
        return dst

    def view(self, src: str, out: str) -> str:
        node = onnx.helper.make_node("Reshape", [src], [out])
        self.v.producer[out] = (node, 0)
        self.items.append(node)
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
        shape = self.v.shape(src)
        return math.prod(shape[a] for a in axes)

    # -- one original node -----------------------------------------------------------------------
    def expand(self, node: onnx.NodeProto) -> None:
        op = node.op_type
        if op not in REDUCTIONS:
            self.items.append(node)
            return
        attrs = attrs_of(node)
        x = node.input[0]
        shape = self.v.shape(x)
        rank = len(shape)
        elem = self.v.tensors[x].elem_type
        if op in ("Softmax", "LogSoftmax"):
            axes = [normalize_axis(int(attrs.get("axis", -1)), rank)]  # type: ignore[call-overload]
            m = self.acc("max", x, axes)
            d = self.node("Sub", [x, m], shape)
            e = self.exp_shifted(d, shape)
            s = self.acc("sum", e, axes)
            if op == "Softmax":
                self.node("Div", [e, s], shape, out=node.output[0])
            else:
                ls = self.node("Log", [s], self.v.shape(s))
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
                self.node("Div", [r, count], self.v.shape(r), out=node.output[0])
            return
        # Reduce*
        if len(node.input) > 1 and node.input[1]:
            axes = self.v.const_ints(node.input[1], f"{op} axes")
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
        final = out if keep or self.v.shape(out) == red_shape else None
        result = self._reduce(op, x, axes, red_shape, elem, final)
        if final is None:
            self.view(result, out)

    def _reduce(
        self, op: str, x: str, axes: list[int], red: tuple[int, ...], elem: int, out: str | None
    ) -> str:
        shape = self.v.shape(x)
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


class _RowGenerator:
    """Writes the passes over each row; run dry first to learn which values to buffer."""

    def __init__(self, v: RowValues, items: list[onnx.NodeProto | Acc], full: tuple[int, ...],
                 axes: tuple[int, ...]) -> None:  # fmt: skip
        self.v = v
        self.items = items
        self.full = full
        self.axes = axes
        self.kept = tuple(a for a in range(len(full)) if a not in axes)
        self.n = math.prod(full[a] for a in axes)
        self.total = math.prod(full)
        if self.n == 0 or self.total == 0:
            raise Unsupported("a reduction over an empty tensor")
        self.outer = self.total // self.n
        self.level: dict[str, int] = {}
        self.accs = [it for it in items if isinstance(it, Acc)]
        for it in items:
            if isinstance(it, Acc):
                self.level[it.dst] = self._level(it.src) + 1
            else:
                lvl = max((self._level(i) for i in it.input if i), default=0)
                for out in it.output:
                    if out:
                        self.level[out] = lvl
        self.accessed: dict[str, set[int]] = {}
        self.buffered: dict[str, Buffer] = {}
        self.stored: dict[str, int] = {}
        self.current_pass = -1
        outputs = v.spec.outputs
        self.passes = (
            max([self._level(a.src) for a in self.accs] + [self._level(t.name) for t in outputs]) + 1
        )
        for t in outputs:
            if t.numel not in (self.total, self.outer):
                raise Unsupported(f"output {t.name} is on neither the full nor the reduced domain")
        self.j = ir.var("j")

    def _level(self, name: str) -> int:
        return self.level.get(name, 0)

    def _is_full(self, name: str) -> bool:
        return math.prod(self.v.shape(name)) == self.total

    def _is_reduced(self, name: str) -> bool:
        return self.n > 1 and math.prod(self.v.shape(name)) == self.outer

    def choose_buffers(self) -> None:
        """Keep a full-domain value in a row buffer when a later pass needs it again and
        recomputing it is costly (exp, erf, ...) or reads 1-byte data (a bool mask): a C compiler
        cannot vectorize a loop that mixes 1-byte loads with SIMD libm calls, so the mask is
        applied once, in the pass without them."""
        moved = self._read_through_moves()
        for name, passes in self.accessed.items():
            if len(passes) < 2 or name not in self.v.producer or name in moved:
                continue
            if self._per_element_cost(name) >= _EXPENSIVE or self._reads_narrow(name, set()):
                self.buffered[name] = self._buffer(name, len(self.buffered))

    def _read_through_moves(self) -> set[str]:
        """Tensors upstream of an index-moving op (Transpose, Slice, Gather, ...): the element a
        row needs at position j is not their element at the row's flat offset, so a row buffer
        (filled and read by j) cannot stand in for them; they are recomputed instead."""
        nodes = {id(n): n for n, _ in self.v.producer.values()}.values()
        stack = [i for n in nodes if lookup(n.op_type).kind == OpKind.INJECTIVE for i in n.input if i]
        seen: set[str] = set()
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            if name in self.v.producer:
                stack.extend(i for i in self.v.producer[name][0].input if i)
        return seen

    def _buffer(self, name: str, k: int) -> Buffer:
        return Buffer(f"b{k}", self.v.dtype(name), self.n, "scratch")

    def _per_element_cost(self, name: str) -> float:
        node = self.v.producer[name][0]
        if node.op_type == EXP_SHIFTED:
            return float(_EXPENSIVE)
        try:
            return float(lookup(node.op_type).flops(NodeShapes([(1,)], [(1,)], [4], [4], {})))
        except Exception:  # a cost function that needs real shapes: treat the op as cheap
            return 0.0

    def _reads_narrow(self, name: str, seen: set[str]) -> bool:
        if name in seen:
            return False
        seen.add(name)
        if name not in self.v.producer:
            return self.v.dtype(name).itemsize == 1 and name not in self.v.constants
        node = self.v.producer[name][0]
        return any(self._reads_narrow(i, seen) for i in node.input if i)

    def _hook(self, name: str) -> Expr | None:
        if name not in self.v.producer or not self._is_full(name) or self._level(name) > self.current_pass:
            return None
        self.accessed.setdefault(name, set()).add(self.current_pass)
        if name in self.buffered and self.stored.get(name, self.current_pass) < self.current_pass:
            return ir.load(self.buffered[name], self.j)
        return None

    def _coords(self, name: str, idx: Sequence[Expr], shape: Sequence[int]) -> list[Expr]:
        own = self.v.shape(name)
        if tuple(own) == tuple(shape):
            return list(idx)
        return self.v.reshape_index(list(idx), shape, own)

    def generate(self) -> list[Stmt]:
        v = self.v
        v.overrides = {}
        v.hook = self._hook
        v.new_scope()
        self.stored = {}
        full, kept, axes = self.full, self.kept, self.axes
        o, j = ir.var("o"), self.j
        o_vars = {a: ir.var(f"o{a}") for a in kept}
        j_vars = {a: ir.var(f"j{a}") for a in axes}
        names_full = [j_vars[a] if a in axes else o_vars[a] for a in range(len(full))]
        kept_dims = tuple(full[a] for a in kept)
        red_dims = tuple(full[a] for a in axes)
        groups = [IndexGroup(tuple(o_vars[a] for a in kept), kept_dims, o),
                  IndexGroup(tuple(j_vars[a] for a in axes), red_dims, j)]  # fmt: skip
        if axes == tuple(range(len(full) - len(axes), len(full))):
            groups.insert(0, IndexGroup(tuple(names_full), full, o * self.n + j))
        v.groups = groups
        row: list[Stmt] = []
        for k, a in enumerate(kept):
            stride = math.prod(kept_dims[k + 1 :])
            expr = o // stride if k == 0 else (o // stride) % full[a]
            row.append(Let(o_vars[a], expr if full[a] != 1 else ir.index(0)))
        bufs = {t.name: buf for t, buf in zip(v.spec.outputs, v.params[len(v.spec.inputs) :], strict=True)}
        reduced_outputs = [t.name for t in v.spec.outputs if self._is_reduced(t.name)]
        full_outputs = [t.name for t in v.spec.outputs if t.name not in reduced_outputs]
        red_coords: list[Expr] = [ir.index(0) if a in axes else o_vars[a] for a in range(len(full))]
        red_shape = tuple(1 if a in axes else d for a, d in enumerate(full))
        for stage in range(self.passes + 1):
            v.new_scope()
            if stage > 0:  # per-row scalars that just became available (reduced-domain nodes)
                for it in self.items:
                    if isinstance(it, Acc):
                        continue
                    for out in it.output:
                        if out and self._level(out) == stage and self._is_reduced(out):
                            value = v.resolve(out, v.reshape_index(red_coords, red_shape, v.shape(out)))
                            var = ir.var(v.fresh("r"), v.dtype(out))
                            row.append(Let(var, value))
                            v.overrides[out] = var
                            v.new_scope()
            for name in reduced_outputs:
                if self._level(name) == stage:
                    row.append(
                        Store(bufs[name], o, v.resolve(name, self._coords(name, red_coords, red_shape)))
                    )
            if stage == self.passes:
                break
            self.current_pass = stage
            accs = [a for a in self.accs if self._level(a.src) == stage]
            writes = [n for n in full_outputs if self._level(n) == stage]
            if not accs and not writes:
                continue
            v.new_scope()
            inner: list[Stmt] = []
            for k, a in enumerate(axes):
                stride = math.prod(red_dims[k + 1 :])
                expr = j // stride if k == 0 else (j // stride) % full[a]
                inner.append(Let(j_vars[a], expr if full[a] != 1 else ir.index(0)))
            reductions: list[tuple[str, ir.Var]] = []
            partials: list[tuple[ir.Var, ir.Var]] = []  # (block partial, row total) of each float sum
            finals: list[tuple[Acc, ir.Var]] = []
            for acc in accs:
                src_type = v.dtype(acc.src)
                total_type = (
                    (DType.F64 if src_type.is_float else DType.I64)
                    if acc.kind in ("sum", "prod")
                    else src_type
                )
                total = ir.var(v.fresh("a"), total_type)
                init = {"sum": 0, "prod": 1, "max": -math.inf, "min": math.inf}[acc.kind]
                if not total_type.is_float and acc.kind in ("max", "min"):
                    info = np.iinfo(src_type.numpy) if src_type is not DType.BOOL else np.iinfo(np.uint8)
                    init = int(info.min if acc.kind == "max" else info.max)
                row.append(Declare(total, ir.const(init, total_type)))
                x = v.resolve(acc.src, names_full)
                if acc.kind == "sum" and src_type.is_float:
                    part = ir.var(v.fresh("s"), DType.F32 if src_type.compute is DType.F32 else total_type)
                    partials.append((part, total))
                    inner.append(Assign(part, part + ir.cast(x, part.dtype)))
                    reductions.append(("sum", part))
                elif acc.kind in ("sum", "prod"):
                    op = "add" if acc.kind == "sum" else "mul"
                    inner.append(Assign(total, ir.binary(op, total, ir.cast(x, total_type))))
                    reductions.append((acc.kind, total))
                else:
                    better = ir.gt(x, total) if acc.kind == "max" else ir.lt(x, total)
                    inner.append(Assign(total, ir.select(better, x, total)))
                    reductions.append((acc.kind, total))
                finals.append((acc, total))
            for name in writes:
                coords = self._coords(name, names_full, full)
                inner.append(Store(bufs[name], v.lin(names_full, full), v.resolve(name, coords)))
            for name, buf in self.buffered.items():
                if name in self.accessed and stage in self.accessed[name] and name not in self.stored:
                    inner.append(Store(buf, j, v.resolve(name, self._coords(name, names_full, full))))
                    self.stored[name] = stage
            block = min(self.n, SUM_BLOCK)
            jb, je = ir.var("jb"), ir.var("je")
            lanes = Loop(j, je, tuple(inner), vector=True, start=jb, reductions=tuple(reductions))
            chunk: list[Stmt] = [Let(je, ir.minimum(jb + block, self.n))]
            chunk += [Declare(part, ir.const(0, part.dtype)) for part, _ in partials]
            chunk.append(lanes)
            chunk += [Assign(total, total + ir.cast(part, total.dtype)) for part, total in partials]
            row.append(Loop(jb, self.n, tuple(chunk), step=block))
            for acc, total in finals:
                res = ir.var(v.fresh("r"), v.dtype(acc.dst))
                row.append(Let(res, ir.cast(total, v.dtype(acc.dst))))
                v.overrides[acc.dst] = res
        v.hook = None
        v.overrides = {}
        v.groups = []
        parallel = self.total > PARALLEL_MIN_ELEMENTS and self.outer > 1
        return [Loop(o, self.outer, tuple(row), parallel=parallel, scratch=tuple(self.buffered.values()))]


def lower_reduction(spec: KernelSpec) -> Kernel:
    """The row kernel of `spec`."""
    v = RowValues(spec)
    b = _Builder(v)
    for node in spec.nodes:
        b.expand(node)
    outputs = [(t.name, buf) for t, buf in zip(spec.outputs, v.params[len(spec.inputs) :], strict=True)]
    if b.full is None or b.axes is None:  # e.g. ReduceSum with noop_with_empty_axes: a copy
        by_shape: dict[tuple[int, ...], list[tuple[str, Buffer]]] = {}
        for name, buf in outputs:
            by_shape.setdefault(v.shape(name), []).append((name, buf))
        body = [s for shape, group in by_shape.items() for s in loop_nest(v, shape, group)]
        return _kernel(spec, v, body, "no reduction left: one loop")
    gen = _RowGenerator(v, b.items, b.full, b.axes)
    gen.generate()
    gen.choose_buffers()
    for _ in range(3):  # a buffered value spares its inputs a second pass: drop buffers now unused
        gen.accessed = {}
        gen.generate()
        keep = [n for n in gen.buffered if len(gen.accessed.get(n, ())) >= 2]
        if len(keep) == len(gen.buffered):
            break
        gen.buffered = {n: gen._buffer(n, k) for k, n in enumerate(keep)}
    body = gen.generate()
    ops = ", ".join(sorted({n.op_type for n in spec.nodes if n.op_type in REDUCTIONS}))
    what = (
        f"row template: {ops} over axes {list(b.axes)} of {list(b.full)}; {gen.passes} pass(es) per row, "
        f"{len(gen.buffered)} row buffer(s)"
    )
    return _kernel(spec, v, body, what)


def _kernel(spec: KernelSpec, v: RowValues, body: list[Stmt], what: str) -> Kernel:
    return Kernel(
        spec.symbol, tuple(v.params), tuple(body), tuple(v.const_buffers.values()), spec.describe(what)
    )
