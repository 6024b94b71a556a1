"""A tensor's value at a multi-index, as a kernel-IR expression: the index rules of every op that
can be inlined into a loop nest.

`Values.at(name, idx)` names a tensor at an index (a `TensorAt` leaf, or a literal for a scalar
constant). `Values.produce(node, k, idx)` is the value of output `k` of `node` at `idx` in terms of
its inputs' values: elementwise and broadcast ops apply the registry's IR formula to
broadcast-mapped arguments; injective ops map the index (Transpose permutes it, Slice scales and
shifts it, Concat selects the input whose range holds it, ...). Lowering substitutes the
`TensorAt` leaves until only loads of kernel inputs and constants remain.

Index expressions are int64 IR expressions. `Values.lin` linearizes a multi-index against a
shape and recognises loop variables that decompose one linear index (`IndexGroup`), so a
contiguous access becomes `in0[o * 56 + i3]` instead of a four-term sum: that keeps the inner loop
visibly unit-stride for the vectorizer.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import onnx

from ..kernel_ir import DType, Expr
from ..kernel_ir import nodes as ir
from ..ops import OpKind, lookup


class Unsupported(Exception):
    """A kernel is outside what lowering handles; the runtime then runs the kernel's nodes as
    host ops (listed with this reason), never silently."""


Index = list[Expr]
Rule = Callable[["Values", onnx.NodeProto, int, Index], Expr]
_RULES: dict[str, Rule] = {}


def index_rule(*op_types: str) -> Callable[[Rule], Rule]:
    """Register how an op's output value at an index is computed from its inputs' values."""

    def register(fn: Rule) -> Rule:
        for op in op_types:
            _RULES[op] = fn
        return fn

    return register


def has_rule(op_type: str) -> bool:
    """Can lowering inline this op into a loop nest?"""
    opdef = lookup(op_type)
    return op_type in _RULES or (
        opdef.kind in (OpKind.ELEMENTWISE, OpKind.BROADCAST) and opdef.scalar is not None
    )


@dataclass(frozen=True)
class IndexGroup:
    """Loop variables `names` that decompose the linear index `expr` over `dims`."""

    names: tuple[Expr, ...]
    dims: tuple[int, ...]
    expr: Expr


def attrs_of(node: onnx.NodeProto) -> dict[str, object]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def normalize_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise Unsupported(f"axis {axis} out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def broadcast_index(idx: Sequence[Expr], out_shape: Sequence[int], in_shape: Sequence[int]) -> Index:
    """Numpy broadcasting: right-align, size-1 input dims read index 0."""
    offset = len(out_shape) - len(in_shape)
    if offset < 0:
        raise Unsupported(f"cannot broadcast {tuple(in_shape)} to {tuple(out_shape)}")
    return [ir.index(0) if int(d) == 1 else idx[offset + a] for a, d in enumerate(in_shape)]


class TensorLike(Protocol):
    shape: tuple[int, ...]
    elem_type: int  # onnx.TensorProto.DataType


class Values:
    """What the index rules read: shapes, element types and compile-time constants by tensor name.

    The dicts are shared with the caller (generators add tensors as they go), not copied.
    """

    def __init__(self, tensors: Mapping[str, TensorLike], constants: Mapping[str, np.ndarray]) -> None:
        self.tensors = tensors
        self.constants = constants
        self.groups: list[IndexGroup] = []
        # Loop splitting (lower/pointwise.py): a rule whose expression simplifies when a loop
        # variable stays in [lo, hi) (a pooling window that needs no clamping) reports the range
        # in `clean`; a loop nest that then runs that range separately puts it in `assume`.
        self.clean: dict[Expr, tuple[int, int]] = {}
        self.assume: dict[Expr, tuple[int, int]] = {}

    def is_clean(self, var: Expr, lo: int, hi: int) -> bool:
        """Whether `var` is assumed inside [lo, hi); if not, report [lo, hi) as worth a split."""
        known = self.assume.get(var)
        if known is not None:
            return lo <= known[0] and known[1] <= hi
        if isinstance(var, ir.Var) and lo < hi:
            prev = self.clean.get(var, (lo, hi))
            self.clean[var] = (max(prev[0], lo), min(prev[1], hi))
        return False

    def shape(self, name: str) -> tuple[int, ...]:
        try:
            return self.tensors[name].shape
        except KeyError:
            raise Unsupported(f"no shape known for tensor {name!r}") from None

    def dtype(self, name: str) -> DType:
        try:
            return DType.from_onnx(self.tensors[name].elem_type)
        except KeyError:
            raise Unsupported(f"no element type known for tensor {name!r}") from None
        except ValueError as exc:
            raise Unsupported(str(exc)) from None

    def constant(self, name: str) -> np.ndarray | None:
        return self.constants.get(name)

    def const_ints(self, name: str, what: str) -> list[int]:
        """The values of an integer input that must be known at compile time (shape, axes)."""
        value = self.constants.get(name)
        if value is None:
            raise Unsupported(f"{what} ({name!r}) is not a compile-time constant")
        return [int(v) for v in np.asarray(value).reshape(-1)]

    def at(self, name: str, idx: Sequence[Expr | int]) -> Expr:
        """Tensor `name` at `idx` (in its own shape); a scalar constant is its literal."""
        const = self.constants.get(name)
        if const is not None and const.size == 1:
            return ir.const(const.reshape(-1)[0].item(), self.dtype(name))
        return ir.tensor_at(name, [ir.index(e) for e in idx], self.dtype(name))

    def produce(self, node: onnx.NodeProto, k: int, idx: Index) -> Expr:
        """Output `k` of `node` at `idx`, in terms of its inputs' values."""
        rule = _RULES.get(node.op_type)
        if rule is None:
            if not has_rule(node.op_type):
                raise Unsupported(f"no index rule for {node.op_type} inside a kernel")
            rule = _elementwise
        try:
            return rule(self, node, k, idx)
        except (TypeError, ValueError, KeyError) as exc:  # attribute/type combinations not handled
            raise Unsupported(f"{node.op_type}: {exc}") from exc

    def lin(self, idx: Sequence[Expr], shape: Sequence[int]) -> Expr:
        """Row-major linear offset of `idx` in `shape`, using declared index groups."""
        items: list[tuple[Expr, int]] = [(e, int(d)) for e, d in zip(idx, shape, strict=True)]
        changed = True
        while changed:
            changed = False
            for group in self.groups:
                n = len(group.names)
                if n == 0 or n > len(items):
                    continue
                for start in range(len(items) - n + 1):
                    window = items[start : start + n]
                    if (
                        all(a is b for (a, _), b in zip(window, group.names, strict=True))
                        and tuple(d for _, d in window) == group.dims
                        and not (n == 1 and window[0][0] is group.expr)
                    ):
                        items[start : start + n] = [(group.expr, math.prod(group.dims))]
                        changed = True
                        break
                if changed:
                    break
        offset: Expr = ir.index(0)
        stride = 1
        for e, d in reversed(items):
            if d != 1:
                offset = e * stride + offset
            stride *= d
        return offset

    def reshape_index(self, idx: Sequence[Expr], out_shape: Sequence[int], in_shape: Sequence[int]) -> Index:
        """Map an index of a reshaped tensor back to its source (same row-major order).

        Dims are matched in groups of equal size products (768 = 12 x 64 maps `i` to
        `(i / 64, i % 64)`; (12, 64) -> 768 maps to `i * 64 + j`), so only the dims a reshape
        really splits or merges pay for a division, and an unchanged inner dim keeps its stride.
        """
        outs = [(e, int(d)) for e, d in zip(idx, out_shape, strict=True) if int(d) != 1]
        ins = [(a, int(d)) for a, d in enumerate(in_shape) if int(d) != 1]
        result: Index = [ir.index(0)] * len(in_shape)
        i = j = 0
        while i < len(outs) or j < len(ins):
            group_out = [outs[i]] if i < len(outs) else []
            group_in = [ins[j]] if j < len(ins) else []
            i, j = i + len(group_out), j + len(group_in)
            po = math.prod(d for _, d in group_out)
            pi = math.prod(d for _, d in group_in)
            while po != pi:
                if po < pi and i < len(outs):
                    group_out.append(outs[i])
                    po *= outs[i][1]
                    i += 1
                elif pi < po and j < len(ins):
                    group_in.append(ins[j])
                    pi *= ins[j][1]
                    j += 1
                else:  # cannot happen when numel agrees
                    raise Unsupported(f"cannot reshape {tuple(out_shape)} to {tuple(in_shape)}")
            if len(group_in) == 1 and len(group_out) == 1:
                result[group_in[0][0]] = group_out[0][0]
                continue
            flat = self.lin([e for e, _ in group_out], [d for _, d in group_out])
            sizes = [d for _, d in group_in]
            for n, (axis, d) in enumerate(group_in):
                stride = math.prod(sizes[n + 1 :])
                q = flat // stride
                result[axis] = q if n == 0 else q % d
        return result


# -- elementwise / broadcast -----------------------------------------------------------------------


def _elementwise(v: Values, node: onnx.NodeProto, k: int, idx: Index) -> Expr:
    """The registry's IR formula on broadcast-mapped arguments, in the output's element type."""
    opdef = lookup(node.op_type)
    assert opdef.scalar is not None
    out_shape = v.shape(node.output[0])
    args = [v.at(n, broadcast_index(idx, out_shape, v.shape(n))) if n else None for n in node.input]
    expr = opdef.scalar(args, attrs_of(node))
    return ir.cast(expr, v.dtype(node.output[0]))


@index_rule("BatchNormalization")
def _batchnorm(v: Values, node: onnx.NodeProto, k: int, idx: Index) -> Expr:
    if k != 0:
        raise Unsupported("BatchNormalization in training mode")
    eps = float(attrs_of(node).get("epsilon", 1e-5))  # type: ignore[arg-type]
    c = idx[1] if len(idx) > 1 else ir.index(0)
    x = v.at(node.input[0], idx)
    scale, bias, mean, var = (v.at(n, [c]) for n in node.input[1:5])
    return (x - mean) / ir.unary("sqrt", var + ir.const(eps, x.dtype)) * scale + bias


# -- views: same elements, another shape ----------------------------------------------------------


@index_rule("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def _view(v: Values, node: onnx.NodeProto, k: int, idx: Index) -> Expr:
    src = node.input[0]
    return v.at(src, v.reshape_index(idx, v.shape(node.output[0]), v.shape(src)))


@index_rule("Identity", "Dropout")
def _identity(v: Values, node: onnx.NodeProto, k: int, idx: Index) -> Expr:
    if k != 0:
        return ir.const(1, DType.BOOL)  # Dropout's mask in inference: every element kept
    return v.at(node.input[0], idx)


# -- injective ops ---------------------------------------------------------------------------------


@index_rule("Transpose")
def _transpose(v: Values, node: onnx.NodeProto, k: int, idx: Index) -> Expr:
    rank = len(idx)
    perm = list(attrs_of(node).get("perm") or range(rank - 1, -1, -1))  # type: ignore[call-overload]
    src: Index = [ir.index(0)] * rank
    for j, p in enumerate(perm):
        src[int(p)] = idx[j]
    return v.at(node.input[0], src)


@index_rule("Expand")
def _expand(v: Values, node: onnx.NodeProto, k: int, idx: Index) -> Expr:
    return v.at(node.input[0], broadcast_index(idx, v.shape(node.output[0]), v.shape(node.input[0])))


@index_rule("Tile")
def _tile(v: Values, node: onnx.NodeProto, k: int, idx: Index) -> Expr:
    shape = v.shape(node.input[0])
    src: Index = []
    for e, d, od in zip(idx, shape, v.shape(node.output[0]), strict=True):
        src.append(e if d == od else (ir.index(0) if d == 1 else e % d))
    return v.at(node.input[0], src)


def _slice_params(v: Values, node: onnx.NodeProto) -> tuple[list[int], list[int]]:
    """Effective (start, step) per axis of a Slice (ONNX clamping rules)."""
    in_shape = v.shape(node.input[0])
    rank = len(in_shape)
    attrs = attrs_of(node)
    if len(node.input) > 1:
        starts = v.const_ints(node.input[1], "Slice starts")
        axes = v.const_ints(node.input[3], "Slice axes") if len(node.input) > 3 and node.input[3] else None
        steps = v.const_ints(node.input[4], "Slice steps") if len(node.input) > 4 and node.input[4] else None
    else:  # opset < 10
        starts = [int(x) for x in attrs["starts"]]  # type: ignore[union-attr]
        axes = [int(x) for x in attrs.get("axes", [])] or None  # type: ignore[union-attr]
        steps = None
    axes = axes if axes is not None else list(range(len(starts)))
    steps = steps if steps is not None else [1] * len(starts)
    first = [0] * rank
    step = [1] * rank
    for s, a, st in zip(starts, axes, steps, strict=True):
        a = normalize_axis(a, rank)
        d = in_shape[a]  # the output shape (known) already encodes where the slice ends
        if s < 0:
            s += d
        s = max(0, min(s, d)) if st > 0 else max(0, min(s, d - 1))
        first[a], step[a] = s, st
    return first, step


@index_rule("Slice")
def _slice(v: Values, node: onnx.NodeProto, k: int, idx: Index) -> Expr:
    first, step = _slice_params(v, node)
    return v.at(node.input[0], [e * st + s for e, s, st in zip(idx, first, step, strict=True)])


@index_rule("Split")
def _split(v: Values, node: onnx.NodeProto, k: int, idx: Index) -> Expr:
    axis = normalize_axis(int(attrs_of(node).get("axis", 0)), len(idx))  # type: ignore[call-overload]
    offset = sum(v.shape(out)[axis] for out in node.output[:k])
    src = list(idx)
    src[axis] = idx[axis] + offset
    return v.at(node.input[0], src)


@index_rule("Concat")
def _concat(v: Values, node: onnx.NodeProto, k: int, idx: Index) -> Expr:
    axis = normalize_axis(int(attrs_of(node)["axis"]), len(idx))  # type: ignore[call-overload]
    parts = [(name, v.shape(name)[axis]) for name in node.input if name and v.shape(name)[axis] > 0]
    at = idx[axis]
    choices: list[tuple[int, Expr]] = []  # (end of the part's range, its value)
    offset = 0
    for name, size in parts:
        src = list(idx)
        src[axis] = at - offset
        if isinstance(at, ir.Const) and offset <= at.value < offset + size:
            return v.at(name, src)  # the branch is known at generation time
        choices.append((offset + size, v.at(name, src)))
        offset += size
    if len(choices) == 1:
        return choices[0][1]
    value = choices[-1][1]
    for end, part in reversed(choices[:-1]):
        value = ir.select(ir.lt(at, end), part, value, guarded=True)
    return value


def _index_value(v: Values, name: str, idx: Sequence[Expr], dim: int) -> Expr:
    """An index tensor's value at idx, wrapped if negative and clamped into [0, dim)."""
    raw = ir.cast(v.at(name, idx), DType.I64)
    if isinstance(raw, ir.Const):
        return ir.index(raw.value + dim if raw.value < 0 else raw.value)
    wrapped = ir.select(ir.lt(raw, 0), raw + dim, raw)
    return ir.clamp(wrapped, 0, dim - 1)


@index_rule("Gather")
def _gather(v: Values, node: onnx.NodeProto, k: int, idx: Index) -> Expr:
    data = v.shape(node.input[0])
    q = len(v.shape(node.input[1]))
    axis = normalize_axis(int(attrs_of(node).get("axis", 0)), len(data))  # type: ignore[call-overload]
    at = _index_value(v, node.input[1], idx[axis : axis + q], data[axis])
    return v.at(node.input[0], [*idx[:axis], at, *idx[axis + q :]])


@index_rule("GatherElements")
def _gather_elements(v: Values, node: onnx.NodeProto, k: int, idx: Index) -> Expr:
    data = v.shape(node.input[0])
    axis = normalize_axis(int(attrs_of(node).get("axis", 0)), len(data))  # type: ignore[call-overload]
    src = list(idx)
    src[axis] = _index_value(v, node.input[1], idx, data[axis])
    return v.at(node.input[0], src)


@index_rule("Pad")
def _pad(v: Values, node: onnx.NodeProto, k: int, idx: Index) -> Expr:
    attrs = attrs_of(node)
    in_shape = v.shape(node.input[0])
    out_shape = v.shape(node.output[0])
    rank = len(idx)
    mode = attrs.get("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if len(node.input) > 1 and node.input[1]:
        pads = v.const_ints(node.input[1], "Pad pads")
        has_axes = len(node.input) > 3 and node.input[3]
        axes = v.const_ints(node.input[3], "Pad axes") if has_axes else list(range(rank))
    else:
        pads = [int(x) for x in attrs.get("pads", [])]  # type: ignore[union-attr]
        axes = list(range(rank))
    begin = [0] * rank
    for j, a in enumerate(axes):
        begin[normalize_axis(a, rank)] = pads[j]
    dtype = v.dtype(node.output[0])
    fill: Expr = ir.const(0, dtype)
    if mode == "constant" and len(node.input) > 2 and node.input[2]:
        # A scalar, or a one-element tensor (as Attention's expansion writes it): its only element.
        fill = v.at(node.input[2], [0] * len(v.shape(node.input[2])))
    elif mode == "constant" and "value" in attrs:
        fill = ir.const(float(attrs["value"]), dtype)  # type: ignore[arg-type]
    src: Index = []
    inside: Expr = ir.const(1, DType.BOOL)
    for a, (e, b, d) in enumerate(zip(idx, begin, in_shape, strict=True)):
        j = e - b
        if mode == "constant":
            if b or out_shape[a] != d:
                inside = ir.logical_and(inside, ir.logical_and(ir.ge(j, 0), ir.lt(j, d)))
            src.append(j)
        elif mode == "edge":
            src.append(ir.clamp(j, 0, d - 1))
        elif mode == "reflect":
            r = ir.select(ir.lt(j, 0), -j, j)
            src.append(ir.select(ir.ge(r, d), 2 * (d - 1) - r, r))
        else:
            raise Unsupported(f"Pad mode {mode!r}")
    return ir.select(inside, v.at(node.input[0], src), fill, guarded=True)


@index_rule("Trilu")
def _trilu(v: Values, node: onnx.NodeProto, k: int, idx: Index) -> Expr:
    upper = int(attrs_of(node).get("upper", 1))  # type: ignore[call-overload]
    shift = v.const_ints(node.input[1], "Trilu k")[0] if len(node.input) > 1 and node.input[1] else 0
    diff = idx[-1] - idx[-2]
    keep = ir.ge(diff, shift) if upper else ir.le(diff, shift)
    return ir.select(keep, v.at(node.input[0], idx), 0)


@index_rule("ReverseSequence")
def _reverse_sequence(v: Values, node: onnx.NodeProto, k: int, idx: Index) -> Expr:
    """out[.., t, ..] = x[.., len-1-t, ..] for t < len (len = sequence_lens[batch]), else x[.., t, ..].

    The lengths are data (read per element), clamped into [0, steps] so a bad length never reads
    outside the tensor.
    """
    attrs = attrs_of(node)
    batch = int(attrs.get("batch_axis", 1))  # type: ignore[call-overload]
    time = int(attrs.get("time_axis", 0))  # type: ignore[call-overload]
    steps = v.shape(node.input[0])[time]
    n = ir.clamp(ir.cast(v.at(node.input[1], [idx[batch]]), DType.I64), 0, steps)
    src = list(idx)
    src[time] = ir.select(ir.lt(idx[time], n), n - 1 - idx[time], idx[time])
    return v.at(node.input[0], src)


@index_rule("DepthToSpace")
def _depth_to_space(v: Values, node: onnx.NodeProto, k: int, idx: Index) -> Expr:
    attrs = attrs_of(node)
    b = int(attrs["blocksize"])  # type: ignore[call-overload]
    mode = attrs.get("mode", b"DCR")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    c_out = v.shape(node.output[0])[1]
    n, c, h, w = idx
    i, j = h % b, w % b
    channel = (i * b + j) * c_out + c if mode == "DCR" else c * (b * b) + i * b + j
    return v.at(node.input[0], [n, channel, h // b, w // b])


@index_rule("SpaceToDepth")
def _space_to_depth(v: Values, node: onnx.NodeProto, k: int, idx: Index) -> Expr:
    attrs = attrs_of(node)
    b = int(attrs["blocksize"])  # type: ignore[call-overload]
    mode = attrs.get("mode", b"DCR")
    c_in = v.shape(node.input[0])[1]
    n, c, h, w = idx
    if mode in (b"CRD", "CRD"):
        ij, ch = c % (b * b), c // (b * b)
    else:
        ij, ch = c // c_in, c % c_in
    return v.at(node.input[0], [n, ch, h * b + ij // b, w * b + ij % b])


# -- ops that walk a window or an axis per output element: folds -------------------------------


def _loop_var(node: onnx.NodeProto, what: str) -> Expr:
    """A fold variable named after the node (deterministic: the source text is a cache key)."""
    return ir.var(f"{what}_{zlib.crc32(node.output[0].encode()) & 0xFFFF:04x}")


def _pool_pads(node: onnx.NodeProto, in_sp: list[int], out_sp: list[int], kernel: list[int],
               strides: list[int], dil: list[int]) -> tuple[list[int], list[int]]:  # fmt: skip
    attrs = attrs_of(node)
    nd = len(kernel)
    auto = attrs.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else str(auto)
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        head, tail = [], []
        for i in range(nd):
            total = max(0, (out_sp[i] - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1 - in_sp[i])
            small = total // 2
            h = small if auto == "SAME_UPPER" else total - small
            head.append(h)
            tail.append(total - h)
        return head, tail
    if auto == "VALID":
        return [0] * nd, [0] * nd
    pads = [int(p) for p in attrs.get("pads", [0] * (2 * nd))]  # type: ignore[union-attr]
    return pads[:nd], pads[nd:]


def _max_window_clamps(size: int, out: int, kernel: int, stride: int, dil: int, head: int) -> bool:
    """Whether a max window on this axis may read its positions clamped into the input: undilated
    (every input position between two of the window's is one of its own), and every output's
    window holding at least one input position (the first output's and the last one's are the
    extremes), so that a clamped position always lands on one the window holds."""
    last = (out - 1) * stride - head
    return dil == 1 and kernel - 1 - head >= 0 and last <= size - 1


@index_rule("MaxPool", "AveragePool", "LpPool")
def _pool(v: Values, node: onnx.NodeProto, k: int, idx: Index) -> Expr:
    """One pooled element: a fold over the part of its window inside the input (pads, strides,
    dilations; ceil_mode is in the static output shape). The window's range is clamped to the
    input per axis, so no position is tested; MaxPool's undilated axes instead read the whole
    window with each position clamped into the input (`_max_window_clamps`). AveragePool divides
    by the positions inside the input, or with count_include_pad inside the padded input
    (positions only ceil_mode added never count, as in onnxruntime); LpPool sums |x|^p in
    double, then takes the p-th root."""
    if k != 0:
        raise Unsupported(f"{node.op_type} indices output")
    attrs = attrs_of(node)
    x_shape, out_shape = v.shape(node.input[0]), v.shape(node.output[0])
    nd = len(x_shape) - 2
    kernel = [int(a) for a in attrs["kernel_shape"]]  # type: ignore[union-attr]
    strides = [int(a) for a in attrs.get("strides", [1] * nd)]  # type: ignore[union-attr]
    dil = [int(a) for a in attrs.get("dilations", [1] * nd)]  # type: ignore[union-attr]
    in_sp, out_sp = list(x_shape[2:]), list(out_shape[2:])
    head, tail = _pool_pads(node, in_sp, out_sp, kernel, strides, dil)
    p = int(attrs.get("p", 2))  # type: ignore[call-overload]
    if node.op_type == "LpPool" and p < 1:
        raise Unsupported(f"LpPool with p={p}")
    ws = [_loop_var(node, f"w{d}") for d in range(nd)]
    first = [idx[2 + d] * strides[d] - head[d] for d in range(nd)]
    # first + w*dil in [0, limit) for w in [lo, hi): C's division truncates toward zero, so a
    # negative numerator clamps to 0 through the max/min
    lo = [ir.maximum(0, (dil[d] - 1 - first[d]) // dil[d]) for d in range(nd)]
    hi = [ir.minimum(kernel[d], (in_sp[d] - first[d] + dil[d] - 1) // dil[d]) for d in range(nd)]
    for d in range(nd):
        # Outputs whose whole window lies inside the input: no clamping, a constant trip count.
        inside = (
            -(-head[d] // strides[d]),
            (in_sp[d] - 1 - (kernel[d] - 1) * dil[d] + head[d]) // strides[d] + 1,
        )
        if v.is_clean(idx[2 + d], *inside):
            lo[d], hi[d] = ir.index(0), ir.index(kernel[d])
    pos = [first[d] + ws[d] * dil[d] for d in range(nd)]
    if node.op_type == "MaxPool":
        for d in range(nd):
            if _max_window_clamps(in_sp[d], out_sp[d], kernel[d], strides[d], dil[d], head[d]) and not (
                isinstance(lo[d], ir.Const) and isinstance(hi[d], ir.Const)
            ):
                # the whole window, each position clamped into the input: a clamped position is a
                # copy of a position the window does hold, which leaves the max as it is, and the
                # fold's constant trip count lets the loop over the output vectorize (clamped
                # bounds left ResNet-50's 3x3/2 MaxPool a scalar loop, 2.5x OpenVINO's time)
                lo[d], hi[d] = ir.index(0), ir.index(kernel[d])
                pos[d] = ir.clamp(first[d] + ws[d], 0, in_sp[d] - 1)
    dtype = v.dtype(node.input[0])
    x = v.at(node.input[0], [idx[0], idx[1], *pos])
    if node.op_type == "MaxPool":
        value, op = x, "max"
    elif node.op_type == "LpPool":
        xd = ir.unary("abs", ir.cast(x, DType.F64))
        value, op = {1: xd, 2: xd * xd}.get(p, ir.binary("pow", xd, float(p))), "sum"
    else:
        value, op = ir.cast(x, DType.F64), "sum"
    for d in reversed(range(nd)):
        value = ir.fold(op, ws[d], lo[d], hi[d], value)
    if node.op_type == "MaxPool":
        return value
    if node.op_type == "LpPool":
        root = {1: value, 2: ir.unary("sqrt", value)}.get(p, ir.binary("pow", value, 1.0 / p))
        return ir.cast(root, dtype)
    count: Expr = ir.index(1)
    for d in range(nd):
        if int(attrs.get("count_include_pad", 0)):  # type: ignore[call-overload]
            padded = in_sp[d] + tail[d] + head[d]  # positions from -head up to in + tail
            count = count * ir.minimum(kernel[d], (padded - first[d] - head[d] + dil[d] - 1) // dil[d])
        else:
            count = count * ir.maximum(hi[d] - lo[d], 0)
    return ir.cast(value / ir.cast(ir.maximum(count, 1), DType.F64), dtype)


@index_rule("ArgMax", "ArgMin")
def _arg(v: Values, node: onnx.NodeProto, k: int, idx: Index) -> Expr:
    attrs = attrs_of(node)
    shape = v.shape(node.input[0])
    axis = normalize_axis(int(attrs.get("axis", 0)), len(shape))  # type: ignore[call-overload]
    r = _loop_var(node, "r")
    src = list(idx)
    if int(attrs.get("keepdims", 1)):  # type: ignore[call-overload]
        src[axis] = r
    else:
        src.insert(axis, r)
    op = node.op_type.lower() + ("_last" if int(attrs.get("select_last_index", 0)) else "")  # type: ignore[call-overload]
    return ir.fold(op, r, 0, shape[axis], v.at(node.input[0], src))  # type: ignore[arg-type]


@index_rule("CumSum")
def _cumsum(v: Values, node: onnx.NodeProto, k: int, idx: Index) -> Expr:
    """The prefix sum in the same sequential order as onnxruntime, so results agree to the bit."""
    attrs = attrs_of(node)
    shape = v.shape(node.input[0])
    axis = normalize_axis(v.const_ints(node.input[1], "CumSum axis")[0], len(shape))
    exclusive = int(attrs.get("exclusive", 0))  # type: ignore[call-overload]
    here = idx[axis]
    r = _loop_var(node, "r")
    src = list(idx)
    src[axis] = r
    value = v.at(node.input[0], src)
    if int(attrs.get("reverse", 0)):  # type: ignore[call-overload]
        return ir.fold("sum", r, shape[axis] - 1, here if exclusive else here - 1, value, step=-1)  # type: ignore[arg-type]
    return ir.fold("sum", r, 0, here if exclusive else here + 1, value)  # type: ignore[arg-type]
