"""The `reduction` (row) template: reductions over shared axes with fused prologue and epilogue.

The domain is the full shape F of the reductions' input, split into kept axes (the outer loop `o`,
OpenMP-parallel when big enough) and reduced axes (the row `j`). Compound ops are first rewritten
into primitive accumulators (sum, max, min, prod) plus elementwise nodes, e.g.

    Softmax(x)            m = max(x); e = Exp(x - m); s = sum(e); y = e / s
    LayerNormalization    mean = sum(x)/n; d = x - mean; var = sum(d*d)/n; y = d/sqrt(var+eps)*g+b
    ReduceLogSumExp(x)    m = max(x); y = Log(sum(Exp(x - m))) + m

so a decomposed LayerNorm coming from an exporter and the fused op generate the same code. Each
tensor gets a *level*: inputs 0, an accumulator's result one more than its input's level,
everything else the max of its inputs. Pass p over the row runs every accumulator whose input is
at level p and writes every full-domain output at level p; between passes the per-row scalars
(reduced-domain elementwise ops: `var + eps`, `sqrt`) are computed once. Full-domain values are
recomputed in a later pass when cheap and kept in a per-thread row buffer when expensive (exp,
erf, ...), which a dry run of the generator decides. Sums accumulate in double (vectorized with
`omp simd reduction`), which keeps results within fp32 rounding of onnxruntime.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from ....ops import OpKind, lookup
from ....ops.registry import NodeShapes
from ..kernel_spec import KernelSpec
from .common import (
    PARALLEL_MIN_ELEMENTS,
    Block,
    CodegenUnsupported,
    Index,
    IndexGroup,
    KernelEmitter,
    attrs_of,
    c_literal,
    node_rule,
    normalize_axis,
    numel,
    reshape_index,
)

REDUCTIONS = frozenset({
    "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp", "Softmax", "LogSoftmax",
    "LayerNormalization", "GlobalAveragePool", "GlobalMaxPool", "InstanceNormalization",
    "LpNormalization", "MeanVarianceNormalization",
})  # fmt: skip
# Full-domain ops at least this costly (registry flops per element) are buffered, not recomputed.
_EXPENSIVE = 8
# Elements a float partial sum covers before it is added into the double total (8 lanes of 16).
SUM_BLOCK = 128


@dataclass(frozen=True)
class Acc:
    kind: str  # sum | max | min | prod
    src: str
    dst: str


EXP_SHIFTED = "AfExpShifted"  # internal: exp(d) for d = x - max(x) <= 0 (see _Builder.exp_shifted)
_EXP_FLOOR = -87.0  # exp(-87) ~ 1.6e-38, the smallest normal float; libmvec's expf is fast above it


@node_rule(EXP_SHIFTED)
def _exp_shifted(em: KernelEmitter, block: Block, node: onnx.NodeProto, k: int, idx: Index) -> str:
    x = em.value(block, node.input[0], idx)
    out = em.info(node.output[0])
    floor = c_literal(_EXP_FLOOR, out.elem_type)
    zero = c_literal(0.0, out.elem_type)
    if out.elem_type == onnx.TensorProto.FLOAT:
        e = em.declare(block, out.ctype, f"expf(af_clamp_low({x}, {floor}))", "e")
    else:
        e = em.declare(block, out.ctype, f"exp(({x}) < {floor} ? {floor} : ({x}))", "e")
    # A multiply, not a select: with a select gcc proves the clamp useless where the result is
    # kept and calls expf on the raw (masked, slow-path) value.
    one = c_literal(1.0, out.elem_type)
    return f"({e} * (({x}) < {floor} ? {zero} : {one}))"


class _Builder:
    """Rewrites the body into elementwise nodes + accumulators, in topological order."""

    def __init__(self, em: KernelEmitter) -> None:
        self.em = em
        self.items: list[onnx.NodeProto | Acc] = []
        self.full: tuple[int, ...] | None = None
        self.axes: tuple[int, ...] | None = None

    def node(
        self,
        op: str,
        inputs: Sequence[str],
        shape: Sequence[int],
        elem_type: int | None = None,
        out: str | None = None,
        **attrs: object,
    ) -> str:
        out = out or self.em.fresh("_r")
        elem = elem_type if elem_type is not None else self.em.info(inputs[0]).elem_type
        self.em.add_tensor(out, shape, elem)
        node = onnx.helper.make_node(op, list(inputs), [out], **attrs)
        self.em.producer[out] = (node, 0)
        self.items.append(node)
        return out

    def const(self, value: float, elem_type: int) -> str:
        name = self.em.fresh("_k")
        self.em.add_tensor(name, (), elem_type)
        self.em.constants[name] = np.array(value, dtype=onnx.helper.tensor_dtype_to_np_dtype(elem_type))
        return name

    def acc(self, kind: str, src: str, axes: Sequence[int], out: str | None = None) -> str:
        shape = self.em.info(src).shape
        axes_t = tuple(sorted(axes))
        if self.full is None:
            self.full, self.axes = shape, axes_t
        elif (self.full, self.axes) != (shape, axes_t):
            raise CodegenUnsupported(
                f"reductions over different domains in one kernel: {self.full}/{self.axes} vs "
                f"{shape}/{axes_t}"
            )
        reduced = [1 if a in axes_t else d for a, d in enumerate(shape)]
        dst = out or self.em.fresh("_a")
        self.em.add_tensor(dst, reduced, self.em.info(src).elem_type)
        self.items.append(Acc(kind, src, dst))
        return dst

    def view(self, src: str, out: str) -> str:
        node = onnx.helper.make_node("Reshape", [src], [out])
        self.em.producer[out] = (node, 0)
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
        shape = self.em.info(src).shape
        return numel([shape[a] for a in axes])

    # -- one original node -----------------------------------------------------------------------
    def expand(self, node: onnx.NodeProto) -> None:
        op = node.op_type
        if op not in REDUCTIONS:
            self.items.append(node)
            return
        attrs = attrs_of(node)
        x = node.input[0]
        shape = self.em.info(x).shape
        rank = len(shape)
        elem = self.em.info(x).elem_type
        if op in ("Softmax", "LogSoftmax"):
            axes = [normalize_axis(int(attrs.get("axis", -1)), rank)]  # type: ignore[call-overload]
            m = self.acc("max", x, axes)
            d = self.node("Sub", [x, m], shape)
            e = self.exp_shifted(d, shape)
            s = self.acc("sum", e, axes)
            if op == "Softmax":
                self.node("Div", [e, s], shape, out=node.output[0])
            else:
                ls = self.node("Log", [s], self.em.info(s).shape)
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
                self.node(
                    "Div",
                    [r, self.const(float(self.count(x, axes)), elem)],
                    self.em.info(r).shape,
                    out=node.output[0],
                )
            return
        # Reduce*
        if len(node.input) > 1 and node.input[1]:
            axes = self.em.const_ints(node.input[1], f"{op} axes")
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
        final = out if keep or self.em.info(out).shape == red_shape else None
        result = self._reduce(op, x, axes, red_shape, elem, final)
        if final is None:
            self.view(result, out)

    def _reduce(
        self, op: str, x: str, axes: list[int], red: tuple[int, ...], elem: int, out: str | None
    ) -> str:
        shape = self.em.info(x).shape
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
        raise CodegenUnsupported(f"reduction {op}")


def emit_reduction(spec: KernelSpec) -> str:
    """C source for a reduction-template kernel."""
    em = KernelEmitter(spec)
    b = _Builder(em)
    for node in spec.nodes:
        b.expand(node)
    if b.full is None or b.axes is None:  # e.g. ReduceSum with noop_with_empty_axes: a copy
        from .pointwise import loop_nests

        return em.assemble(
            "no reduction left: one loop",
            loop_nests(em, [(t.name, f"out{k}") for k, t in enumerate(spec.outputs)]),
        )
    gen = _RowGenerator(em, b.items, b.full, b.axes)
    gen.generate(dry_run=True)
    gen.choose_buffers()
    for _ in range(3):  # a buffered value spares its inputs a second pass: drop buffers now unused
        gen.accessed = {}
        gen.generate(dry_run=True)
        keep = [n for n in gen.buffered if len(gen.accessed.get(n, ())) >= 2]
        if len(keep) == len(gen.buffered):
            break
        gen.buffered = {n: f"b{k}" for k, n in enumerate(keep)}
    body = gen.generate(dry_run=False)
    ops = ", ".join(sorted({n.op_type for n in spec.nodes if n.op_type in REDUCTIONS}))
    return em.assemble(
        f"row template: {ops} over axes {list(b.axes)} of {list(b.full)}; {gen.passes} pass(es) per row, "
        f"{len(gen.buffered)} row buffer(s)",
        body,
    )


class _RowGenerator:
    def __init__(
        self,
        em: KernelEmitter,
        items: list[onnx.NodeProto | Acc],
        full: tuple[int, ...],
        axes: tuple[int, ...],
    ) -> None:
        self.em = em
        self.items = items
        self.full = full
        self.axes = axes
        self.kept = tuple(a for a in range(len(full)) if a not in axes)
        self.n = numel([full[a] for a in axes])
        self.total = numel(full)
        if self.n == 0 or self.total == 0:
            raise CodegenUnsupported("a reduction over an empty tensor")
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
        self.buffered: dict[str, str] = {}
        self.stored: dict[str, int] = {}
        self.current_pass = -1
        out_levels = [self._level(t.name) for t in em.spec.outputs]
        self.passes = max([self._level(a.src) for a in self.accs] + out_levels) + 1
        for t in em.spec.outputs:
            if t.numel not in (self.total, self.outer):
                raise CodegenUnsupported(f"output {t.name} is on neither the full nor the reduced domain")

    def _level(self, name: str) -> int:
        return self.level.get(name, 0)

    def _is_full(self, name: str) -> bool:
        return self.em.info(name).numel == self.total

    def _is_reduced(self, name: str) -> bool:
        return self.n > 1 and self.em.info(name).numel == self.outer

    def choose_buffers(self) -> None:
        """Keep a full-domain value in a row buffer when a later pass needs it again and
        recomputing it is costly (exp, erf, ...) or reads 1-byte data (a bool mask): gcc cannot
        vectorize a loop that mixes 1-byte loads with SIMD libm calls, so the mask is applied
        once, in the pass without them."""
        moved = self._read_through_moves()
        for name, passes in self.accessed.items():
            if len(passes) < 2 or name not in self.em.producer or name in moved:
                continue
            if self._per_element_cost(name) >= _EXPENSIVE or self._reads_narrow(name, set()):
                self.buffered[name] = f"b{len(self.buffered)}"

    def _read_through_moves(self) -> set[str]:
        """Tensors upstream of an index-moving op (Transpose, Slice, Gather, ...): the element a
        row needs at position j is not their element at the row's flat offset, so a row buffer
        (filled and read by j) cannot stand in for them; they are recomputed instead."""
        nodes = self.em.spec.nodes
        stack = [i for n in nodes if lookup(n.op_type).kind == OpKind.INJECTIVE for i in n.input if i]
        seen: set[str] = set()
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            if name in self.em.producer:
                stack.extend(i for i in self.em.producer[name][0].input if i)
        return seen

    def _per_element_cost(self, name: str) -> float:
        node = self.em.producer[name][0]
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
        if name not in self.em.producer:
            return self.em.info(name).dtype.itemsize == 1 and name not in self.em.constants
        node = self.em.producer[name][0]
        return any(self._reads_narrow(i, seen) for i in node.input if i)

    def _hook(self, name: str, block: Block) -> str | None:
        if name not in self.em.producer or not self._is_full(name) or self._level(name) > self.current_pass:
            return None
        self.accessed.setdefault(name, set()).add(self.current_pass)
        if name in self.buffered and self.stored.get(name, self.current_pass) < self.current_pass:
            return f"{self.buffered[name]}[j]"
        return None

    def _full_index(self) -> Index:
        return [f"j{a}" if a in self.axes else f"o{a}" for a in range(len(self.full))]

    def _reduced_index(self) -> Index:
        return [0 if a in self.axes else f"o{a}" for a in range(len(self.full))]

    def _red_shape(self) -> tuple[int, ...]:
        return tuple(1 if a in self.axes else d for a, d in enumerate(self.full))

    def generate(self, *, dry_run: bool) -> list[str]:
        em = self.em
        em.overrides = {}
        em.hooks = [self._hook]
        self.stored = {}
        full, kept, axes = self.full, self.kept, self.axes
        names_full = tuple(self._full_index())
        names_kept = tuple(f"o{a}" for a in kept)
        names_red = tuple(f"j{a}" for a in axes)
        kept_dims = tuple(full[a] for a in kept)
        red_dims = tuple(full[a] for a in axes)
        trailing = axes == tuple(range(len(full) - len(axes), len(full)))
        em.groups = [IndexGroup(names_kept, kept_dims, "o"), IndexGroup(names_red, red_dims, "j")]
        if trailing:
            em.groups.insert(0, IndexGroup(names_full, full, f"(o * {self.n} + j)"))
        outer = Block(indent=2)
        for k, a in enumerate(kept):
            stride = numel(kept_dims[k + 1 :])
            expr = "o" if stride == 1 else f"o / {stride}"
            if k > 0:
                expr = f"({expr}) % {full[a]}"
            outer.emit(f"const int64_t o{a} = {expr};" if full[a] != 1 else f"const int64_t o{a} = 0;")
        ptr = {t.name: f"out{k}" for k, t in enumerate(em.spec.outputs)}
        reduced_outputs = [t.name for t in em.spec.outputs if self._is_reduced(t.name)]
        full_outputs = [t.name for t in em.spec.outputs if t.name not in reduced_outputs]
        red_coords = self._reduced_index()
        red_shape = self._red_shape()
        for stage in range(self.passes + 1):
            # Per-row scalars that just became available (reduced-domain nodes of this level).
            if stage > 0:
                for it in self.items:
                    if isinstance(it, Acc):
                        continue
                    for out in it.output:
                        if out and self._level(out) == stage and self._is_reduced(out):
                            idx = reshape_index(em, outer, red_coords, red_shape, em.info(out).shape)
                            var = em.value(outer, out, idx)
                            em.overrides[out] = var
            for name in reduced_outputs:
                if self._level(name) == stage:
                    outer.emit(
                        f"{ptr[name]}[o] = "
                        f"{em.value(outer, name, self._coords(name, red_coords, red_shape))};"
                    )
            if stage == self.passes:
                break
            self.current_pass = stage
            accs = [a for a in self.accs if self._level(a.src) == stage]
            writes = [n for n in full_outputs if self._level(n) == stage]
            if not accs and not writes:
                continue
            inner = Block(indent=3, parent=outer)
            for k, a in enumerate(axes):
                stride = numel(red_dims[k + 1 :])
                expr = "j" if stride == 1 else f"j / {stride}"
                if k > 0:
                    expr = f"({expr}) % {full[a]}"
                inner.emit(f"const int64_t j{a} = {expr};" if full[a] != 1 else f"const int64_t j{a} = 0;")
            clauses = []
            finals = []
            partials = []  # (float partial, double total) of each sum
            for acc in accs:
                var = em.fresh("a")
                ctype = "double" if acc.kind in ("sum", "prod") else em.info(acc.src).ctype
                init = {"sum": "0.0", "prod": "1.0", "max": "-INFINITY", "min": "INFINITY"}[acc.kind]
                outer.emit(f"{ctype} {var} = {init};")
                v = em.value(inner, acc.src, list(names_full))
                if acc.kind == "sum":
                    part = em.fresh("s")
                    partials.append((part, var))
                    inner.emit(f"{part} += {v};")
                    clauses.append(f"reduction(+:{part})")
                elif acc.kind == "prod":
                    inner.emit(f"{var} *= (double)({v});")
                    clauses.append(f"reduction(*:{var})")
                else:
                    cmp = ">" if acc.kind == "max" else "<"
                    inner.emit(f"{var} = ({v}) {cmp} {var} ? ({v}) : {var};")
                    clauses.append(f"reduction({acc.kind}:{var})")
                finals.append((acc, var))
            for name in writes:
                v = em.value(inner, name, self._coords(name, list(names_full), full))
                inner.emit(f"{ptr[name]}[{em.lin(list(names_full), full)}] = {v};")
            for name, buf in self.buffered.items():
                if name in self.accessed and stage in self.accessed[name] and name not in self.stored:
                    v = em.value(inner, name, self._coords(name, list(names_full), full))
                    inner.emit(f"{buf}[j] = {v};")
                    self.stored[name] = stage
            # Sums run in blocks: float lanes inside a block (vectorizes even next to 1-byte
            # masks and libm calls), blocks added in double, so a long row stays accurate.
            block = min(self.n, SUM_BLOCK)
            outer.emit(f"for (int64_t jb = 0; jb < {self.n}; jb += {block}) {{")
            outer.emit(f"  const int64_t je = jb + {block} < {self.n} ? jb + {block} : {self.n};")
            for part, _ in partials:
                outer.emit(f"  float {part} = 0.0f;")
            outer.emit(f"  #pragma omp simd {' '.join(clauses)}".rstrip())
            outer.emit("  for (int64_t j = jb; j < je; ++j) {")
            outer.extend(Block(indent=0, lines=["  " + line for line in inner.lines]))
            outer.emit("  }")
            for part, total in partials:
                outer.emit(f"  {total} += (double){part};")
            outer.emit("}")
            for acc, var in finals:
                info = em.info(acc.dst)
                res = em.fresh("r")
                outer.emit(f"const {info.ctype} {res} = ({info.ctype}){var};")
                em.overrides[acc.dst] = res
        em.hooks = []
        em.groups = []
        em.overrides = {}
        if dry_run:
            return []
        return self._frame(outer)

    def _coords(self, name: str, idx: Index, shape: Sequence[int]) -> Index:
        info = self.em.info(name)
        if tuple(info.shape) == tuple(shape):
            return idx
        scratch = Block(indent=0)
        mapped = reshape_index(self.em, scratch, idx, shape, info.shape)
        if scratch.lines:
            raise CodegenUnsupported(f"{name} is a reshaped view of the row domain")
        return mapped

    def _frame(self, outer: Block) -> list[str]:
        parallel = self.total > PARALLEL_MIN_ELEMENTS and self.outer > 1
        lines = ["  #pragma omp parallel" if parallel else "", "  {"]
        for name, buf in self.buffered.items():
            ctype = self.em.info(name).ctype
            lines.append(f"    {ctype} *{buf} = ({ctype} *)malloc(sizeof({ctype}) * {self.n});")
        if parallel:
            lines.append("    #pragma omp for schedule(static)")
        lines.append(f"    for (int64_t o = 0; o < {self.outer}; ++o) {{")
        lines.extend("  " + line for line in outer.lines)
        lines.append("    }")
        for buf in self.buffered.values():
            lines.append(f"    free({buf});")
        lines.append("  }")
        return [line for line in lines if line]
