"""`AttentionMatch`: scaled dot-product attention as one kernel, decided once for every backend.

    match = match_attention(spec)   # raises Unsupported with the sentence saying why not

The body a group must hold (as exporters write eager attention)::

    q = views(Q_src)                  [B, H, Sq, D]   head split: Reshape/Transpose/Slice/Squeeze
    kt = views(K_src)                 [B, H, D, Sk]   K^T folded into strides, never copied
    v = views(V_src)                  [B, H, Sk, Dv]
    s = MatMul(q, kt)  [Mul|Div by constant]*  [Add mask | Where(cond, s, fill)]*  (any order
        of the two masks, scaling before them)
    p = Softmax(s, axis=-1)
    o = MatMul(p, v)   [Transpose(0,2,1,3)] [Reshape]*   -> the kernel's one output

A constant scalar Mul/Div on q or k (the scale folded into the operands, as SDPA exports do)
joins the scale. The operand views become (offset, strides) of the kernel input, so a kernel
reads Q/K/V where the projection wrote them; the output view becomes the strides at which
`o[b, h, i, d]` lands in the output buffer. A Where condition that is a constant
lower-triangular matrix (keep key j where j <= i + offset) is `causal`: a kernel then skips the
key blocks above the diagonal instead of reading a mask.

The planner builds the spec a group would become (`group_spec`) and asks this function, so a
group it accepts as `attention` always renders: legality is "the match succeeds". Backends call
it again on the fused model's function body (docs/fused-format.md), the form that travels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx

from ..backend.cpu.kernel_spec import KernelSpec
from ..layout import reshape_strides, slice_window, split_sizes
from ..lower.values import Unsupported, attrs_of

# Ops an operand's or the output's view chain may hold: they move no data (strides and an offset).
VIEW_CHAIN_OPS = frozenset(
    {"Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Slice", "Split"}
)
SCALE_OPS = frozenset({"Mul", "Div"})
# A masked score at or below this makes exp(score - max) exactly 0 in fp32 next to any unmasked
# score of a real model (|score| << 1e4), so a causal kernel may skip the block instead.
SKIPPABLE_FILL = -1e4


@dataclass(frozen=True)
class View:
    """A 4-D `[B, H, rows, cols]` view of kernel tensor `tensor`: element `offset` and `strides`
    (0 along a broadcast axis)."""

    tensor: str
    shape: tuple[int, int, int, int]
    strides: tuple[int, int, int, int]
    offset: int = 0


@dataclass(frozen=True)
class AttentionMatch:
    """softmax(scale * q k^T (+ mask) (where cond)) v for every (b, h), written through `out`.

    `k` is the key as `[B, H, Sk, D]` (its K^T operand's strides swapped back). `mask` is an
    additive score term, `cond` a keep-mask read through strides (`keep_if`: Where keeps the score
    where cond is true), replaced by `causal = offset` when it is a constant triangle."""

    q: View
    k: View
    v: View
    out: View
    scale: float = 1.0
    mask: View | None = None
    cond: View | None = None
    keep_if: bool = True
    fill: float = 0.0
    causal: int | None = None
    where_first: bool = False  # Where applied before the additive mask
    constants: dict[str, np.ndarray] = field(default_factory=dict, compare=False)

    @property
    def batch(self) -> int:
        return self.out.shape[0]

    @property
    def heads(self) -> int:
        return self.out.shape[1]

    @property
    def seq_q(self) -> int:
        return self.q.shape[2]

    @property
    def seq_k(self) -> int:
        return self.k.shape[2]

    @property
    def head_dim(self) -> int:
        return self.q.shape[3]

    @property
    def value_dim(self) -> int:
        return self.v.shape[3]

    @property
    def skips_blocks(self) -> bool:
        """Whether key blocks wholly above the causal diagonal may be skipped."""
        return self.causal is not None and self.fill <= SKIPPABLE_FILL

    def tables(self, inputs: Sequence[str]) -> list[tuple[str, np.ndarray]]:
        """The masks that are body constants, not among the kernel's `inputs`: each a table the
        kernel carries (name, values)."""
        views = [v for v in (self.mask, self.cond) if v is not None]
        return [(v.tensor, self.constants[v.tensor]) for v in views if v.tensor not in inputs]


def match_attention(spec: KernelSpec) -> AttentionMatch:
    """The attention kernel `spec` forms; raises `Unsupported` saying why it forms none."""
    return _Matcher(spec).run()


def looks_like_attention(op_types: Sequence[str]) -> bool:
    """Whether a body has attention's signature (two MatMuls and a Softmax): the planner then
    classifies it by `match_attention` alone."""
    return list(op_types).count("MatMul") == 2 and list(op_types).count("Softmax") == 1


class _Matcher:
    def __init__(self, spec: KernelSpec) -> None:
        self.spec = spec
        self.producer: dict[str, onnx.NodeProto] = {o: n for n in spec.nodes for o in n.output if o}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for n in spec.nodes:
            for x in n.input:
                if x:
                    self.consumers.setdefault(x, []).append(n)
        self.inputs = {t.name for t in spec.inputs}
        self.outputs = {t.name for t in spec.outputs}
        self.used: set[int] = set()  # ids of the nodes the match accounts for

    # -- helpers ---------------------------------------------------------------------------
    def shape(self, name: str) -> tuple[int, ...]:
        info = self.spec.tensors.get(name)
        if info is None:
            raise Unsupported(f"no shape known for tensor {name!r}")
        return tuple(info.shape)

    def const(self, name: str) -> np.ndarray | None:
        if name in self.spec.constants:
            return np.asarray(self.spec.constants[name])
        return None

    def scalar(self, name: str) -> float | None:
        value = self.const(name)
        return float(value.reshape(-1)[0]) if value is not None and value.size == 1 else None

    def ints(self, node: onnx.NodeProto, slot: int) -> list[int] | None:
        if len(node.input) <= slot or not node.input[slot]:
            return None
        value = self.const(node.input[slot])
        if value is None:
            raise Unsupported(f"{node.op_type} '{node.name}' input {slot} is not a compile-time constant")
        return [int(v) for v in value.reshape(-1)]

    def sole_reader(self, value: str) -> onnx.NodeProto | None:
        readers = self.consumers.get(value, [])
        return readers[0] if len(readers) == 1 and value not in self.outputs else None

    def internal(self, value: str) -> None:
        if value in self.outputs:
            raise Unsupported(f"intermediate {value!r} of the attention leaves the kernel")
        if len(self.consumers.get(value, [])) != 1:
            raise Unsupported(f"intermediate {value!r} of the attention has other readers")

    def fp32(self, name: str) -> None:
        info = self.spec.tensors.get(name)
        if info is None or info.elem_type != onnx.TensorProto.FLOAT:
            raise Unsupported(f"{name!r} is not fp32: attention kernels are fp32")

    # -- the match -------------------------------------------------------------------------
    def run(self) -> AttentionMatch:
        nodes = self.spec.nodes
        softmaxes = [n for n in nodes if n.op_type == "Softmax"]
        matmuls = [n for n in nodes if n.op_type == "MatMul"]
        if len(softmaxes) != 1 or len(matmuls) != 2:
            raise Unsupported("attention needs exactly one Softmax between two MatMuls")
        sm = softmaxes[0]
        rank = len(self.shape(sm.input[0]))
        axis = int(attrs_of(sm).get("axis", -1))  # type: ignore[call-overload]
        if axis % max(rank, 1) != rank - 1:
            raise Unsupported(f"Softmax '{sm.name}' does not normalize the last axis")
        self.used.add(id(sm))
        self.fp32(sm.input[0])
        second = self.sole_reader(sm.output[0])
        if second is None or second.op_type != "MatMul" or second.input[0] != sm.output[0]:
            raise Unsupported(f"Softmax '{sm.name}' does not feed the second MatMul's left operand")
        self.used.add(id(second))
        scale, mask, cond, keep_if, fill, where_first, first = self._scores(sm.input[0])
        if first.op_type != "MatMul" or first is second:
            raise Unsupported("the scores do not come from a MatMul")
        self.used.add(id(first))
        q, q_scale = self._operand(first.input[0])
        kt, k_scale = self._operand(first.input[1])
        v, v_scale = self._operand(second.input[1])
        if v_scale != 1.0:
            raise Unsupported("a scale on V is not folded")
        k = View(kt.tensor, (kt.shape[0], kt.shape[1], kt.shape[3], kt.shape[2]),
                 (kt.strides[0], kt.strides[1], kt.strides[3], kt.strides[2]), kt.offset)  # fmt: skip
        out = self._output(second.output[0])
        b, h, sq, dv = out.shape
        d, sk = q.shape[3], k.shape[2]
        if q.shape[2] != sq or k.shape[3] != d or v.shape[2] != sk or v.shape[3] != dv:
            raise Unsupported(f"attention operand shapes disagree: q {q.shape}, k {k.shape}, v {v.shape}")
        q, k, v = (self._broadcast(x, b, h) for x in (q, k, v))
        if mask is not None:
            mask = self._score_view(mask, (b, h, sq, sk))
        causal = None
        cond_view = None
        if cond is not None:
            causal = self._causal(cond, sq, sk, keep_if)
            if causal is None:
                cond_view = self._score_view(cond, (b, h, sq, sk))
        unused = [n for n in nodes if id(n) not in self.used]
        if unused:
            n = unused[0]
            raise Unsupported(f"{n.op_type} '{n.name}' is not part of the attention")
        if len(self.spec.outputs) != 1:
            raise Unsupported("an attention kernel has one output")
        return AttentionMatch(
            q=q, k=k, v=v, out=out, scale=scale * q_scale * k_scale, mask=mask, cond=cond_view,
            keep_if=keep_if, fill=fill, causal=causal, where_first=where_first,
            constants={n: np.asarray(c) for n, c in self.spec.constants.items()},
        )  # fmt: skip

    def _scores(self, value: str):  # type: ignore[no-untyped-def]
        """Walk from the Softmax input back to the first MatMul through scale and mask ops."""
        scale = 1.0
        mask: str | None = None
        cond: str | None = None
        keep_if, fill, where_first = True, 0.0, False
        seen_scale = False  # walking backwards: a mask met after a scale comes before it
        while True:
            node = self.producer.get(value)
            if node is None:
                raise Unsupported("the Softmax input is not computed inside the kernel")
            if node.op_type == "MatMul":
                self.internal(value)
                return scale, mask, cond, keep_if, fill, where_first, node
            self.internal(value)
            self.used.add(id(node))
            if node.op_type in SCALE_OPS:
                a, k = self._scaled(node)
                if k is None or a not in self.producer:
                    raise Unsupported(f"{node.op_type} '{node.name}' on the scores is not a constant scale")
                scale *= k if node.op_type == "Mul" else 1.0 / k
                value, seen_scale = a, True
            elif node.op_type == "Add" and mask is None:
                a, m = node.input
                if m in self.producer:
                    a, m = m, a
                if m in self.producer or a not in self.producer:
                    raise Unsupported(f"Add '{node.name}' mask is computed inside the kernel")
                if seen_scale:
                    raise Unsupported(f"Add '{node.name}' masks the scores before they are scaled")
                mask, value = m, a
                self.fp32(m)
            elif node.op_type == "Where" and cond is None:
                if seen_scale:
                    raise Unsupported(f"Where '{node.name}' masks the scores before they are scaled")
                c, x, y = node.input
                if x in self.producer and self.scalar(y) is not None:
                    keep_if, fill, value = True, float(self.scalar(y)), x  # type: ignore[arg-type]
                elif y in self.producer and self.scalar(x) is not None:
                    keep_if, fill, value = False, float(self.scalar(x)), y  # type: ignore[arg-type]
                else:
                    raise Unsupported(f"Where '{node.name}' does not pick between the scores and a constant")
                if c in self.producer:
                    raise Unsupported(f"Where '{node.name}' condition is computed inside the kernel")
                cond = c
                where_first = mask is not None  # the Add, met first walking back, runs after it
            else:
                raise Unsupported(f"{node.op_type} '{node.name}' between the MatMul and the Softmax")

    def _scaled(self, node: onnx.NodeProto) -> tuple[str, float | None]:
        """(x, k) for a Mul/Div `node` computing x * k or x / k, k a constant scalar (None when
        neither operand is one). Mul's constant may be either operand."""
        a, c = node.input[0], node.input[1]
        k = self.scalar(c)
        if k is None and node.op_type == "Mul":
            a, k = c, self.scalar(a)
        return a, k

    def _operand(self, value: str) -> tuple[View, float]:
        """The view chain from a kernel input to a MatMul operand, and any scale on it."""
        chain: list[tuple[onnx.NodeProto, str]] = []
        scale = 1.0
        while value not in self.inputs:
            node = self.producer.get(value)
            if node is None:
                raise Unsupported(f"operand {value!r} is neither a kernel input nor computed inside")
            self.internal(value)
            self.used.add(id(node))
            if node.op_type in SCALE_OPS:
                value, k = self._scaled(node)
                if k is None:
                    raise Unsupported(f"{node.op_type} '{node.name}' on an operand is not a constant scale")
                scale *= k if node.op_type == "Mul" else 1.0 / k
                continue
            if node.op_type not in VIEW_CHAIN_OPS:
                raise Unsupported(f"{node.op_type} '{node.name}' before a MatMul would need a copy")
            chain.append((node, value))
            value = node.input[0]
        self.fp32(value)
        shape = list(self.shape(value))
        strides = _dense(shape)
        offset = 0
        for node, out in reversed(chain):
            out_shape = list(self.shape(out))
            if node.op_type == "Transpose":
                perm = attrs_of(node).get("perm") or list(reversed(range(len(shape))))
                shape = [shape[int(p)] for p in perm]  # type: ignore[union-attr]
                strides = [strides[int(p)] for p in perm]  # type: ignore[union-attr]
            elif node.op_type in ("Slice", "Split"):
                begin = self._window(node, out, shape)
                offset += sum(b * s for b, s in zip(begin, strides, strict=True))
                shape = out_shape
            else:
                new = reshape_strides(shape, strides, out_shape)
                if new is None:
                    raise Unsupported(f"{node.op_type} '{node.name}' on an operand would need a copy")
                shape, strides = out_shape, list(new)
        return _view4("operands", value, shape, strides, offset), scale

    def _window(self, node: onnx.NodeProto, value: str, shape: list[int]) -> list[int]:
        rank = len(shape)
        if node.op_type == "Split":
            axis = int(attrs_of(node).get("axis", 0)) % max(rank, 1)  # type: ignore[call-overload]
            sizes = split_sizes(shape[axis], len(node.output), self.ints(node, 1))
            if sizes is None:
                raise Unsupported(f"Split '{node.name}' sizes do not cover its axis")
            k = list(node.output).index(value)
            begin = [0] * rank
            begin[axis] = sum(sizes[:k])
            return begin
        starts, ends = self.ints(node, 1), self.ints(node, 2)
        axes, steps = self.ints(node, 3), self.ints(node, 4)
        window = slice_window(shape, starts or [], ends or [], axes, steps) if starts and ends else None
        if window is None:
            raise Unsupported(f"Slice '{node.name}' is not a constant step-1 window")
        return list(window[0])

    def _output(self, value: str) -> View:
        """Strides at which o[b, h, i, d] lands in the kernel's output, through its view chain."""
        chain: list[onnx.NodeProto] = []
        while value not in self.outputs:
            node = self.sole_reader(value)
            if node is None or node.op_type not in VIEW_CHAIN_OPS - {"Slice", "Split"}:
                raise Unsupported("the attention output reaches the kernel's output through more than views")
            self.used.add(id(node))
            chain.append(node)
            value = node.output[0]
        if self.consumers.get(value):
            raise Unsupported(f"output {value!r} is also read inside the kernel")
        shape = list(self.shape(value))
        strides = _dense(shape)
        for node in reversed(chain):
            src = list(self.shape(node.input[0]))
            if node.op_type == "Transpose":
                perm = [int(p) for p in attrs_of(node).get("perm") or reversed(range(len(src)))]  # type: ignore[union-attr]
                back = [0] * len(src)
                for a, p in enumerate(perm):
                    back[p] = strides[a]
                shape, strides = src, back
            else:
                new = reshape_strides(shape, strides, src)
                if new is None:
                    raise Unsupported(f"{node.op_type} '{node.name}' after attention would need a copy")
                shape, strides = src, list(new)
        return _view4("output", value, shape, strides)

    @staticmethod
    def _broadcast(view: View, b: int, h: int) -> View:
        """The operand over the output's (B, H), stride 0 where it broadcasts."""
        shape, strides = list(view.shape), list(view.strides)
        for axis, want in ((0, b), (1, h)):
            if shape[axis] == want:
                continue
            if shape[axis] != 1:
                raise Unsupported(f"operand {view.tensor!r} batch dims {view.shape[:2]} vs output {(b, h)}")
            shape[axis], strides[axis] = want, 0
        return View(view.tensor, tuple(shape), tuple(strides), view.offset)  # type: ignore[arg-type]

    def _score_view(self, name: str, full: tuple[int, int, int, int]) -> View:
        """A mask over the scores `[B, H, Sq, Sk]` read through broadcast strides: a kernel input,
        or a constant the export inlined into the body (a kernel then holds it as a table)."""
        if name not in self.inputs and self.const(name) is None:
            raise Unsupported(f"mask {name!r} is neither a kernel input nor a constant")
        shape = list(self.shape(name))
        if len(shape) > 4:
            raise Unsupported(f"mask {name!r} of rank {len(shape)}")
        shape = [1] * (4 - len(shape)) + shape
        dense = _dense(shape)
        strides = []
        for axis in range(4):
            if shape[axis] == full[axis]:
                strides.append(dense[axis] if full[axis] > 1 else 0)
            elif shape[axis] == 1:
                strides.append(0)
            else:
                raise Unsupported(f"mask {name!r} {shape} does not broadcast to the scores {list(full)}")
        return View(name, full, tuple(strides))  # type: ignore[arg-type]

    def _causal(self, cond: str, sq: int, sk: int, keep_if: bool) -> int | None:
        """The offset o when the constant `cond` keeps exactly the keys j <= i + o of query i."""
        value = self.const(cond)
        if value is None or value.ndim < 2 or math.prod(value.shape[:-2]) != 1:
            return None
        if tuple(value.shape[-2:]) != (sq, sk):
            return None
        keep = value.reshape(sq, sk).astype(bool)
        if not keep_if:
            keep = ~keep
        for offset in dict.fromkeys((sk - sq, 0)):
            if offset >= 0 and np.array_equal(keep, np.tri(sq, sk, offset, dtype=bool)):
                return offset
        return None


def _dense(shape: Sequence[int]) -> list[int]:
    """The strides of a contiguous (row-major) tensor of `shape`."""
    return [math.prod(shape[i + 1 :]) for i in range(len(shape))]


def _view4(what: str, tensor: str, shape: list[int], strides: list[int], offset: int = 0) -> View:
    """`tensor` as a `[B, H, rows, cols]` view: leading axes of size 1 (stride 0) up to rank 4."""
    if len(shape) < 2 or len(shape) > 4:
        raise Unsupported(f"attention {what} of rank {len(shape)}")
    pad = 4 - len(shape)
    return View(tensor, tuple([1] * pad + shape), tuple([0] * pad + strides), offset)  # type: ignore[arg-type]


__all__ = ["AttentionMatch", "View", "looks_like_attention", "match_attention"]
