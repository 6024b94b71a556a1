"""Anchor kernels for the Triton targets: MatMul / Gemm / Conv as a tiled `tl.dot` with the fused
prologue and epilogue.

What the kernel computes is the group's `AnchorMatch` (plan/anchor_match.py, the planner's
legality test); this module only renders it. Every contraction is one GEMM shape,
`Y[b, m, n] = sum_k A[b, m, k] * B[b, k, n]` over batch `b`:

* MatMul / Gemm: the match's `Contraction` (batch dims, M/N/K, alpha) with each operand a
  `MatrixView`, so a stride-only prologue (Transpose, Reshape, Split, ...) is read in place at
  `offset + batch offset + m * rs + k * cs`; Gemm's `beta * C` is the match's `addend`;
* Conv: an *implicit* GEMM over the conv's geometry (lower/conv.py `conv_geometry`, computed from
  the match's anchor node): rows m = (image, output pixel), columns n = output channels,
  k = (input channel, kernel tap), whose A element is the input pixel under the window (zero in
  the padding, a guarded read), so no im2col buffer exists. A grouped conv runs direct: K
  multiply-adds on the [BM, BN] tile, the group of each column picking its input channels.

The parts of the operands' addresses the k loop does not change (batch offsets, a row's image
and window origin) are computed once before it. The match is taken with fp16/bf16 allowed across
the boundary (`FLOAT_TYPES`): such operands multiply in their own type.

The epilogue is the match's: each kernel output is resolved at the tile element's index of the
anchor's output (its domain), with the accumulator tile standing for that output, since the match
guarantees every epilogue op reads it at the tile's own element. Values leave at the element's
linear index; the output tail (a Transpose folded into the stores) leaves through the
contraction's output strides. ConvTranspose and two-contraction groups are refused with that
reason (the runtime splits an anchor chain into one kernel per contraction, chains.py).

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
from ...kernel_ir import Buffer, DType, Expr, Kernel, Store, TensorAt
from ...kernel_ir import nodes as ir
from ...lower.anchor import batch_offset
from ...lower.conv import conv_geometry
from ...lower.pointwise import KernelValues
from ...lower.values import IndexGroup, Unsupported, broadcast_index
from ...plan.anchor_match import AnchorMatch, MatrixView, dense_strides, match_anchor
from ..cpu.kernel_spec import KernelSpec
from .blocks import is_ascend
from .prelude import PRELUDE
from .render import Block, FunctionRenderer, KernelRenderer, Launch, RenderedKernel

# Element types an anchor kernel takes and gives on these targets (operands: one of them for both).
FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16})
Index = list[Expr]


@dataclass
class TileGemm:
    """The match as a batched GEMM over tiles: its operands as functions of the GEMM's indices."""

    batch: tuple[int, ...]
    m: int
    n: int
    k: int
    a: Callable[..., Expr]  # (flat batch entry, m, k) -> A element; direct: (entry, m, k, n)
    b: Callable[[Expr, Expr, Expr], Expr]  # (flat batch entry, k, n) -> B element
    # (flat batch entry, m, n) -> (index of the anchor output's element, its linear index)
    domain: Callable[[Expr, Expr, Expr], tuple[Index, Expr]]
    dest: Callable[[Expr, Expr, Expr], Expr] | None  # (entry, m, n) -> the output tail's offset
    finish: Callable[[Expr, Expr, Expr], Expr]  # (fp32 accumulator, m, n) -> the anchor output
    operand_type: DType
    # (flat batch entry, m, n) -> the parts of the operands' addresses the k loop does not
    # change: rendered once before it, the loop's addresses reuse them
    invariants: Callable[[Expr, Expr, Expr], list[Expr]]
    # A direct contraction's A also depends on the column (grouped convolution: the group of an
    # output channel picks the input channels): it runs as K multiply-adds on the [BM, BN] tile
    # instead of tl.dot.
    direct: bool = False


class AnchorValues(KernelValues):
    """Kernel values where the anchor's output, at the tile's own element, is the accumulator's
    finished value. The match admits only elementwise ops and order-keeping views between the
    anchor and the outputs, each reading the anchor's output at the element it computes, so any
    read of it while resolving an output at the tile's element is that element."""

    def __init__(self, spec: KernelSpec, match: AnchorMatch) -> None:
        super().__init__(spec)
        self.y = match.anchor.output[0]
        self.y_value: Expr | None = None

    def _leaf(self, at: TensorAt) -> Expr | None:
        if at.tensor == self.y:
            if self.y_value is None:
                raise Unsupported("the contraction's operands read its own result")
            return self.y_value
        return super()._leaf(at)

    def element(self, tensor: str, offset: Expr) -> Expr:
        """Element `offset` of an operand's base tensor (a kernel input or a constant table)."""
        return ir.load(self.buffer_of(tensor), offset)


def _operand_type(values: KernelValues, names: Sequence[str]) -> DType:
    types = {values.dtype(n) for n in names}
    if types <= {DType.F32}:
        return DType.F32
    if len(types) == 1 and types <= {DType.F16, DType.BF16}:
        return next(iter(types))
    raise Unsupported(f"contraction operands of types {sorted(t.value for t in types)}")


def _axes(flat: Expr, dims: Sequence[int]) -> Index:
    """The multi-index over `dims` of the linear index `flat` (known to be below their product)."""
    out: Index = []
    for a, d in enumerate(dims):
        q = flat // math.prod(dims[a + 1 :])
        out.append(ir.index(0) if d == 1 else q if all(x == 1 for x in dims[:a]) else q % d)
    return out


def _gemm(v: AnchorValues, match: AnchorMatch) -> TileGemm:
    """A MatMul / Gemm match: its contraction, addend and output strides as they are."""
    p = match.contraction
    assert p is not None
    a, b = p.a, p.b
    rows, cols = match.domain[: match.split], match.domain[match.split :]

    def base(mv: MatrixView, bi: Expr) -> Expr:
        return batch_offset(bi, p.batch, mv.batch_strides) + mv.offset

    def op_a(bi: Expr, m: Expr, k: Expr) -> Expr:
        return v.element(a.tensor, (base(a, bi) + m * a.rs) + k * a.cs)

    def op_b(bi: Expr, k: Expr, n: Expr) -> Expr:
        return v.element(b.tensor, (base(b, bi) + n * b.cs) + k * b.rs)

    def domain(bi: Expr, m: Expr, n: Expr) -> tuple[Index, Expr]:
        # The contraction enumerates the domain in row-major order: row bi * M + m, column n.
        r = bi * p.m + m if p.batch else m
        row_idx, col_idx = _axes(r, rows), _axes(n, cols)
        # `lin` (and the views' reshape_index) then see the row and column back, not the axes.
        v.groups += [IndexGroup(tuple(row_idx), rows, r), IndexGroup(tuple(col_idx), cols, n)]
        return [*row_idx, *col_idx], r * p.n + n

    def dest(bi: Expr, m: Expr, n: Expr) -> Expr:
        return batch_offset(bi, p.batch, p.c_batch_strides) + m * p.c_rs + n

    addend = match.addend

    def finish(acc: Expr, m: Expr, n: Expr) -> Expr:
        out = acc if p.alpha == 1.0 else acc * ir.const(p.alpha, DType.F32)
        if addend is not None:
            c = v.at(addend.tensor, broadcast_index([m, n], (p.m, p.n), addend.shape))
            c = ir.cast(v._substitute(c), DType.F32)
            out = out + (c if addend.beta == 1.0 else c * ir.const(addend.beta, DType.F32))
        return out

    def invariants(bi: Expr, m: Expr, n: Expr) -> list[Expr]:
        return [base(a, bi) + m * a.rs, base(b, bi) + n * b.cs]

    return TileGemm(
        p.batch, p.m, p.n, p.k, op_a, op_b, domain, dest if match.tail is not None else None, finish,
        _operand_type(v, [a.tensor, b.tensor]), invariants,
    )  # fmt: skip


def _conv(v: AnchorValues, match: AnchorMatch) -> TileGemm:
    """A Conv match as an implicit GEMM over its geometry (lower/conv.py: 1-D to 3-D, normalised
    to depth x height x width), the operands read through their views' strides."""
    node = match.anchor
    if node.op_type != "Conv":
        raise Unsupported(f"{node.op_type} anchors are not rendered for the Triton targets")
    g = conv_geometry(node, v)
    x, w = match.operands[0], match.operands[1]
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else ""
    if bias and math.prod(v.shape(bias)) != g.cout:
        raise Unsupported(f"Conv bias {list(v.shape(bias))} does not match {g.cout} channels")
    nsp = len(x.shape) - 2
    # strides of (image, channel, depth, height, width); a dim the conv lacks has extent 1
    xs = (*x.strides[:2], *(0,) * (3 - nsp), *x.strides[2:])
    ws = (*w.strides[:2], *(0,) * (3 - nsp), *w.strides[2:])
    spatial = list(
        zip((g.d, g.h, g.w), (g.od, g.oh, g.ow), (g.kd, g.kh, g.kw), (g.sd, g.sh, g.sw),
            (g.dd, g.dh, g.dw), (g.pf, g.pt, g.pl), xs[2:], strict=True)
    )  # fmt: skip
    direct = g.group > 1  # every column's group picks its input channels

    def pixel(m: Expr) -> tuple[Expr, Index]:
        """(image, output position per spatial dim) of GEMM row m."""
        img = m // g.pixels if g.n > 1 else ir.index(0)
        return img, _axes(m % g.pixels if g.n > 1 else m, (g.od, g.oh, g.ow))

    def window(k: Expr) -> tuple[Expr, Index]:
        """(input channel within the group, kernel tap per spatial dim) of GEMM index k."""
        return k // g.taps, _axes(k % g.taps if g.cig > 1 else k, (g.kd, g.kh, g.kw))

    def rows(m: Expr) -> tuple[Expr, Index]:
        """The input offset of row m's image and the window origin per spatial dim (stride only)."""
        img, out = pixel(m)
        return img * xs[0] + x.offset, [o * s for o, (_, _, _, s, *_) in zip(out, spatial, strict=True)]

    def a(bi: Expr, m: Expr, k: Expr, n: Expr | None = None) -> Expr:
        image, origin = rows(m)
        c, tap = window(k)
        channel = (n // g.cog) * g.cig + c if direct else c  # type: ignore[operator]
        offset = image + channel * xs[1]
        inside: Expr | None = None
        for o, t, (size, extent, taps, s, d, pad, stride) in zip(origin, tap, spatial, strict=True):
            at = o + t * d - pad
            if pad or (extent - 1) * s + (taps - 1) * d >= size:  # the window may leave the input
                ok = ir.logical_and(ir.ge(at, 0), ir.lt(at, size))
                inside = ok if inside is None else ir.logical_and(inside, ok)
                at = ir.clamp(at, 0, size - 1)
            offset = offset + at * stride
        value = v.element(x.tensor, offset)
        return value if inside is None else ir.select(inside, value, ir.const(0.0, value.dtype), guarded=True)

    # a dense weight: k is the element's offset within its output channel
    k_dense = tuple(ws[1:]) == dense_strides((g.cig, g.kd, g.kh, g.kw))

    def b(bi: Expr, k: Expr, n: Expr) -> Expr:
        if k_dense:
            return v.element(w.tensor, (n * ws[0] + w.offset) + k)
        c, tap = window(k)
        offset = (n * ws[0] + w.offset) + c * ws[1]
        for t, stride in zip(tap, ws[2:], strict=True):
            offset = offset + t * stride
        return v.element(w.tensor, offset)

    def domain(bi: Expr, m: Expr, n: Expr) -> tuple[Index, Expr]:
        img, out = pixel(m)
        idx = [img, n, *out[3 - nsp :]]
        return idx, v.lin(idx, match.domain)

    def finish(acc: Expr, m: Expr, n: Expr) -> Expr:
        return acc + ir.cast(v._substitute(v.at(bias, [n])), DType.F32) if bias else acc

    def invariants(bi: Expr, m: Expr, n: Expr) -> list[Expr]:
        image, origin = rows(m)
        return [image, *origin, n * ws[0] + w.offset]

    return TileGemm(
        (), g.n * g.pixels, g.cout, g.kdim, a, b, domain, None, finish,
        _operand_type(v, [x.tensor, w.tensor]), invariants, direct,
    )  # fmt: skip


def tile_gemm(match: AnchorMatch, v: AnchorValues) -> TileGemm:
    """The match's contraction as a batched GEMM of tiles (`Unsupported` says why there is none)."""
    return _gemm(v, match) if match.contraction is not None else _conv(v, match)


def render_anchor(spec: KernelSpec, profile: HardwareProfile) -> RenderedKernel:
    """The Triton module of an anchor group: one tiled `tl.dot` function."""
    match = match_anchor(spec, float_types=FLOAT_TYPES)
    if match.norm is not None or match.pool is not None:  # the planner forms neither for Triton
        stage = "a closing LayerNormalization" if match.norm is not None else "a GlobalAveragePool prologue"
        raise Unsupported(f"the Triton anchors do not render {stage}")
    v = AnchorValues(spec, match)
    c = tile_gemm(match, v)
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
    bl = ir.var("bl")  # the flat batch entry
    body.emit("v_acc = tl.zeros([BM, BN], tl.float32)")
    for invariant in c.invariants(bl, gm, gn):
        fn.expr(invariant, body)
    if c.direct:
        loop = _direct_loop(c, v, fn, body, bl, gm, gn)
    else:
        loop = _dot_loop(c, v, fn, body, bl, gm, gn, gka, gkb, profile)
    body.lines.extend(loop.lines)
    # epilogue: every output at the tile's element
    fn.lane_shape = "[BM, BN]"
    tile = Block(body.indent, body, f"(v_gm < {c.m}) & (v_gn < {c.n})")
    tile.lines = body.lines
    v.new_scope()
    v.y_value = v._substitute(c.finish(acc, gm, gn))
    for buf, offset, value in _stores(spec, match, v, c, bl, gm, gn):
        fn.stmt(Store(buf, offset, value), tile)
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


def _stores(
    spec: KernelSpec, match: AnchorMatch, v: AnchorValues, c: TileGemm, bl: Expr, gm: Expr, gn: Expr
) -> list[tuple[Buffer, Expr, Expr]]:
    """(buffer, offset, value) of every kernel output at the tile's element: the anchor output and
    the epilogue values at the element's linear index (views keep the order), the tail's output
    where the contraction stores (its strides)."""
    domain = match.domain
    idx, linear = c.domain(bl, gm, gn)
    flat = {match.anchor.output[0], *(n.output[0] for n in match.epilogue)}
    out = []
    for t, buf in zip(spec.outputs, v.params[len(spec.inputs) :], strict=True):
        if match.tail is not None and t.name == match.tail.output:
            assert c.dest is not None
            name, offset = match.tail.value, c.dest(bl, gm, gn)
        elif t.name in flat:
            name, offset = t.name, linear
        else:
            raise Unsupported(f"output {t.name} is not a value of the anchor's epilogue")
        shape = v.shape(name)
        at = idx if tuple(shape) == tuple(domain) else v.reshape_index(idx, domain, shape)
        out.append((buf, offset, v.resolve(name, at)))
    return out


def _operand(v: AnchorValues, fn: FunctionRenderer, loop: Block, expr: Expr, mask: str, shape: str) -> str:
    """One operand element, rendered into `loop` under `mask`."""
    v.new_scope()
    resolved = ir.cast(v._substitute(expr), DType.F32)
    fn.lane_shape = shape
    block = Block(loop.indent, loop, mask)
    block.lines = loop.lines
    return fn.expr(resolved, block)


def _dot_loop(c: TileGemm, v: AnchorValues, fn: FunctionRenderer, body: Block, bl: Expr,
              gm: Expr, gn: Expr, gka: Expr, gkb: Expr, profile: HardwareProfile) -> Block:  # fmt: skip
    body.emit(f"for v_k0 in range(0, {c.k}, BK):")
    loop = body.child()
    loop.emit("v_gka = v_k0 + tl.arange(0, BK)[None, :]")
    loop.emit("v_gkb = v_k0 + tl.arange(0, BK)[:, None]")
    dot_type = {DType.F32: "tl.float32", DType.F16: "tl.float16", DType.BF16: "tl.bfloat16"}[c.operand_type]
    amask, bmask = f"(v_gm < {c.m}) & (v_gka < {c.k})", f"(v_gkb < {c.k}) & (v_gn < {c.n})"
    a = _operand(v, fn, loop, c.a(bl, gm, gka), amask, "[BM, BK]")
    loop.emit(f"op_a = tl.where({amask}, {a}, 0.0).to({dot_type})")
    b = _operand(v, fn, loop, c.b(bl, gkb, gn), bmask, "[BK, BN]")
    loop.emit(f"op_b = tl.where({bmask}, {b}, 0.0).to({dot_type})")
    precision = ', input_precision="ieee"' if c.operand_type is DType.F32 and not is_ascend(profile) else ""
    loop.emit(f"v_acc = tl.dot(op_a, op_b, v_acc{precision})")
    return loop


def _direct_loop(c: TileGemm, v: AnchorValues, fn: FunctionRenderer, body: Block, bl: Expr,
                 gm: Expr, gn: Expr) -> Block:  # fmt: skip
    """K multiply-adds on the [BM, BN] tile, in k order (a grouped convolution)."""
    kd = ir.var("kd")
    body.emit(f"for v_kd in range(0, {c.k}):")
    loop = body.child()
    mask = f"(v_gm < {c.m}) & (v_gn < {c.n})"
    a = _operand(v, fn, loop, c.a(bl, gm, kd, gn), mask, "[BM, BN]")
    b = _operand(v, fn, loop, c.b(bl, kd, gn), mask, "[BM, BN]")
    loop.emit(f"v_acc = v_acc + tl.where({mask}, {a} * {b}, 0.0)")
    return loop
