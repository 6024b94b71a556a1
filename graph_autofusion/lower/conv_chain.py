"""A 1x1 Conv feeding a depthwise 3x3 Conv as one kernel: an inverted-residual block's expansion
and depthwise conv (MobileNetV2's at 112x112 and 56x56), the expanded tensor never leaving the
cache; and a depthwise 3x3 Conv feeding a 1x1 Conv (a depthwise-separable conv: MobileNetV2's
first block), its band's depthwise rows never leaving it (afc_dw3x3_pw: no rows computed twice).

What the kernel computes is its conv `ChainMatch` (plan/anchor_match.py): the expansion's bias
and its Relu or Clip are the library's post-ops, applied as it computes each tile; the depthwise
conv's bias and epilogue are the generated epilogue, run on each band while it is hot.

    for task in 0..images x runs (parallel, static):    # a run: contiguous output rows
        for oy0 in the run's rows, `band` at a time:
            afc_pw_dw3x3(..., oy0, oy1, band, first = oy0 is the run's first row, mid)
              (or afc_dw3x3_pw(..., oy0, oy1, mid))
            epilogue over (the image's channels) x (pixels of rows [oy0, oy1))

`afc_pw_dw3x3` (afc.h) expands the input rows the band reads into this thread's `mid` slice
and runs the depthwise conv from there; a band after the first of a run reuses the rows the
previous band expanded and this one reads again. The runs split each image in as many contiguous
parts as the kernel's team has threads (its workspace slices), one per thread: each expands the
halo rows of its part once, and on two threads each reads the half of the input and writes the
half of the output that is its own in the convs before and after too (1x1 convs hand out pixel
tiles from both ends), so the other core's cache holds little of what a thread reads.

Why: the expansion is the largest tensor of such a block (96 x 112 x 112 floats, 4.8 MB, in
MobileNetV2) and the two kernels wrote it and read it back; in a chain the band's planes stay in
L2. In the model (both plans in one process, two threads, each kernel's fastest of 40 profiled
runs, Intel Xeon with AVX-512), the chain against the two kernels: MobileNetV2's 16 -> 96 at
112x112 with the stride-2 depthwise 0.49 -> 0.29 ms, 24 -> 144 at 56x56 0.22 -> 0.18 (stride 1)
and 0.16 -> 0.14 (stride 2); the whole model 0.89 of its time. Its first block's depthwise conv
at 112x112 into its 32 -> 16 projection 0.18 -> 0.12 ms, the whole model 0.97-0.98 more. Smaller
tensors between the convs keep their two kernels (plan/anchor_match.py: CONV_CHAIN_MIN_BYTES),
whose own tilings beat the bands' few pixels a call. Bands of BAND_ROWS rows measured best at
112x112 and 56x56 (4 and 14 rows within 5%, in C); a band's `mid` is kept within BAND_FLOATS.
"""

from __future__ import annotations

import math

from ..backend.cpu.contraction import contraction_mode
from ..backend.cpu.kernel_spec import KernelSpec
from ..backend.cpu.render_c import WORKSPACE_SLICES
from ..kernel_ir import Buffer, Call, DType, Kernel, Let, Loop, Stmt
from ..kernel_ir import nodes as ir
from ..plan.anchor_match import ChainMatch, dense_strides, match_anchor, match_chain
from .anchor import PARALLEL_MIN_MACS, POST_NONE, _is_raw, anchor_kernel, destination, epilogue_nest
from .chain import sub_spec
from .conv import (
    _ConvValues,
    _packed_weights,
    _packs_weight,
    _post_ops,
    conv_geometry,
    depthwise_in_library,
)
from .values import Unsupported

PW_DW_ROUTINE = "afc_pw_dw3x3"  # afc.h: one band of a 1x1 conv into a depthwise 3x3
DW_PW_ROUTINE = "afc_dw3x3_pw"  # ... and of a depthwise 3x3 into a 1x1 conv
# Output rows a band computes at most, and the floats of its expanded rows per thread (`mid`).
BAND_ROWS = 8
BAND_FLOATS = 128 * 1024


def band_rows(channels: int, width: int, stride: int, run_rows: int) -> int:
    """Output rows per band: at most BAND_ROWS and the run's rows, and the expanded rows the band
    reads (stride * (rows - 1) + 3 of `width` floats per channel) within BAND_FLOATS, at least 1."""
    fitting = (BAND_FLOATS // max(1, channels * width) - 3) // stride + 1
    return max(1, min(BAND_ROWS, run_rows, fitting))


def mid_floats(channels: int, width: int, stride: int, band: int) -> int:
    """Floats of one thread's expanded rows (afc.h: afc_pw_dw3x3's `buf`)."""
    return channels * (stride * (band - 1) + 3) * width


def lower_conv_chain(spec: KernelSpec, chain: ChainMatch | None = None) -> Kernel:
    """The kernel of a conv `anchor_chain` spec; raises `Unsupported` where the library cannot
    run it (the caller then runs the two convs as stages, one after the other)."""
    chain = chain or match_chain(spec)
    if not chain.conv:
        raise Unsupported("not a conv chain")
    if contraction_mode() != "library":
        raise Unsupported("a conv chain runs in the contraction library")
    h = chain.second.input[0]
    spec1 = sub_spec(spec, f"{spec.symbol}_s1", [chain.first, *chain.middle], [h])
    spec2 = sub_spec(spec, f"{spec.symbol}_s2", [chain.second, *chain.epilogue], [h])
    match1, match2 = match_anchor(spec1), match_anchor(spec2)
    values = _ConvValues(spec, match1)
    g1, g2 = conv_geometry(chain.first, values), conv_geometry(chain.second, values)
    for view in (*match1.operands[:2], *match2.operands[1:2]):
        if view.offset or view.strides != dense_strides(view.shape):
            raise Unsupported(f"Conv operand {view.tensor!r} is not dense (a conv takes no prologue)")
    x, w1 = match1.operands[:2]
    w2 = match2.operands[1]
    pointwise, depthwise = (w2, g1) if chain.depthwise_first else (w1, g2)
    if not _packs_weight(values, pointwise) or not depthwise_in_library(depthwise):
        raise Unsupported("the library packs neither the 1x1 conv's weight nor runs the depthwise conv")
    post = _post_ops(spec1, match1, values)
    if post is None and (chain.middle or values.bias is not None):
        raise Unsupported("the first conv's bias and activation are not the library's post-ops")
    if post is not None and post.residual is not None:
        raise Unsupported("the first conv of a chain takes no residual")
    g_pw = g2 if chain.depthwise_first else g1
    weights = _packed_weights(values, g_pw, pointwise, (g_pw.cout, 1))  # one block of all channels
    assert weights is not None
    packed = weights[0]
    x_buf, w1_buf, w2_buf = (values.buffer_of(v.tensor) for v in (x, w1, w2))

    # the second half's destination and epilogue, as a lone depthwise conv's
    values.match = match2
    values.bias = chain.second.input[2] if len(chain.second.input) > 2 and chain.second.input[2] else None
    out_buf, dest, _, _, flat = destination(spec, values, match2, "conv chain's epilogue")
    values.raw_at = (out_buf[dest], None)
    write_back = None if _is_raw(match2, dest) and values.bias is None else dest
    y_buf = out_buf[dest]

    if chain.depthwise_first:  # the depthwise band's rows, no halo: c x rows x ow floats
        band = max(1, min(BAND_ROWS, g2.oh, BAND_FLOATS // max(1, g1.cout * g2.ow)))
        mid = Buffer("mid", DType.F32, g1.cout * band * g1.ow, "scratch")
    else:
        band = band_rows(g1.cout, g1.w, g2.sh, g2.oh)
        mid = Buffer("mid", DType.F32, mid_floats(g1.cout, g1.w, g2.sh, band), "scratch")
    # a run per thread of the team (one workspace slice each), at most one per output row
    runs = ir.clamp(ir.raw(WORKSPACE_SLICES, DType.I64), 1, g2.oh)
    task, ni, ri, a0, a1 = (ir.var(v) for v in ("task", "ni", "ri", "a0", "a1"))
    b, oy0, oy1 = ir.var("b"), ir.var("oy0"), ir.var("oy1")
    null = ir.raw("NULL", DType.I64)
    act, lo, hi = (post.act, post.lo, post.hi) if post is not None else (POST_NONE, 0.0, 0.0)
    bias = ir.addr(post.bias, 0) if post is not None and post.bias is not None else null
    x_at, y_at = ir.addr(x_buf, ni * (g1.cin * g1.plane)), ir.addr(y_buf, ni * (g2.cout * g2.pixels))
    post_args = (bias, ir.index(act), ir.const(lo, DType.F32), ir.const(hi, DType.F32))
    if chain.depthwise_first:
        call = Call(
            DW_PW_ROUTINE,
            (
                ir.index(g1.cout),
                x_at,
                ir.index(g1.h),
                ir.index(g1.w),
                ir.addr(w1_buf, 0),
                *post_args,
                *(ir.index(v) for v in (g1.sh, g1.pt, g1.pl, g2.cout)),
                ir.addr(packed, 0),
                y_at,
                ir.index(g2.oh),
                ir.index(g2.ow),
                oy0,
                oy1,
                ir.addr(mid, 0),
            ),
        )
    else:
        call = Call(
            PW_DW_ROUTINE,
            (
                ir.index(g1.cout),
                ir.index(g1.cin),
                ir.addr(packed, 0),
                x_at,
                ir.index(g1.h),
                ir.index(g1.w),
                *post_args,
                ir.addr(w2_buf, 0),
                y_at,
                *(ir.index(v) for v in (g2.oh, g2.ow, g2.sh, g2.pt, g2.pl)),
                oy0,
                oy1,
                ir.index(band),
                ir.eq(b, 0),
                ir.addr(mid, 0),
            ),
        )
    per_band: list[Stmt] = [Let(oy0, a0 + b), Let(oy1, ir.minimum(oy0 + band, a1)), call]
    if write_back is not None or flat:
        planes, pixels = (ni * g2.cout, ni * g2.cout + g2.cout), (oy0 * g2.ow, oy1 * g2.ow)
        per_band.append(epilogue_nest(values, match2, y_buf, write_back, flat, out_buf, planes, pixels))
    body: list[Stmt] = [
        Let(ni, task // runs),
        Let(ri, task % runs),
        Let(a0, ri * g2.oh // runs),
        Let(a1, (ri + 1) * g2.oh // runs),
        Loop(b, a1 - a0, tuple(per_band), step=band),
    ]
    # a depthwise multiply-add costs about 4 of the 1x1 conv's (lower/conv.py)
    g_dw = g1 if chain.depthwise_first else g2
    macs = g_pw.n * g_pw.cout * g_pw.pixels * g_pw.cin + 4 * g_dw.n * g_dw.cout * g_dw.pixels * g_dw.taps
    parallel = macs >= PARALLEL_MIN_MACS
    loop = Loop(task, runs * g2.n, tuple(body), parallel=parallel, scratch=(mid,), macs=macs)  # static
    middle = " -> ".join(n.op_type for n in chain.middle) or "none"
    after = " -> ".join(n.op_type for n in chain.epilogue) or "none"
    convs = (
        f"depthwise 3x3 stride {g1.sh} {g1.n}x{g1.cin}x{g1.h}x{g1.w} -> {middle} -> Conv 1x1 -> {g2.cout}"
        if chain.depthwise_first
        else f"Conv 1x1 {g1.n}x{g1.cin}x{g1.h}x{g1.w} -> {g1.cout} channels -> {middle} -> depthwise 3x3 "
        f"stride {g2.sh}"
    )
    what = (
        f"method: conv_depthwise_chain; {convs} -> {g2.cout}x{g2.oh}x{g2.ow} -> {after}; {g2.n} images x "
        f"a run of output rows per thread, in bands of {band}, the first conv's rows in a per-thread "
        "workspace slice; the 1x1 conv's weight packed once at load (contraction library)"
    )
    return anchor_kernel(spec, values, [loop] if math.prod(match2.domain) else [], what, [weights])
