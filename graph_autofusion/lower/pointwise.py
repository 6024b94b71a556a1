"""The `pointwise` template as kernel IR: elementwise, broadcast and injective ops in one loop nest.

Every output is computed at each point of its own index space by inlining its producers through
their index rules (values.py), so a Transpose → Add → Relu chain reads each input element once
and writes each output element once. Outputs of the same shape share one loop nest (and so their
common subexpressions); outputs of another shape (Split) get a nest of their own.

Loop shape: all dims but the last are flattened into one outer loop `o` (parallel when the nest
has more than PARALLEL_MIN_ELEMENTS points), the last dim is an inner loop marked `vector` over
unit-stride outputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from ..backend.cpu.kernel_spec import KernelSpec, TensorInfo
from ..kernel_ir import Buffer, DType, Expr, Kernel, Let, Loop, Stmt, Store, TensorAt
from ..kernel_ir import nodes as ir
from ..ops import OpKind, lookup
from .values import IndexGroup, Unsupported, Values

# Work (output elements) above which a kernel runs its outer loop on the thread team. Below it a
# fork/join (~0.5-0.8 us, far more on a busy machine) costs more than it saves (DESIGN.md §1).
PARALLEL_MIN_ELEMENTS = 32 * 1024


class KernelValues(Values):
    """Values of one kernel spec, resolved down to loads of its parameters and constants."""

    def __init__(self, spec: KernelSpec) -> None:
        tensors: dict[str, TensorInfo] = dict(spec.tensors)
        super().__init__(tensors, {k: np.asarray(v) for k, v in spec.constants.items()})
        self.spec = spec
        self.producer = {o: (n, k) for n in spec.nodes for k, o in enumerate(n.output) if o}
        self.params: list[Buffer] = []
        self.buffers: dict[str, Buffer] = {}
        for k, t in enumerate(spec.inputs):
            buf = Buffer(f"in{k}", DType.from_onnx(t.elem_type), t.numel, "input")
            self.params.append(buf)
            self.buffers.setdefault(t.name, buf)
        for k, t in enumerate(spec.outputs):
            self.params.append(Buffer(f"out{k}", DType.from_onnx(t.elem_type), t.numel, "output"))
        self.const_buffers: dict[str, tuple[Buffer, np.ndarray]] = {}
        self._memo: dict[Expr, Expr] = {}

    def coalesce(self) -> None:
        """Merge adjacent dims that every tensor of a broadcast-only kernel treats alike.

        With only elementwise/broadcast ops, dims a-1 and a can become one when each tensor (right
        aligned) has both of them full or both of size 1: `x[1,64,56,56] + b[1,64,1,1]` then runs
        as `[64, 3136] + [64, 1]`, whose inner loop is long and unit-stride. Row-major order makes
        the result identical.
        """
        spec = self.spec
        shapes = {t.shape for t in spec.outputs}
        if len(shapes) != 1 or not spec.nodes:
            return
        for node in spec.nodes:
            opdef = lookup(node.op_type)
            if node.op_type != "Identity" and (
                opdef.kind not in (OpKind.ELEMENTWISE, OpKind.BROADCAST) or opdef.scalar is None
            ):
                return
        out = next(iter(shapes))
        rank = len(out)
        if rank < 2:
            return
        names = {n for node in spec.nodes for n in (*node.input, *node.output) if n}
        names |= {t.name for t in (*spec.inputs, *spec.outputs)}
        padded = {}
        for name in names:
            shape = self.shape(name)
            if len(shape) > rank:
                return
            padded[name] = (1,) * (rank - len(shape)) + tuple(shape)
        groups: list[list[int]] = [[0]]
        for a in range(1, rank):
            # Compare with the group's last dim of size > 1: a size-1 dim is both "1" and "full"
            # for every tensor, so chaining through it would merge a broadcast dim with a full one.
            prev = next((d for d in reversed(groups[-1]) if out[d] != 1), None)
            ok = prev is None or all(
                (p[prev] == 1 and p[a] == 1) or (p[prev] == out[prev] and p[a] == out[a])
                for p in padded.values()
            )
            if ok or out[a] == 1:
                groups[-1].append(a)
            else:
                groups.append([a])
        if len(groups) == rank:
            return
        merged_shapes = {}
        for name, p in padded.items():
            merged = tuple(math.prod(p[a] for a in g) for g in groups)
            if math.prod(merged) != math.prod(self.shape(name)):  # a size-1 dim merged with a broadcast one
                return
            merged_shapes[name] = merged
        tensors = dict(self.tensors)
        for name, merged in merged_shapes.items():
            tensors[name] = TensorInfo(name, merged, self.tensors[name].elem_type)
        self.tensors = tensors

    def new_scope(self) -> None:
        """Forget resolved values: a new loop nest gives `o` and `i0`... another meaning."""
        self._memo = {}

    def resolve(self, name: str, idx: Sequence[Expr]) -> Expr:
        """Tensor `name` at `idx` with every inlinable producer substituted."""
        return self._substitute(self.at(name, list(idx)))

    def _substitute(self, e: Expr) -> Expr:
        return ir.substitute(e, self._leaf, self._memo)

    def _leaf(self, at: TensorAt) -> Expr | None:
        name, idx = at.tensor, list(at.index)
        if name in self.producer:
            node, k = self.producer[name]
            return self._substitute(self.produce(node, k, idx))
        return ir.load(self.buffer_of(name), self.lin(idx, self.shape(name)))

    def buffer_of(self, name: str) -> Buffer:
        """The parameter holding input `name`, else a constant table of its compile-time value."""
        if name in self.buffers:
            return self.buffers[name]
        if name in self.constants:
            if name not in self.const_buffers:
                values = self.constants[name]
                buf = Buffer(
                    f"{self.spec.symbol}_k{len(self.const_buffers)}", self.dtype(name), values.size, "const"
                )
                self.const_buffers[name] = (buf, values)
            return self.const_buffers[name][0]
        raise Unsupported(f"tensor {name!r} is neither an input, a constant nor computed here")


def loop_nest(
    values: KernelValues, shape: tuple[int, ...], outputs: Sequence[tuple[str, Buffer]]
) -> list[Stmt]:
    """One loop nest writing each (tensor, buffer) pair at every point of `shape`."""
    total = math.prod(shape)
    if total == 0:
        return []
    if not shape:
        return [Store(buf, ir.index(0), values.resolve(name, [])) for name, buf in outputs]
    parallel = total > PARALLEL_MIN_ELEMENTS
    rank = len(shape)
    inner, outer = shape[-1], math.prod(shape[:-1])
    o = ir.var("o")
    names = tuple(ir.var(f"i{a}") for a in range(rank))
    values.new_scope()
    values.groups = [
        IndexGroup(names, tuple(shape), o * inner + names[-1] if outer > 1 else names[-1]),
        IndexGroup(names[:-1], tuple(shape[:-1]), o),
    ]
    lets: list[Stmt] = []
    for a in range(rank - 1):
        stride = math.prod(shape[a + 1 : -1])
        expr = o // stride if a == 0 else (o // stride) % shape[a]
        lets.append(Let(names[a], expr if shape[a] != 1 else ir.index(0)))
    values.clean, values.assume = {}, {}

    def row_stores() -> tuple[Stmt, ...]:
        values.new_scope()
        return tuple(
            Store(buf, values.lin(list(names), shape), values.resolve(name, list(names)))
            for name, buf in outputs
        )

    stores = row_stores()
    if outer > 1 or not parallel:
        return [
            Loop(
                o,
                outer,
                (*lets, *_split_row(values, names[-1], inner, stores, row_stores)),
                parallel=parallel,
            )
        ]
    # one long row: split the row itself across the team
    row = Loop(names[-1], inner, tuple(stores), parallel=True, vector=True)
    return [Let(o, ir.index(0)), *lets, row]


def _split_row(
    values: KernelValues,
    var: ir.Var,
    stop: int,
    stores: tuple[Stmt, ...],
    again: Callable[[], tuple[Stmt, ...]],
) -> list[Stmt]:
    """The row loop over `var`; split into head, interior and tail when an index rule said its
    value simplifies while `var` stays in a range (a pooling window inside the input: constant
    bounds, no clamps, a loop the compiler unrolls and vectorizes)."""
    lo, hi = values.clean.get(var, (0, stop))
    lo, hi = max(lo, 0), min(hi, stop)
    if hi - lo < 2 or (lo, hi) == (0, stop):
        if (lo, hi) == (0, stop) and var in values.clean:
            values.assume = {var: (0, stop)}
            stores = again()
            values.assume = {}
        return [Loop(var, stop, stores, vector=True)]
    values.assume = {var: (lo, hi)}
    interior = again()
    values.assume = {}
    parts = [Loop(var, lo, stores, vector=True)] if lo > 0 else []
    parts.append(Loop(var, hi, interior, vector=True, start=lo))
    if hi < stop:
        parts.append(Loop(var, stop, stores, vector=True, start=hi))
    return parts


def lower_pointwise(spec: KernelSpec, description: str = "") -> Kernel:
    """The pointwise kernel of `spec` (also pooling and single ops whose rules fold an axis)."""
    values = KernelValues(spec)
    values.coalesce()
    by_shape: dict[tuple[int, ...], list[tuple[str, Buffer]]] = {}
    out_params = values.params[len(spec.inputs) :]
    for t, buf in zip(spec.outputs, out_params, strict=True):
        by_shape.setdefault(values.shape(t.name), []).append((t.name, buf))
    body: list[Stmt] = []
    for shape, group in by_shape.items():
        body.extend(loop_nest(values, shape, group))
    what = description or "one loop over the output index space, producers inlined"
    return Kernel(
        spec.symbol,
        tuple(values.params),
        tuple(body),
        tuple(values.const_buffers.values()),
        spec.describe(what),
    )
