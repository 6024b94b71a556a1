"""Anchor kernels for the Triton targets: MatMul / Gemm / Conv as a tiled `tl.dot` with the fused
prologue and epilogue.

Every contraction is one GEMM shape: `Y[b, m, n] = sum_k A[b, m, k] * B[b, k, n]` over batch
`b`. MatMul is that directly (numpy batch broadcasting); Gemm adds transposes, alpha and beta*C;
Conv is an *implicit* GEMM — rows m = (image, oh, ow), columns n = output channels of a group,
k = (input channel, kh, kw), groups as the batch — whose A element is the input pixel under the
window (zero in the padding, a guarded read), so no im2col buffer exists.

The group around the contraction comes from the kernel spec through a small matcher
(`match_contraction`) that stays local to this backend until the planner hands over a typed
anchor match. Prologue ops (views, transposes on A or B) are not matched at all: A's and B's
elements are *resolved* through the lowering's index rules (lower/values.py), so any chain of
index-moving ops ahead of the contraction is read in place. The epilogue is every output's value
at the contraction's own element (bias, activations, residual adds), with the accumulator tile
standing for Y; output tails that only move data (Reshape, Transpose, ...) become the store
address. A group that needs Y at another element, two contractions (an anchor chain), or 1-D
MatMul operands is refused with that reason.

Tiles: CUDA BM x BN x BK up to 64 x 64 x 32; Ascend multiples of the 16 x 16 cube fractal, shrunk
until the block's working set fits the Unified Buffer. fp32 operands multiply with
`input_precision="ieee"` on CUDA (TF32 would break the verification tolerance); fp16/bf16
operands multiply in their type; the accumulator is fp32 throughout.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import onnx

from ...hardware import HardwareProfile
from ...kernel_ir import DType, Expr, Kernel, Store, TensorAt
from ...kernel_ir import nodes as ir
from ...lower.pointwise import KernelValues
from ...lower.values import Unsupported, attrs_of, broadcast_index
from ..cpu.kernel_spec import KernelSpec
from .blocks import is_ascend
from .prelude import PRELUDE
from .render import Block, FunctionRenderer, KernelRenderer, Launch, RenderedKernel

CONTRACTIONS = ("MatMul", "Gemm", "Conv")
VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})
TAIL_OPS = VIEW_OPS | {"Transpose"}
Index = list[Expr]


@dataclass
class Contraction:
    """One contraction as a batched GEMM, its operands as functions of the GEMM's indices."""

    node: onnx.NodeProto
    y: str
    batch: tuple[int, ...]
    m: int
    n: int
    k: int
    a: Callable[[Index, Expr, Expr], Expr]  # (batch index, m, k) -> A element
    b: Callable[[Index, Expr, Expr], Expr]  # (batch index, k, n) -> B element
    y_index: Callable[[Index, Expr, Expr], Index]  # (batch index, m, n) -> Y's index
    finish: Callable[[Expr, Index, Expr, Expr], Expr]  # fp32 accumulator -> Y's value
    operand_type: DType
    # A direct contraction's A also depends on the column (grouped convolution: the group of an
    # output channel picks the input channels): it runs as K multiply-adds on the [BM, BN] tile
    # instead of tl.dot, and `a` is then called as a(batch, m, k, n).
    direct: bool = False


class AnchorValues(KernelValues):
    """Kernel values where Y, at the tile's own element, is the accumulator's finished value.

    Views of Y (Reshape, Flatten, ...) are Y too: each is expected at the index that holds the
    same element (`index_in`), so `Gemm -> Reshape -> Add` reads the accumulator tile as well.
    """

    def __init__(self, spec: KernelSpec) -> None:
        super().__init__(spec)
        self.y = ""
        self.y_at: tuple[Expr, ...] | None = None
        self.y_value: Expr | None = None
        self.aliases: dict[str, tuple[Expr, ...]] = {}  # Y and its views -> the tile's index there

    def bind(self, y: str, at: Sequence[Expr], value: Expr) -> None:
        """Y at index `at` is `value`; so are Y's views at the same element."""
        # A size-1 dim is read at 0 by every broadcasting rule: say so, so the indices agree.
        at = [ir.index(0) if d == 1 else e for e, d in zip(at, self.shape(y), strict=True)]
        self.y, self.y_at, self.y_value = y, tuple(at), value
        self.aliases = {y: self.y_at}
        for node in self.spec.nodes:
            if node.op_type in VIEW_OPS and node.input and node.input[0] in self.aliases:
                self.aliases[node.output[0]] = tuple(self.index_in(self.shape(node.output[0])))

    def index_in(self, shape: Sequence[int]) -> Index:
        """The index of the tile's element in a tensor of `shape` holding Y's elements in order."""
        assert self.y_at is not None
        return self.reshape_index(list(self.y_at), self.shape(self.y), shape)

    def _leaf(self, at: TensorAt) -> Expr | None:
        if at.tensor in self.aliases or at.tensor == self.y:
            if self.y_at is None or self.y_value is None:
                raise Unsupported("the contraction's operands read its own result")
            want = self.aliases[at.tensor]
            same = len(at.index) == len(want) and all(a is b for a, b in zip(at.index, want, strict=True))
            if not same:
                raise Unsupported("the epilogue reads the contraction's result at another element")
            return self._substitute(self.y_value)
        return super()._leaf(at)


def _operand_type(values: KernelValues, names: Sequence[str]) -> DType:
    types = {values.dtype(n) for n in names}
    if types <= {DType.F32}:
        return DType.F32
    if len(types) == 1 and types <= {DType.F16, DType.BF16}:
        return next(iter(types))
    raise Unsupported(f"contraction operands of types {sorted(t.value for t in types)}")


def _matmul(v: AnchorValues, node: onnx.NodeProto) -> Contraction:
    a_name, b_name = node.input[0], node.input[1]
    sa, sb, sy = v.shape(a_name), v.shape(b_name), v.shape(node.output[0])
    if len(sa) < 2 or len(sb) < 2:
        raise Unsupported("MatMul with a 1-D operand")
    batch = tuple(sy[:-2])
    return Contraction(
        node,
        node.output[0],
        batch,
        sy[-2],
        sy[-1],
        sa[-1],
        a=lambda b, m, k: v.at(a_name, [*broadcast_index(b, batch, sa[:-2]), m, k]),
        b=lambda b, k, n: v.at(b_name, [*broadcast_index(b, batch, sb[:-2]), k, n]),
        y_index=lambda b, m, n: [*b, m, n],
        finish=lambda acc, b, m, n: acc,
        operand_type=_operand_type(v, [a_name, b_name]),
    )


def _gemm(v: AnchorValues, node: onnx.NodeProto) -> Contraction:
    attrs = attrs_of(node)
    a_name, b_name = node.input[0], node.input[1]
    c_name = node.input[2] if len(node.input) > 2 and node.input[2] else ""
    ta, tb = int(attrs.get("transA", 0)), int(attrs.get("transB", 0))  # type: ignore[call-overload]
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))  # type: ignore[arg-type]
    sy = v.shape(node.output[0])
    k = v.shape(a_name)[0 if ta else 1]

    def finish(acc: Expr, b: Index, m: Expr, n: Expr) -> Expr:
        out = acc if alpha == 1.0 else acc * ir.const(alpha, DType.F32)
        if c_name:
            c = ir.cast(v.at(c_name, broadcast_index([m, n], sy, v.shape(c_name))), DType.F32)
            out = out + (c if beta == 1.0 else c * ir.const(beta, DType.F32))
        return out

    return Contraction(
        node,
        node.output[0],
        (),
        sy[0],
        sy[1],
        k,
        a=lambda b, m, kk: v.at(a_name, [kk, m] if ta else [m, kk]),
        b=lambda b, kk, n: v.at(b_name, [n, kk] if tb else [kk, n]),
        y_index=lambda b, m, n: [m, n],
        finish=finish,
        operand_type=_operand_type(v, [a_name, b_name]),
    )


def _conv(v: AnchorValues, node: onnx.NodeProto) -> Contraction:
    attrs = attrs_of(node)
    x_name, w_name = node.input[0], node.input[1]
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else ""
    sx, sw, sy = v.shape(x_name), v.shape(w_name), v.shape(node.output[0])
    if len(sx) != 4:
        raise Unsupported(f"Conv over {len(sx) - 2} spatial dims (2 are rendered)")
    if str(attrs.get("auto_pad", b"NOTSET")).strip("b'") not in ("NOTSET", ""):
        raise Unsupported("Conv with auto_pad")
    groups = int(attrs.get("group", 1))  # type: ignore[call-overload]
    n_img, c_in, h, w = sx
    f_out, cg, kh, kw = sw
    _, _, oh, ow = sy
    sh, sw_ = list(attrs.get("strides") or [1, 1])  # type: ignore[call-overload]
    dh, dw = list(attrs.get("dilations") or [1, 1])  # type: ignore[call-overload]
    pads = list(attrs.get("pads") or [0, 0, 0, 0])  # type: ignore[call-overload]
    ph, pw = int(pads[0]), int(pads[1])
    fg = f_out // groups

    def pixel(m: Expr) -> tuple[Expr, Expr, Expr]:
        return m // (oh * ow), (m // ow) % oh, m % ow

    def window(k: Expr) -> tuple[Expr, Expr, Expr]:
        return k // (kh * kw), (k // kw) % kh, k % kw

    direct = groups > 1

    def a(b: Index, m: Expr, k: Expr, n: Expr | None = None) -> Expr:
        img, y0, x0 = pixel(m)
        c, i, j = window(k)
        group = n // fg if direct else b[0]  # type: ignore[operator]
        hh = y0 * int(sh) - ph + i * int(dh)
        ww = x0 * int(sw_) - pw + j * int(dw)
        inside = ir.logical_and(
            ir.logical_and(ir.ge(hh, 0), ir.lt(hh, h)), ir.logical_and(ir.ge(ww, 0), ir.lt(ww, w))
        )
        value = v.at(x_name, [img, group * cg + c, ir.clamp(hh, 0, h - 1), ir.clamp(ww, 0, w - 1)])
        return ir.select(inside, value, ir.const(0.0, value.dtype), guarded=True)

    def channel(b: Index, n: Expr) -> Expr:
        return n if direct else b[0] * fg + n

    def bw(b: Index, k: Expr, n: Expr) -> Expr:
        c, i, j = window(k)
        return v.at(w_name, [channel(b, n), c, i, j])

    def y_index(b: Index, m: Expr, n: Expr) -> Index:
        img, y0, x0 = pixel(m)
        return [img, channel(b, n), y0, x0]

    def finish(acc: Expr, b: Index, m: Expr, n: Expr) -> Expr:
        return acc + ir.cast(v.at(bias, [channel(b, n)]), DType.F32) if bias else acc

    del c_in
    return Contraction(
        node, node.output[0], () if direct else (groups,), n_img * oh * ow, f_out if direct else fg,
        cg * kh * kw, a, bw, y_index, finish, _operand_type(v, [x_name, w_name]), direct,
    )  # fmt: skip


def match_contraction(spec: KernelSpec, v: AnchorValues) -> Contraction:
    """The group's one contraction as a batched GEMM (`Unsupported` says why there is none)."""
    found = [n for n in spec.nodes if n.op_type in CONTRACTIONS]
    if len(found) != 1:
        what = " -> ".join(n.op_type for n in found) or "none"
        raise Unsupported(f"one contraction per Triton anchor kernel (found {what})")
    node = found[0]
    if node.op_type == "MatMul":
        return _matmul(v, node)
    if node.op_type == "Gemm":
        return _gemm(v, node)
    return _conv(v, node)


def _tail(v: AnchorValues, name: str) -> tuple[str, list[onnx.NodeProto]]:
    """(base, data-moving ops from base to `name`, in order): where an output's values come from."""
    ops: list[onnx.NodeProto] = []
    while name in v.producer:
        node, _ = v.producer[name]
        if node.op_type not in TAIL_OPS:
            break
        ops.append(node)
        name = node.input[0]
    return name, ops[::-1]


def _forward(v: AnchorValues, idx: Index, ops: list[onnx.NodeProto]) -> Index:
    """`idx` (an index of the first op's input) carried through the data-moving `ops`."""
    for node in ops:
        src, out = v.shape(node.input[0]), v.shape(node.output[0])
        if node.op_type == "Transpose":
            perm = list(attrs_of(node).get("perm") or range(len(src) - 1, -1, -1))  # type: ignore[call-overload]
            idx = [idx[int(p)] for p in perm]
        else:
            idx = v.reshape_index(idx, src, out)
    return idx


def render_anchor(spec: KernelSpec, profile: HardwareProfile) -> RenderedKernel:
    """The Triton module of an anchor group: one tiled `tl.dot` function."""
    v = AnchorValues(spec)
    c = match_contraction(spec, v)
    narrow = not profile.fp64
    kernel = Kernel(spec.symbol, tuple(v.params), (), (), spec.describe("tiled tl.dot, epilogue on the tile"))
    owner = KernelRenderer(kernel, persistent=is_ascend(profile), narrow_f64=narrow)
    fn = FunctionRenderer(owner, f"{spec.symbol}_0")
    fn.full_lanes = True
    gm, gn, gka, gkb = ir.var("gm"), ir.var("gn"), ir.var("gka"), ir.var("gkb")
    acc = ir.var("acc", DType.F32)
    fn.vec_vars |= {"gm", "gn", "gka", "gkb", "acc"}
    body = Block(indent=2 if owner.persistent else 1)
    body.emit(f"tiles_m = tl.cdiv({c.m}, BM)")
    body.emit(f"tiles_n = tl.cdiv({c.n}, BN)")
    body.emit("v_bl = bid // (tiles_m * tiles_n)")
    body.emit("rest = bid % (tiles_m * tiles_n)")
    body.emit("v_gm = (rest // tiles_n) * BM + tl.arange(0, BM)[:, None]")
    body.emit("v_gn = (rest % tiles_n) * BN + tl.arange(0, BN)[None, :]")
    bvars: Index = []
    for d, size in enumerate(c.batch):
        stride = math.prod(c.batch[d + 1 :])
        bvars.append(ir.var(f"b{d}"))
        body.emit(f"v_b{d} = (v_bl // {stride}) % {size}" if d else f"v_b{d} = v_bl // {stride}")
    body.emit("v_acc = tl.zeros([BM, BN], tl.float32)")
    if c.direct:
        loop = _direct_loop(c, v, fn, body, bvars, gm, gn)
    else:
        loop = _dot_loop(c, v, fn, body, bvars, gm, gn, gka, gkb, profile)
    body.lines.extend(loop.lines)
    # epilogue: every output at the tile's element
    fn.lane_shape = "[BM, BN]"
    tile = Block(body.indent, body, f"(v_gm < {c.m}) & (v_gn < {c.n})")
    tile.lines = body.lines
    v.bind(c.y, c.y_index(bvars, gm, gn), c.finish(acc, bvars, gm, gn))
    v.new_scope()
    y_shape = v.shape(c.y)
    outputs = list(zip(spec.outputs, v.params[len(spec.inputs) :], strict=True))
    for t, buf in outputs:
        base, ops = _tail(v, t.name)
        if math.prod(v.shape(base)) != math.prod(y_shape):
            raise Unsupported(f"output {t.name} is not the contraction's result up to data movement")
        idx = list(v.aliases[base]) if base in v.aliases else v.index_in(v.shape(base))
        value = v._substitute(v.at(base, idx))
        out_idx = _forward(v, idx, ops)
        fn.stmt(Store(buf, v.lin(out_idx, v.shape(t.name)), value), tile)
    args = owner.arg_names()
    lines = [
        "\n@triton.jit",
        f"def {fn.name}({', '.join([*args, 'NBLOCKS', 'NPROG', 'BLOCK: tl.constexpr', 'BM: tl.constexpr', 'BN: tl.constexpr', 'BK: tl.constexpr'])}):",  # noqa: E501
        "    pid = tl.program_id(0).to(tl.int64)",
        "    for bid in range(pid, NBLOCKS, NPROG):" if owner.persistent else "    bid = pid",
        *body.lines,
    ]
    header = "# " + kernel.description.replace("\n", "\n# ")
    source = header + "\n" + PRELUDE + "\n".join(lines) + "\n"
    nb = math.prod(c.batch)
    launch = Launch(fn.name, "gemm", nb, tuple(args), fn.lane_bytes(), tile=(nb, c.m, c.n, c.k))
    values = {buf.name: array for buf, array in v.const_buffers.values()}
    tables = tuple((buf, values[buf.name]) for buf in owner.tables)
    return RenderedKernel(spec.symbol, source, (launch,), kernel.params, tables, ())


def _operand(v: AnchorValues, fn: FunctionRenderer, loop: Block, expr: Expr, mask: str, shape: str) -> str:
    """One operand element (resolved through the prologue), rendered into `loop` under `mask`."""
    v.new_scope()
    resolved = ir.cast(v._substitute(expr), DType.F32)
    fn.lane_shape = shape
    block = Block(loop.indent, loop, mask)
    block.lines = loop.lines
    return fn.expr(resolved, block)


def _dot_loop(c: Contraction, v: AnchorValues, fn: FunctionRenderer, body: Block, bvars: Index,
              gm: Expr, gn: Expr, gka: Expr, gkb: Expr, profile: HardwareProfile) -> Block:  # fmt: skip
    body.emit(f"for v_k0 in range(0, {c.k}, BK):")
    loop = body.child()
    loop.emit("v_gka = v_k0 + tl.arange(0, BK)[None, :]")
    loop.emit("v_gkb = v_k0 + tl.arange(0, BK)[:, None]")
    dot_type = {DType.F32: "tl.float32", DType.F16: "tl.float16", DType.BF16: "tl.bfloat16"}[c.operand_type]
    amask, bmask = f"(v_gm < {c.m}) & (v_gka < {c.k})", f"(v_gkb < {c.k}) & (v_gn < {c.n})"
    a = _operand(v, fn, loop, c.a(bvars, gm, gka), amask, "[BM, BK]")
    loop.emit(f"op_a = tl.where({amask}, {a}, 0.0).to({dot_type})")
    b = _operand(v, fn, loop, c.b(bvars, gkb, gn), bmask, "[BK, BN]")
    loop.emit(f"op_b = tl.where({bmask}, {b}, 0.0).to({dot_type})")
    precision = ', input_precision="ieee"' if c.operand_type is DType.F32 and not is_ascend(profile) else ""
    loop.emit(f"v_acc = tl.dot(op_a, op_b, v_acc{precision})")
    return loop


def _direct_loop(c: Contraction, v: AnchorValues, fn: FunctionRenderer, body: Block, bvars: Index,
                 gm: Expr, gn: Expr) -> Block:  # fmt: skip
    """K multiply-adds on the [BM, BN] tile, in k order (a grouped convolution)."""
    kd = ir.var("kd")
    body.emit(f"for v_kd in range(0, {c.k}):")
    loop = body.child()
    mask = f"(v_gm < {c.m}) & (v_gn < {c.n})"
    a = _operand(v, fn, loop, c.a(bvars, gm, kd, gn), mask, "[BM, BN]")  # type: ignore[call-arg]
    b = _operand(v, fn, loop, c.b(bvars, kd, gn), mask, "[BM, BN]")
    loop.emit(f"v_acc = v_acc + tl.where({mask}, {a} * {b}, 0.0)")
    return loop
