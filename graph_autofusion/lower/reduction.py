"""The `reduction` (row) template as kernel IR: reductions over shared axes with fused prologue
and epilogue.

What the kernel computes is its `ReductionMatch` (plan/reduction_match.py, the planner's test of
legality too): accumulators and elementwise nodes over one domain F, split into kept axes (the
outer loop `o`, parallel when big enough) and reduced axes (the row `j`). Each
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

import numpy as np
import onnx

from ..backend.cpu.kernel_spec import KernelSpec
from ..kernel_ir import Assign, Buffer, Declare, DType, Expr, Kernel, Let, Loop, Stmt, Store, TensorAt
from ..kernel_ir import nodes as ir
from ..ops import OpKind, lookup
from ..ops.registry import NodeShapes
from ..plan.reduction_match import EXP_SHIFTED, REDUCTIONS, Acc, ReductionMatch, match_reduction
from .pointwise import PARALLEL_MIN_ELEMENTS, KernelValues, loop_nest
from .values import Index, IndexGroup, Values, index_rule

# Full-domain ops at least this costly (registry flops per element) are buffered, not recomputed.
_EXPENSIVE = 8
# Elements a float partial sum covers before it is added into the double total (8 lanes of 16).
SUM_BLOCK = 128

_EXP_FLOOR = -87.0  # exp(-87) ~ 1.6e-38, the smallest normal float; vector expf is fast above it


@index_rule(EXP_SHIFTED)
def _exp_shifted(v: Values, node: onnx.NodeProto, k: int, idx: Index) -> Expr:
    x = v.at(node.input[0], idx)
    floor = ir.const(_EXP_FLOOR, x.dtype)
    # A multiply, not a select: with a select the C compiler proves the clamp useless where the
    # result is kept and calls expf on the raw (masked, slow-path) value.
    keep = ir.select(ir.lt(x, floor), ir.const(0.0, x.dtype), ir.const(1.0, x.dtype))
    return ir.unary("exp", ir.select(ir.lt(x, floor), floor, x)) * keep


class RowValues(KernelValues):
    """Values of a row kernel: the match's nodes and tensors, per-row scalars by name once
    computed, buffered row values."""

    def __init__(self, spec: KernelSpec, match: ReductionMatch) -> None:
        super().__init__(spec)
        self.tensors = dict(match.tensors)
        self.constants = dict(match.constants)
        self.producer = {
            o: (it, k) for it in match.items if not isinstance(it, Acc) for k, o in enumerate(it.output) if o
        }
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


class _RowGenerator:
    """Writes the passes over each row; run dry first to learn which values to buffer."""

    def __init__(self, v: RowValues, match: ReductionMatch) -> None:
        assert match.full is not None and match.axes is not None
        self.v = v
        self.items = match.items
        self.full = full = match.full
        self.axes = axes = match.axes
        self.kept = tuple(a for a in range(len(full)) if a not in axes)
        self.n = match.inner
        self.total = math.prod(full)
        self.outer = match.outer
        self.level: dict[str, int] = {}
        self.accs = [it for it in self.items if isinstance(it, Acc)]
        for it in self.items:
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
                x = v.resolve(acc.src, self._coords(acc.src, names_full, full))
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


def lower_reduction(spec: KernelSpec, match: ReductionMatch | None = None) -> Kernel:
    """The row kernel of `spec`, from its match (`match_reduction(spec)` when not given)."""
    match = match if match is not None else match_reduction(spec)
    v = RowValues(spec, match)
    outputs = [(t.name, buf) for t, buf in zip(spec.outputs, v.params[len(spec.inputs) :], strict=True)]
    if match.full is None or match.axes is None:  # e.g. ReduceSum with noop_with_empty_axes: a copy
        by_shape: dict[tuple[int, ...], list[tuple[str, Buffer]]] = {}
        for name, buf in outputs:
            by_shape.setdefault(v.shape(name), []).append((name, buf))
        body = [s for shape, group in by_shape.items() for s in loop_nest(v, shape, group)]
        return _kernel(spec, v, body, "no reduction left: one loop")
    gen = _RowGenerator(v, match)
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
        f"row template: {ops} over axes {list(match.axes)} of {list(match.full)}; {gen.passes} pass(es) "
        f"per row, {len(gen.buffered)} row buffer(s)"
    )
    return _kernel(spec, v, body, what)


def _kernel(spec: KernelSpec, v: RowValues, body: list[Stmt], what: str) -> Kernel:
    return Kernel(
        spec.symbol, tuple(v.params), tuple(body), tuple(v.const_buffers.values()), spec.describe(what)
    )
