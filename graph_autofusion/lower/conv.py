"""Conv and ConvTranspose anchors (NCHW, 1-D to 3-D) as kernel IR, each shape routed to the method
that suits it.

What the kernel computes is its `AnchorMatch` (plan/anchor_match.py); this module renders it,
sharing with lower/anchor.py the one contraction choice point (`contraction`), the packed-weight
convention (`Kernel.packed` / `prepack`) and the epilogue loop nest (`epilogue_nest`):

* `conv1x1_gemm`: 1x1 kernel, stride 1, no padding. The input already is the GEMM operand:
  `Y[n, g] = W_g[Cout/g, Cin/g] x X[n, g][Cin/g, H*W]`, tiled over output pixels (and output
  channels when there are too few pixel tiles to keep the threads busy). A tile of shallow
  pixels (at most 2^16 floats packed: ResNet-50's 56x56 and 28x28 1x1s of up to 256 input
  channels, MobileNetV2's expansions) runs in chunks of 24 output channels against its pixels
  packed once (`afc_gemm_ap_in`), and the epilogue finishes each chunk while it is in L1. An
  epilogue of bias, residual and Relu/Clip the library applies to each tile's accumulators
  before their store instead, in one call over the whole tile (`afc_gemm_ap_post`, `_Post`): with
  nothing to read back, chunks only cost (on Zen 4, ResNet-50's 64 -> 256 at 56x56 with bias,
  residual and Relu 10% and MobileNetV2's 16 -> 96 at 112x112 with bias and Clip 9%).
* `conv_depthwise`: one input and one output channel per group. A direct loop per channel plane
  over a zero-padded copy of the plane (a workspace slice), so the inner loop over output
  columns has no bounds checks and vectorizes; kernel size, strides and dilations are
  compile-time constants and the taps are unrolled (up to MAX_UNROLLED_TAPS), so a 3x3 is nine
  multiply-adds on registers. A task takes a run of small planes (`_depthwise_tasks`) and zeroes
  the padded plane's border once for all of them (`_depthwise_border`); output rows of at least
  DEPTHWISE_ROW_EPILOGUE_WIDTH are finished by the epilogue one by one, while in L1. 3x3s of
  stride 1 (output rows as wide as the input's) and 2 run in the library instead (`afc_dw3x3`,
  `afc_dw3x3_s2`, `depthwise_in_library`), a run of planes a call, then its epilogue.
* `conv_im2col_tiled`: everything else (grouped by the task's group). The im2col matrix of one
  tile of output pixels is built in a per-thread workspace slice sized to stay in L2, multiplied
  by one single-threaded contraction straight into the output, and the epilogue finishes the
  tile while it is hot (a whole-image im2col would be a large extra round trip to memory).
  Where the tile's rows are narrow (ResNet-50's 3x3 convs at stride 1, its 7x7 stem), the input
  rows the tile reads are first copied into a zero-padded band, so that each tap's row of the
  tile is a plain copy without bounds work (`_im2col_padded`).

    for task in 0..tasks (parallel, dynamic):   # images x groups x pixel tiles [x channel tiles]
        [im2col of pixels [p0, p1) of the task's group into this thread's `col` slice]
        for each channel tile [c0, c1) of the task:
            call contraction(W_g[c0:c1, :], col or X[n, g][:, p0:p1] -> Y[n, g*cog + c0.., p0:p1])
            epilogue over rows (n, g*cog + c0..c1) x pixels [p0, p1)

* `conv_direct`: a stride-1 conv whose weight the library packs, with output rows wide enough
  (`_direct_shape`): per task (image, group, tile of whole output rows), the zero-padded band of
  the input rows the tile reads, then one `afc_conv_ap` call that reads each tap of the implicit
  im2col from the band in place (the band's flat rows: a 32-column panel runs across output rows,
  the (kw - 1) * dw columns between them computed and dropped), then the epilogue: no im2col tile
  and no per-tile B packing (ResNet-50's 56x56 3x3 convs, 9-13% faster than im2col on Zen 4).

* `conv_winograd` (library only): a 3x3 conv of stride 1 and padding 1, one group, even height
  and width, channels in whole vectors (`winograd_shape`; ResNet-50's stride-1 3x3s at 56x56,
  28x28 and 14x14) as Winograd F(2x2, 3x3): the weight's 16 transforms packed once at load, and
  per task (image, band of tile rows, channel tile, `winograd_tiles`) one `afc_wino3x3` call that
  copies the band's input rows channels-last, transforms them, runs the 16 products of 16
  multiply-adds per 2x2 output tile where the direct sum needs 36, and stores the output
  transform's tile into NCHW with the post-ops; another epilogue runs after it. Whole ResNet-50,
  two threads, Zen 4, both plans compiled into one process and run in alternating rounds
  (medians): 39.7 -> 34.7 ms (onnxruntime 39.3).

* pixels as rows over whole output rows (`_band_rows_shape`, library only): a stride-1 (or, with
  enough input channels, stride-2) conv of at most CONV_BP_INPLACE_CHANNELS output channels with
  more pixels than the narrow convs below: per task (image, tile of whole output rows), the
  zero-padded band, then one `afc_conv_bp` call whose micro-kernel broadcasts each pixel's taps
  from the band in place against the weight's B-panels (`Y^T` into this thread's tile), then
  `afc_store_t` stores the tile transposed into NCHW, then the epilogue (ResNet-50's 3x3 convs of
  64 and 128 channels at 56x56 and 28x28, and its 128-channel one of stride 2). An epilogue of
  the library's post-ops (`_Post`) runs on the transposed registers of that store instead
  (`afc_store_t_post`), for every pixels-as-rows tile: the generated pass after the store read the
  whole output tile back. In one process, both checkouts' kernels alternating (Zen 4, AVX-512, two
  threads, benchmarks/anchor_ab.py): MobileNetV2's 14x14 expansions with Clip 0.78 and 0.85 of
  their time, its 576 -> 96 projection with its bias 0.92, ResNet-50's 3x3s 0.98-0.99.

* `conv_transpose_col2im` (ConvTranspose): per (image, group, block of output channels), one
  contraction `col = W_g^T x X[n, g]` into a per-thread workspace slice, then a scatter-add
  (col2im) into the output block, then the epilogue on that block.

With `AUTOFUSION_CONTRACTION=library` and a constant weight, a Conv's weight of each (group,
channel tile) is packed once at load as the library's A-panels and each tile is one
`afc_gemm_ap` call; otherwise (and for ConvTranspose, whose weight is read transposed) OpenBLAS
reads the weight in place.

Pixels as rows (`pixels_as_rows`, library only): a conv with few output pixels that do not fill
whole panels (ResNet-50's last stage: 7x7 = 49 pixels, 32 + 17 columns of a 32-wide panel, 76% of
the lanes) computes the transposed product instead, `Y^T[pixels x Cout] = col^T x W^T`: the
pixels are the rows (49 = 6 x 8 + 1 rows of an 8-row panel, 88%), the weight is packed once as
B-panels (`afc_gemm_bp`), the activation (or im2col tile) is read transposed, and the tile,
written to a per-thread workspace, is stored transposed into NCHW before the epilogue. Measured
on fused ResNet-50 (Intel Xeon AVX-512 host, one thread, per-kernel CPU time, both ways compiled
side by side and interleaved): its four 7x7 conv shapes 17.2-18.1 -> 16.2-16.5 ms (-6 to -9%);
the 3x3 512-channel conv alone 9.1-9.6 -> 8.5 ms. Im2col convs of up to 256 pixels (14x14: 196)
take the same path in equal pixel tiles (100 + 96 rows, where 196 columns are 128 + 68, the
last panel 4 columns wide); as those tiles are balanced, one per thread is
enough tasks and the channel tiles run inside the task, sharing one im2col instead of building
it once per channel tile: ResNet-50's 256-channel 3x3 convs 13.85-13.91 -> 11.98-12.19 ms.
1x1 convs of up to 256 pixels, not whole panels, read their activation transposed the same way
(196 pixels are 25 row panels of 8 against 7 column panels of 32, 224 lanes): on a Zen 4 host
(AVX-512, one thread, benchmarks/anchor_ab.py, CPU time) ResNet-50's 1024 -> 256 at 14x14
1.00 -> 0.95-0.97 ms, its 256 -> 1024 with the residual 0.99 -> 0.98, MobileNetV2's 384 -> 64
0.107 -> 0.099 (two threads: 0.508 -> 0.481, 0.502 -> 0.487, 0.056 -> 0.051 ms). The tail of a
tile of rows (49 pixels: 6 panels of 8 and one row) runs a micro-kernel of as many rows as it
has (afc.c's `afc_ukernel`), not 8.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import onnx

from ..backend.cpu.contraction import CONV_BP_INPLACE_CHANNELS, PANEL_QUANTUM, contraction_mode
from ..backend.cpu.kernel_spec import KernelSpec
from ..kernel_ir import Buffer, Call, DType, Expr, If, Kernel, Let, Loop, Stmt, Store, TensorAt
from ..kernel_ir import nodes as ir
from ..plan.anchor_match import AnchorMatch, OperandView, clip_bounds, dense_strides, match_anchor
from .anchor import (
    BEGIN_CALL_ROUTINE,
    DEPTHWISE_3X3_ROUTINE,
    DEPTHWISE_3X3_S2_ROUTINE,
    DIRECT_CONV_ROUTINE,
    DIRECT_ROWS_CONV_ROUTINE,
    PACK_A_ROUTINE,
    PACKED_A_INPUT_ROUTINE,
    PACKED_A_POST_ROUTINE,
    PARALLEL_MIN_MACS,
    POST_CLIP,
    POST_NONE,
    POST_RELU,
    STORE_T_POST_ROUTINE,
    STORE_T_ROUTINE,
    WINOGRAD_PACK_ROUTINE,
    WINOGRAD_ROUTINE,
    PackedPanels,
    _EpilogueValues,
    _is_raw,
    _round_up,
    anchor_kernel,
    contraction,
    destination,
    epilogue_nest,
    pack_weights,
)
from .schedule import two_ended_makespan
from .values import Unsupported, attrs_of

# Floats in one per-thread im2col tile: 96K floats = 384 KiB, inside a 512 KiB-1 MiB L2 with
# room left for the weight panel the contraction packs.
COL_TILE_FLOATS = 96 * 1024
# Floats in one output tile finished by the epilogue while hot.
OUT_TILE_FLOATS = 64 * 1024
# Narrowest pixel tile: OpenBLAS re-packs the weight panel (Cout x K) on every call, amortized
# over the tile's pixels, so tiles narrower than this lose more to packing than they gain in
# cache residency.
MIN_PIXEL_TILE = 128
# Tasks to aim for when splitting a conv over output channels as well as pixels (every split
# re-packs the im2col panel once more, so only as many as two threads need to balance).
MIN_TASKS = 4
# Tasks the pixels-as-columns methods aim for at least when the library contracts (`conv_tiles`):
# a thread slowed for a while costs the kernel only the tasks the other could not take over.
ROBUST_TASKS = 8
# Pixel tiles of a conv with fewer tasks than BALANCE_MAX_TASKS are chosen for the shortest
# schedule on BALANCE_THREADS threads (`_balanced_pixel_tile`), a task costing
# TASK_OVERHEAD_PIXELS pixel columns more than its product (the call, the B pack's set-up).
BALANCE_THREADS = 2
BALANCE_MAX_TASKS = 32
TASK_OVERHEAD_PIXELS = 16
# Im2col floats each float of the zero-padded input band must feed for an im2col to copy the
# band first (`_padded_im2col`).
PADDED_BAND_REUSE = 4
# Output channels of a split channel tile are a multiple of this: the A-panel height of the
# AVX-512 micro-kernel (AFC_MR; also a whole number of the portable kernel's 4-row panels).
CHANNEL_QUANTUM = 8
# A conv doubles its pixel tiles (rather than split its output channels) while its channel
# tiles would have fewer channels than this.
SPLIT_MIN_CHANNELS = 32
# Depthwise windows up to this many taps are unrolled by the generator (7x7 included).
MAX_UNROLLED_TAPS = 49
# Depthwise task size (`_depthwise_tasks`): multiply-adds a task aims at, and the fewest tasks.
DEPTHWISE_TASK_MACS = 1 << 15
DEPTHWISE_MIN_TASKS = 8
# Depthwise output rows at least this wide are finished by the epilogue one by one, while in L1
# (`_depthwise`); narrower rows leave too short a vector loop: their plane is finished at once.
DEPTHWISE_ROW_EPILOGUE_WIDTH = 48
# Padded depthwise planes of more floats than this zero only their border (`_depthwise_border`).
DEPTHWISE_BORDER_FLOATS = 4096
# Depthwise output planes at most this wide are computed flat (`_depthwise`).
DEPTHWISE_FLAT_WIDTH = 8
# Undilated depthwise 3x3s of stride 1 and 2 run in the library (afc.h: afc_dw3x3, afc_dw3x3_s2)
# where the zero-padded plane its AVX2 build copies each plane into takes at most this many floats
# (a 112x112 plane, or its 56x56 output at stride 2).
DEPTHWISE_LIBRARY_PAD_FLOATS = 16384
# Convs with fewer output pixels than this, not a whole number of column panels, put the pixels in
# the rows of the product (`pixels_as_rows`); im2col and 1x1 convs up to ROWS_MAX_IM2COL_PIXELS
# as well.
ROWS_MAX_PIXELS = 64
ROWS_MAX_IM2COL_PIXELS = 256
# Stride-1 convs whose weight the library packs read their taps straight from the zero-padded
# input band (`conv_direct`) where the band columns computed and dropped per output row ((kw - 1)
# * dw) are at most 1/DIRECT_MAX_DROP of the band width and the rows at least DIRECT_MIN_WIDTH
# wide (afc_conv_ap's masked stores put a 16-lane vector in at most two rows), with more than
# ROWS_MAX_IM2COL_PIXELS pixels. Measured in C, one thread, Zen 4 AVX-512, direct vs im2col: 3x3
# at 56-pixel rows (2 of 58 columns dropped) 102-106 vs 94-98 GFLOP/s; at 28-pixel rows (2 of 30)
# 95-101 vs 102-104, so those keep im2col. A tile of whole output rows spans at least
# DIRECT_TILE_COLUMNS flat band columns (output rows times the band width) and its band at most
# DIRECT_BAND_FLOATS floats (256 KiB: in L2 next to the weight's A-panels and the output tile).
DIRECT_MAX_DROP = 16
DIRECT_MIN_WIDTH = 16
DIRECT_TILE_COLUMNS = 256
DIRECT_BAND_FLOATS = 64 * 1024
# Stride-2 convs read their taps from the band in place with the pixels as rows (`_band_rows_shape`)
# from this many input channels on, in tiles of at least BAND_MIN_PIXELS pixels (`_band_min_rows`).
BAND_STRIDED_MIN_CHANNELS = 16
BAND_MIN_PIXELS = 64
# Pixel tiles of at most this many rows with the pixels as rows, a multiple of ROWS_QUANTUM: half
# an AVX-512 row panel, which the micro-kernel runs at half the cost (afc.c's `afc_ukernel`; on
# AVX2, 6-row panels, a tail of 4 runs 3 rows + 1), so
# 196 pixels split 100 + 96 (12.5 and 12 panels' work), not 104 + 92 (13 and 11.5): ResNet-50's
# 256-channel 3x3 at 14x14, one tile per thread, 1.17 -> 1.11 ms on two threads (Zen 4,
# benchmarks/anchor_ab.py), unchanged on one.
ROWS_PIXEL_TILE = 128
ROWS_QUANTUM = 4
# Tasks to aim for when an im2col conv with the pixels as rows splits its output channels: each
# channel tile that is a task of its own builds the whole im2col again (4608 x 49 floats for
# ResNet-50's last 3x3 convs), so only as many as the two threads need.
ROWS_IM2COL_MIN_TASKS = 2
# A 1x1 conv with the pixels as rows whose pixel tiles are already a task per thread keeps up to
# this many output channels in one tile: each channel tile that is a task of its own packs its
# pixel tile's activation again (K x 100 floats at 14x14). Both tilings in one process, two
# threads, every kernel's fastest of 45 profiled runs (Intel Xeon with AVX-512): MobileNetV2's
# 14x14 projections 384 -> 64 0.87-0.92 of their time, 576 -> 96 0.92-0.94, 192 -> 64 0.94,
# ResNet-50's 1024 -> 256 0.92-0.98; its wider expansions (64 -> 384, 96 -> 576: K of 64 and 96,
# cheap to pack) 1.06-1.15 so, and at 7x7 (one pixel tile) one task cannot feed two threads.
ROWS_WHOLE_CHANNELS = 256
# Floats of padding after each row of the transposed product's tile: its rows are a power of two
# of floats apart otherwise (512 channels: 2 KiB), so the column the transposed store reads maps
# onto two L1 sets and misses on every load.
TILE_ROW_PAD = 16
# Rows of one packed weight block are rounded to this: a multiple of every ISA's A-panel height
# (AFC_MR: 8, 6, 4), so the packed layout is Python arithmetic whatever -march builds the kernel.
A_PANEL_QUANTUM = 24
# Output channels per chunk of a 1x1 conv's tile whose epilogue runs chunk by chunk
# (`_epilogue_chunks`): a multiple of A_PANEL_QUANTUM, so a chunk starts at a whole A-panel on
# every ISA, and few enough that a chunk of a 224-pixel tile (21 KiB at 24) is still in L1 when
# its epilogue reads it.
EPILOGUE_CHUNK_ROWS = 24
# Floats of a tile's packed input pixels up to which that chunking applies (the library's
# AFC_AP_INPUT_FLOATS: afc_gemm_ap_in keeps that packing for the tile's chunks).
EPILOGUE_CHUNK_MAX_B_FLOATS = 1 << 16


class Shapes(Protocol):
    """Anything that knows the kernel's tensor shapes (KernelValues, codegen's Operands)."""

    def shape(self, name: str) -> tuple[int, ...]: ...


@dataclass(frozen=True)
class ConvGeometry:
    """A conv (or transposed conv) normalised to three spatial dims (depth, height, width): a 2-D
    conv has depth 1, a 1-D conv depth and height 1, so one code path serves all three."""

    n: int
    cin: int
    cout: int
    group: int
    h: int
    w: int
    oh: int
    ow: int
    kh: int
    kw: int
    sh: int
    sw: int
    dh: int
    dw: int
    pt: int  # top padding (height, begin)
    pl: int  # left padding (width, begin)
    d: int = 1  # depth (3-D only)
    od: int = 1
    kd: int = 1
    sd: int = 1
    dd: int = 1
    pf: int = 0  # front padding (depth, begin)

    @property
    def cig(self) -> int:
        return self.cin // self.group

    @property
    def cog(self) -> int:
        return self.cout // self.group

    @property
    def kdim(self) -> int:
        return self.cig * self.taps

    @property
    def taps(self) -> int:
        return self.kd * self.kh * self.kw

    @property
    def pixels(self) -> int:
        return self.od * self.oh * self.ow

    @property
    def plane(self) -> int:
        """Elements of one input channel."""
        return self.d * self.h * self.w


def _spatial(values: Sequence[int], nsp: int, default: int) -> list[int]:
    vals = [int(v) for v in values] if values else [default] * nsp
    return [default] * (3 - nsp) + vals


def _same_pad(size: int, out: int, k: int, s: int, d: int, mode: str) -> int:
    total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
    return total // 2 if mode == "SAME_UPPER" else total - total // 2


def conv_geometry(node: onnx.NodeProto, ops: Shapes) -> ConvGeometry:
    """Shapes, strides, dilations and begin paddings of a Conv or ConvTranspose node."""
    x = ops.shape(node.input[0])
    w = ops.shape(node.input[1])
    y = ops.shape(node.output[0])
    nsp = len(x) - 2
    if nsp not in (1, 2, 3) or len(w) != len(x) or len(y) != len(x):
        raise Unsupported(f"{node.op_type} with {nsp} spatial dims is not generated (1-D to 3-D are)")
    attrs = attrs_of(node)
    transpose = node.op_type == "ConvTranspose"
    group = int(attrs.get("group", 1))  # type: ignore[call-overload]
    k = _spatial(attrs.get("kernel_shape") or w[2:], nsp, 1)  # type: ignore[arg-type]
    s = _spatial(attrs.get("strides") or [], nsp, 1)  # type: ignore[arg-type]
    d = _spatial(attrs.get("dilations") or [], nsp, 1)  # type: ignore[arg-type]
    size = _spatial(x[2:], nsp, 1)
    out = _spatial(y[2:], nsp, 1)
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
    pads = [int(p) for p in attrs.get("pads") or [0] * (2 * nsp)]  # type: ignore[union-attr]
    begin = _spatial(pads[:nsp], nsp, 0)
    if transpose:
        out_pad = _spatial(attrs.get("output_padding") or [], nsp, 0)  # type: ignore[arg-type]
        if auto_pad in ("SAME_UPPER", "SAME_LOWER") or ("output_shape" in attrs and "pads" not in attrs):
            begin = []
            for a in range(3):
                total = s[a] * (size[a] - 1) + out_pad[a] + (k[a] - 1) * d[a] + 1 - out[a]
                begin.append(total // 2 if auto_pad == "SAME_UPPER" else total - total // 2)
        cin, cout = x[1], w[1] * group
    else:
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            begin = [_same_pad(size[a], out[a], k[a], s[a], d[a], auto_pad) for a in range(3)]
        elif auto_pad == "VALID":
            begin = [0, 0, 0]
        cin, cout = x[1], w[0]
        if w[1] * group != cin:
            raise Unsupported(f"Conv weights {w} do not match {cin} input channels in {group} groups")
    if cin % group or cout % group or y[1] != cout:
        raise Unsupported(f"{node.op_type} channels do not split into {group} groups")
    return ConvGeometry(
        n=x[0],
        cin=cin,
        cout=cout,
        group=group,
        h=size[1],
        w=size[2],
        oh=out[1],
        ow=out[2],
        kh=k[1],
        kw=k[2],
        sh=s[1],
        sw=s[2],
        dh=d[1],
        dw=d[2],
        pt=begin[1],
        pl=begin[2],
        d=size[0],
        od=out[0],
        kd=k[0],
        sd=s[0],
        dd=d[0],
        pf=begin[0],
    )


def conv_method(g: ConvGeometry) -> str:
    """The method a conv of this shape uses (recorded in the kernel)."""
    if g.cig == 1 and g.cog == 1 and g.d == g.od == g.kd == 1:
        return "conv_depthwise"
    pointwise = (g.kd, g.kh, g.kw, g.sd, g.sh, g.sw, g.pf, g.pt, g.pl) == (1, 1, 1, 1, 1, 1, 0, 0, 0)
    if pointwise and (g.od, g.oh, g.ow) == (g.d, g.h, g.w):
        return "conv1x1_gemm"
    if _direct_shape(g) and not _band_rows_shape(g):
        return "conv_direct"
    return "conv_im2col_tiled"


def _direct_shape(g: ConvGeometry) -> bool:
    """Whether a conv's taps are read from its input band in place (`conv_direct`, when the
    library packs its weight): 1-D or 2-D planes, output rows wide enough that the band columns
    computed and dropped per row ((kw - 1) * dw at stride 1; a strided conv's band is split in
    phase planes, `_fill_band`) cost little: 2 of 58 on ResNet-50's 56-pixel rows, 3 of 115 on
    its stem; its 28-pixel stride-1 rows, 2 of 30, keep im2col), and the band of the narrowest
    tile within DIRECT_BAND_FLOATS (ResNet-50's stride-2 3x3 of 128 channels into 28-pixel rows,
    four phase planes of 29 columns, would take 1-row tiles: it keeps im2col)."""
    wq = _phase_width(g, g.sw)
    # a strided conv's band is all of its input rows: every phase plane must feed some tap (a
    # stride-2 1x1 would copy four times the pixels it reads)
    rows_read = {ky * g.dh % g.sh for ky in range(g.kh)} == set(range(g.sh))
    cols_read = {kx * g.dw % g.sw for kx in range(g.kw)} == set(range(g.sw))
    return (
        g.d == g.od == g.kd == 1
        and rows_read
        and cols_read
        and g.ow >= DIRECT_MIN_WIDTH
        and (wq - g.ow) * DIRECT_MAX_DROP <= wq
        and g.pixels > ROWS_MAX_IM2COL_PIXELS
        and _direct_band_floats(g, _direct_min_rows(g)) <= DIRECT_BAND_FLOATS
    )


def _direct_band_floats(g: ConvGeometry, rt: int) -> int:
    """Floats of a `conv_direct` band for tiles of `rt` output rows (all phase planes)."""
    return g.cig * g.sh * g.sw * (rt + (g.kh - 1) * g.dh // g.sh) * _phase_width(g, g.sw)


def _direct_min_rows(g: ConvGeometry) -> int:
    """The fewest output rows of a `conv_direct` tile: DIRECT_TILE_COLUMNS band columns."""
    return min(g.oh, -(-DIRECT_TILE_COLUMNS // _phase_width(g, g.sw)))


def _balanced_rows(g: ConvGeometry, width: int, images: int, tile_channels: int, least: int) -> int:
    """Output rows per tile of the band methods: at least `least`, a band within
    DIRECT_BAND_FLOATS and a tile of `tile_channels` floats a pixel within OUT_TILE_FLOATS (both
    stay in L2), the one whose `images` x row tiles BALANCE_THREADS threads finish soonest
    (`_makespan` over `width` columns a row; the widest wins ties)."""
    best = lo = least
    best_span = _makespan(g.oh * width, lo * width, images, 1)
    for rt in range(lo + 1, g.oh + 1):
        if _direct_band_floats(g, rt) > DIRECT_BAND_FLOATS or rt * g.ow * tile_channels > OUT_TILE_FLOATS:
            break
        span = _makespan(g.oh * width, rt * width, images, 1)
        if span <= best_span:
            best, best_span = rt, span
    return best


def direct_tiles(g: ConvGeometry) -> tuple[int, int, int, int]:
    """(output rows per tile, row tiles, channel tile, channel tiles) of `conv_direct`: tiles of
    whole output rows (`_balanced_rows` over the flat band columns, the output tile the epilogue
    finishes in L2). Output channels split in two tiles only when the rows make fewer tasks than
    threads."""
    images = g.n * g.group
    best = _balanced_rows(g, _phase_width(g, g.sw), images, g.cog, _direct_min_rows(g))
    rtn = -(-g.oh // best)
    ct = g.cog
    if images * rtn < BALANCE_THREADS and g.cog >= 2 * CHANNEL_QUANTUM:
        ct = _round_up(-(-g.cog // BALANCE_THREADS), CHANNEL_QUANTUM)
    return best, rtn, ct, -(-g.cog // ct)


def pixels_as_rows(g: ConvGeometry) -> bool:
    """Whether a conv whose weight the library packs computes `Y^T = col^T x W^T` (module
    docstring): one image's pixels fit one tile but fill its column panels badly, or its taps are
    read in place from tiles of whole output rows (`_band_rows_shape`)."""
    if _band_rows_shape(g):
        return True
    if g.group != 1 or g.pixels % PANEL_QUANTUM == 0:
        return False
    return g.pixels < ROWS_MAX_PIXELS or (
        g.pixels <= ROWS_MAX_IM2COL_PIXELS and conv_method(g) in ("conv_im2col_tiled", "conv1x1_gemm")
    )


def _band_rows_shape(g: ConvGeometry) -> bool:
    """Whether a conv with more pixels than the other pixels-as-rows convs takes that path too,
    in tiles of whole output rows (`band_row_tiles`) whose taps `afc_conv_bp` reads from the
    zero-padded band in place, the weight's B-panels the only packed operand and every vector load
    aligned: 2-D convs of one group with more than one tap and at most CONV_BP_INPLACE_CHANNELS
    output channels whose narrowest tile's band fits DIRECT_BAND_FLOATS, at stride 1, or at
    stride 2 with at least BAND_STRIDED_MIN_CHANNELS input channels (the micro-kernel broadcasts
    a pixel's taps, so the stride only moves where they are read).

    Why: on Intel's AVX-512 cores an unaligned 64-byte load splits across two cache lines, and
    `conv_direct`'s vector loads are the band's runs at every tap offset (the micro-kernel alone,
    L1-resident, 183 -> 157 GFLOP/s with such loads; the peak is 213), while here they are the
    packed weight's and the band is only broadcast from. Measured with benchmarks/anchor_ab.py
    (Intel Xeon with AVX-512 and AMX, 2 vCPUs; fastest of 15-30 interleaved runs): ResNet-50's
    64-channel 3x3 at 56x56 against `conv_direct` 1.67-1.71 -> 1.57-1.61 ms on one thread (CPU
    time), 0.87-0.90 -> 0.90-0.91 ms on two; its 128-channel 3x3 at 28x28 against im2col
    1.74-1.79 -> 1.57 ms on one thread, 0.98 -> 0.81 ms on two; its 128-channel 3x3 of stride 2
    (56x56 to 28x28, 3-row tiles) against im2col 1.86-2.87 -> 1.65-2.64 ms on one thread (CPU
    time, 0.88-0.92), 1.32 -> 1.14 ms on two (Intel Xeon, Emerald Rapids). The stem (7x7, stride
    2, 3 channels) measured 1.75 -> 1.97 ms this way against `conv_direct`'s phase planes, so
    convs of few input channels keep their methods. Not measured on AMD hosts, where unaligned
    loads cost less."""
    return (
        g.group == 1
        and g.d == g.od == g.kd == 1
        and (g.sh == g.sw == 1 or (g.sh == g.sw == 2 and g.cig >= BAND_STRIDED_MIN_CHANNELS))
        and g.taps > 1
        and g.pixels > ROWS_MAX_IM2COL_PIXELS
        and g.cog <= CONV_BP_INPLACE_CHANNELS
        and _direct_band_floats(g, _band_min_rows(g)) <= DIRECT_BAND_FLOATS
    )


def _band_min_rows(g: ConvGeometry) -> int:
    """The fewest output rows of a `_band_rows_shape` tile: `_direct_min_rows` at stride 1; a
    strided conv's band grows twice as fast with its rows, so it takes tiles of at least
    BAND_MIN_PIXELS pixels instead (the weight's B-panels, from L2, stream past that many rows)."""
    if g.sh == 1:
        return _direct_min_rows(g)
    return min(g.oh, -(-BAND_MIN_PIXELS // g.ow))


def band_row_tiles(g: ConvGeometry) -> tuple[int, int]:
    """(output rows per tile, row tiles) of a `_band_rows_shape` conv (`_balanced_rows`, the
    tile holding the product's padded rows of pixels)."""
    best = _balanced_rows(g, g.ow, g.n, g.cog + TILE_ROW_PAD, _band_min_rows(g))
    return best, -(-g.oh // best)


def _pixel_tile(pixels: int, kdim: int, quantum: int = 16, widest: int | None = None) -> int:
    """Equal pixel tiles (multiples of `quantum`) of at most `widest` pixels (by default the most
    whose im2col of `kdim` rows fits COL_TILE_FLOATS, at least MIN_PIXEL_TILE)."""
    pt = max(MIN_PIXEL_TILE, COL_TILE_FLOATS // max(1, kdim)) if widest is None else widest
    if pt >= pixels:
        return pixels
    count = -(-pixels // pt)
    return min(pixels, _round_up(-(-pixels // count), quantum))


def _full_channel_pixel_tile(g: ConvGeometry, quantum: int) -> int | None:
    """The widest pixel tile (a multiple of `quantum`) whose output tile over all of a group's
    channels fits OUT_TILE_FLOATS, None when even MIN_PIXEL_TILE pixels do not.

    A 1x1 conv reads its activation in place and the library packs the pixel tile's activation
    (K x pixels) on every contraction call: a pixel tile split into channel tiles packs it once
    per channel tile, and each packed block then serves fewer weight rows. Splitting the pixels
    instead packs every activation float once. Measured on ResNet-50 (Zen 4, one thread, the
    kernels of both ways compiled side by side, fastest of 20 interleaved runs, CPU time): its
    64 -> 256 1x1 convs at 56x56 (K = 64), 4 pixel tiles of 800 x 4 channel tiles of 64 -> 14
    pixel tiles of 224, 1.35-1.78 -> 1.27-1.52 ms; its 128 -> 512 at 28x28, 2 x 416 pixels x 4 x
    128 channels -> 7 pixel tiles of 128, 1.29-1.39 -> 1.11-1.23 ms. The 256 -> 1024 at 14x14
    would still need two channel tiles of 512 (for 2 x 128 pixels instead of 196): no gain
    there (1.14-1.20 ms either way), so it keeps its tiles."""
    if g.cog * MIN_PIXEL_TILE > OUT_TILE_FLOATS:
        return None
    return max(MIN_PIXEL_TILE, OUT_TILE_FLOATS // g.cog // quantum * quantum)


def _makespan(pixels: int, pt: int, images: int, quantum: int) -> int:
    """Pixel columns (each tile rounded to half a panel, plus TASK_OVERHEAD_PIXELS) the busiest of
    BALANCE_THREADS threads computes when `images` x the pixel tiles of `pt` are handed out in
    order to whichever thread is free first (the kernels' dynamic schedule)."""
    full, rest = divmod(pixels, pt)
    sizes = ([pt] * full + ([rest] if rest else [])) * images
    loads = [0] * BALANCE_THREADS
    for size in sizes:
        loads[loads.index(min(loads))] += _round_up(size, max(1, quantum // 2)) + TASK_OVERHEAD_PIXELS
    return max(loads)


def _least_makespan_tile(
    size: int, tile: int, candidates: range, images: int, quantum: int, min_tasks: int
) -> int:
    """Of `tile` and the `candidates`, the tile whose `images` x tiles of `size` (pixels, or a
    1x1 conv's channels as the product's columns) BALANCE_THREADS threads finish soonest
    (`_makespan` in panels of `quantum`), the widest on a tie; candidates that leave fewer than
    `min_tasks` tasks are passed over."""
    best, best_span = tile, _makespan(size, tile, images, quantum)
    for cand in candidates:
        cand = min(cand, size)
        if images * -(-size // cand) < min_tasks:
            continue
        span = _makespan(size, cand, images, quantum)
        if span < best_span or (span == best_span and cand > best):
            best, best_span = cand, span
    return best


def _balanced_pixel_tile(pixels: int, pt: int, widest: int, images: int, quantum: int) -> int:
    """The pixel tile, `pt` or a multiple of `quantum` from MIN_PIXEL_TILE up to `widest` (the
    L2 bound) rounded up, whose few tasks the threads finish soonest: rounding tiles to whole
    panels can leave an odd count that no re-split evens out (784 pixels in 160-pixel tiles: 5
    tasks, one thread doing 3 of them, 464 pixels against 320; in 192-pixel tiles the fifth task
    is 16 pixels). The widest such tile wins ties; none that leaves fewer than MIN_TASKS tasks
    (channel tiles would split the product instead)."""
    lo = min(pt, _round_up(MIN_PIXEL_TILE, quantum))
    hi = min(max(pt, _round_up(widest, quantum)), _round_up(pixels, quantum))
    min_tasks = min(MIN_TASKS, images * -(-pixels // pt))
    return _least_makespan_tile(pixels, pt, range(lo, hi + 1, quantum), images, quantum, min_tasks)


def _balanced_channel_tile(channels: int, ct: int, base_tasks: int) -> int:
    """The channel tile of a 1x1 conv with the pixels as rows (channels: the product's columns):
    `ct` where it splits the channels evenly or there are pixel tiles for every thread
    (`base_tasks`), else the multiple of half a B panel whose channel tiles BALANCE_THREADS
    threads finish soonest (`_least_makespan_tile`), none that leaves fewer tasks than threads.
    Whole panels left MobileNetV2's 7x7 convs (one pixel tile of 49) unbalanced: 160 channels in
    tiles of 64, 64 and 32 kept one thread busy with 96 of them (two threads 1.53-1.58x faster
    than one, onnxruntime 1.85-1.89x; Zen 4), 320 in tiles of 96 one with 192; in tiles of 80 (two
    and a half panels) and 160 each thread computes half. Both tilings compiled into one process,
    each kernel profiled in alternating rounds, median of 30 x 10 runs on two threads (AMD EPYC
    Zen 4, AVX-512): 960 -> 160 88.3 -> 75.7 us, 576 -> 160 52.6 -> 45.5, 960 -> 320 170.1 -> 144.7,
    160 -> 960 (256 x 3 + 192 -> 480 x 2) 77.2 -> 73.9; on one thread within 1%."""
    if channels % ct == 0 or base_tasks >= BALANCE_THREADS:
        return ct
    half = PANEL_QUANTUM // 2
    candidates = range(half, _round_up(channels, half) + 1, half)
    return _least_makespan_tile(channels, ct, candidates, base_tasks, PANEL_QUANTUM, BALANCE_THREADS)


def _channel_tile(g: ConvGeometry, base_tasks: int, pt: int, min_tasks: int = MIN_TASKS) -> int:
    """Output channels per task: enough tasks for the threads, output tile within OUT_TILE_FLOATS,
    a multiple of CHANNEL_QUANTUM when split (the contraction runs whole A panels: MobileNetV2's
    96 channels in 5 tiles of 20 computed 3 panels, 24 rows, for each)."""
    macs = g.n * g.cout * g.pixels * g.kdim
    count = max(1, -(-g.cog * pt // OUT_TILE_FLOATS))
    if macs >= PARALLEL_MIN_MACS and base_tasks * count < min_tasks:
        count = max(count, min(-(-min_tasks // base_tasks), max(1, g.cog // 16)))
    count = min(count, g.cog)
    ct = -(-g.cog // count)
    return min(g.cog, _round_up(ct, CHANNEL_QUANTUM)) if ct > CHANNEL_QUANTUM else ct


def conv_tiles(g: ConvGeometry, quantum: int = 16, rows: bool = False) -> tuple[int, int, int, int]:
    """(pixel tile, pixel tiles, channel tile, channel tiles) of the GEMM methods' tasks; pixel
    tiles are multiples of `quantum` (the contraction library's PANEL_QUANTUM when it contracts:
    a tile of whole panels wastes no lanes, measured 97 -> 109 GFLOP/s for a 176- vs 192-pixel
    tile of ResNet-50's first 3x3 conv). With `rows` (pixels as rows) the pixel tile is the image
    and the channel tiles, now the product's columns, are whole panels, or half panels where that
    balances a 1x1 conv's threads (`_balanced_channel_tile`), or all of a 1x1 conv's up to
    ROWS_WHOLE_CHANNELS channels where its pixel tiles are a task per thread.

    A 1x1 conv whose weight the library packs (`quantum` PANEL_QUANTUM) narrows its pixel tile,
    down to MIN_PIXEL_TILE, so that all its output channels fit one tile of OUT_TILE_FLOATS, where
    they can (`_full_channel_pixel_tile`).

    With the library, tiles that leave fewer than ROBUST_TASKS tasks are narrowed (down to
    MIN_PIXEL_TILE) where that makes more tasks. Why: the threads take tasks one at a time, and on
    a shared host one of them often runs slower for a while (its neighbours' load, a late start);
    with four tasks the other cannot take over more than a quarter of the work. Measured on an AMD
    EPYC (Zen 4, 2 vCPUs, the AVX2 build), our runtime, both tilings compiled into one process and
    run in alternating 0.2 s blocks, 16 rounds, two runs each, median (fastest) ms on two threads:
    ResNet-50's 64 -> 64 1x1 at 56x56, 4 tiles of 800 -> 9 of 384: 0.318-0.383 (0.229-0.250) ->
    0.276-0.301 (0.230-0.231); MobileNetV2's 96 -> 24 at 56x56: 0.272 (0.153-0.162) -> 0.241-0.245
    (0.158-0.159); its 144 -> 24 at 56x56, 7 tiles of 512 -> 9 of 384: 0.366-0.381 -> 0.336-0.345
    (fastest 0.234-0.240 both); its 192 -> 32 at 28x28, 4 tiles of 224 -> 7 of 128: 0.147 (0.109) ->
    0.145 (0.102-0.104); the 28x28 1x1s of 5 -> 7 tasks (512 -> 128, 512 -> 256, 32 -> 192) within
    3% either way. Tried and not taken: at least 8 tasks for the band-rows 3x3s (64 channels at
    56x56, 7-row tiles: fastest 1.44 -> 1.54-1.58 ms, the halo rows and weight panels of each tile
    cost more than the balance gains) and for the 14x14 1x1s with the pixels as rows (1024 -> 256
    slower, 256 -> 1024 faster)."""
    p = g.pixels
    if rows and _band_rows_shape(g):
        rt, rtn = band_row_tiles(g)
        return rt * g.ow, rtn, g.cog, 1
    if rows:
        # equal pixel tiles of whole or half row panels (196 pixels: 100 + 96); channel tiles of
        # whole B panels
        count = -(-p // ROWS_PIXEL_TILE)
        pt = min(p, _round_up(-(-p // count), ROWS_QUANTUM))
        ptn = -(-p // pt)
        im2col = conv_method(g) == "conv_im2col_tiled"
        tasks = ROWS_IM2COL_MIN_TASKS if im2col else MIN_TASKS
        ct = min(g.cog, _round_up(_channel_tile(g, g.n * g.group * ptn, pt, tasks), PANEL_QUANTUM))
        if not im2col and g.n * g.group * ptn >= BALANCE_THREADS and g.cog <= ROWS_WHOLE_CHANNELS:
            ct = g.cog  # each pixel tile's activation packed once (ROWS_WHOLE_CHANNELS)
        elif not im2col:
            ct = _balanced_channel_tile(g.cog, ct, g.n * g.group * ptn)
        return pt, ptn, ct, -(-g.cog // ct)
    widest = max(MIN_PIXEL_TILE, COL_TILE_FLOATS // max(1, g.kdim))
    full = _full_channel_pixel_tile(g, quantum) if quantum == PANEL_QUANTUM else None
    if full is not None and conv_method(g) == "conv1x1_gemm":
        widest = min(widest, full)
    tiles = _column_tiles(g, quantum, widest)
    tiles_per_image = -(-ROBUST_TASKS // (g.n * g.group))
    narrow = _round_up(max(MIN_PIXEL_TILE, -(-p // tiles_per_image)), quantum)
    if quantum == PANEL_QUANTUM and _tasks(g, tiles) < ROBUST_TASKS and narrow < widest:
        more = _column_tiles(g, quantum, narrow)
        if _tasks(g, more) > _tasks(g, tiles):
            return more
    return tiles


def _tasks(g: ConvGeometry, tiles: tuple[int, int, int, int]) -> int:
    """The tasks of `conv_tiles`' tiles: images x groups x pixel tiles x channel tiles."""
    return g.n * g.group * tiles[1] * tiles[3]


def _column_tiles(g: ConvGeometry, quantum: int, widest: int) -> tuple[int, int, int, int]:
    """`conv_tiles` of the pixels-as-columns methods, pixel tiles at most `widest` pixels."""
    p = g.pixels
    pt = _pixel_tile(p, g.kdim, quantum, widest)
    ptn = -(-p // pt)
    if ptn > 1 and (g.n * g.group * ptn) % 2:
        pt = min(p, _round_up(-(-p // (ptn + 1)), quantum))
        ptn = -(-p // pt)
    keys = g.n * g.group * ptn
    if ptn > 1 and (keys % BALANCE_THREADS or p % pt) and keys < BALANCE_MAX_TASKS:
        # whole-panel rounding left the count odd, or an even count of unequal tiles: 784
        # pixels in 224-pixel tiles are 4 tasks, one thread doing 448 pixels against 336 (ResNet-50's
        # stride-2 downsample 256 -> 512, its channel tiles inside the task); in 192-pixel tiles
        # 5 tasks, 400 against 384: 1.18 -> 1.05 ms on two threads, 2.06 -> 2.13 on one (Zen 4)
        pt = _balanced_pixel_tile(p, pt, widest, g.n * g.group, quantum)
        ptn = -(-p // pt)
    ct = _channel_tile(g, g.n * g.group * ptn, pt)
    while ct < min(SPLIT_MIN_CHANNELS, g.cog) and pt >= 2 * quantum:
        # thin channel tiles each pack the pixel tile's activation again for a few rows of the
        # product: twice the pixel tiles instead, so the channels split in fewer, wider tiles
        pt = min(p, _round_up(-(-p // (2 * ptn)), quantum))
        ptn = -(-p // pt)
        ct = _channel_tile(g, g.n * g.group * ptn, pt)
    return pt, ptn, ct, -(-g.cog // ct)


_Finish = Callable[[tuple[Expr, Expr], tuple[Expr, Expr]], list[Stmt]]


class _ConvValues(_EpilogueValues):
    """Epilogue values of a conv: the raw product where the contraction left it, plus the conv's
    own bias `B[Cout]` read at the channel axis."""

    def __init__(self, spec: KernelSpec, match: AnchorMatch) -> None:
        super().__init__(spec, match)
        node = match.anchor
        self.bias = node.input[2] if len(node.input) > 2 and node.input[2] else None

    def _leaf(self, at: TensorAt) -> Expr | None:
        value = super()._leaf(at)
        if at.tensor != self.match.anchor.output[0] or self.bias is None or value is None:
            return value
        if math.prod(self.shape(self.bias)) != self.match.domain[1]:
            raise Unsupported(
                f"Conv bias {self.shape(self.bias)} does not match {self.match.domain[1]} channels"
            )
        return value + self._substitute(self.at(self.bias, [at.index[1]]))


@dataclass(frozen=True)
class _Post:
    """A conv's epilogue as the library's post-ops (afc.h: afc_gemm_ap_post, afc_store_t_post):
    the conv's bias per output channel, a residual of the output's shape, then Relu or Clip,
    applied to each tile of the last depth block on its accumulators before the store (AVX-512,
    AVX2; on the just-stored tile in the portable build), or, with the pixels as rows, on the
    transposed registers of the tile's store into NCHW. The generated epilogue instead reads
    the tile back after its product, a second pass over the output: on ResNet-50's 64 -> 256 1x1
    at 56x56 (Zen 5, two threads) 0.198 ms without an epilogue, 0.212 with the bias, 0.225 with
    bias, residual and Relu; with the post-ops 0.202 and 0.213. Run on the stored tile while it is
    in L1 they gained nothing there: the cost is the second pass over the data, not where the
    tile sits."""

    bias: Buffer | None
    residual: Buffer | None
    act: int
    lo: float = 0.0
    hi: float = 0.0

    def product(self, g: ConvGeometry, tile: tuple[Expr, ...], dest: Buffer) -> Call:
        """afc_gemm_ap_post's call for one tile: (rows, pixels, packed A at, B at, B's row stride,
        the first row's output channel, the tile's linear index in the output); the residual has
        the output's layout, so it is read at the same index."""
        m, n, a_at, b_at, ldb, channel, at = tile
        operands = (m, n, ir.index(g.kdim), a_at, b_at, ldb, ir.addr(dest, at), ir.index(g.pixels))
        return Call(PACKED_A_POST_ROUTINE, (*operands, *self.ops(g, channel, at)))

    def store(
        self, g: ConvGeometry, tile: tuple[Expr, Expr, Expr, Expr], dest: Buffer, at: tuple[Expr, Expr]
    ) -> Call:
        """afc_store_t_post's call for a pixels-as-rows tile: (pixels, channels, the tile, its
        row stride) stored at (the first row's output channel, the linear index in the output)."""
        channel, index = at
        operands = (*tile, ir.addr(dest, index), ir.index(g.pixels))
        return Call(STORE_T_POST_ROUTINE, (*operands, *self.ops(g, channel, index)))

    def ops(self, g: ConvGeometry, channel: Expr, at: Expr) -> tuple[Expr, ...]:
        """The post-op arguments of a tile whose first row is output `channel` and whose first
        value is at `at` in the output (where the residual, of the output's layout, is read)."""
        null = ir.raw("NULL", DType.I64)
        return (
            ir.addr(self.bias, channel) if self.bias is not None else null,
            ir.addr(self.residual, at) if self.residual is not None else null,
            ir.index(g.pixels),
            ir.index(self.act),
            ir.const(self.lo, DType.F32),
            ir.const(self.hi, DType.F32),
        )


def _post_ops(spec: KernelSpec, match: AnchorMatch, values: _ConvValues) -> _Post | None:
    """The kernel's epilogue as post-ops, None where it is anything else: [Add(residual)] then
    [Relu | Clip with constant bounds], in that order, each reading the previous value, the last
    one the kernel's only output."""
    if match.tail is not None or match.norm is not None or match.addend is not None or len(spec.outputs) != 1:
        return None
    value, residual, act, lo, hi = match.anchor.output[0], None, POST_NONE, 0.0, 0.0
    for node in match.epilogue:
        ins = [i for i in node.input if i]
        if act != POST_NONE or not ins or value not in ins:
            return None
        if node.op_type == "Add" and residual is None and len(ins) == 2 and ins[0] != ins[1]:
            residual = ins[1] if ins[0] == value else ins[0]
            if values.shape(residual) != tuple(match.domain) or values.dtype(residual) != DType.F32:
                return None
        elif node.op_type == "Relu":
            act = POST_RELU
        elif node.op_type == "Clip" and ins[0] == value:
            bounds = clip_bounds(node, spec.constants)
            if bounds is None:
                return None
            act, (lo, hi) = POST_CLIP, bounds
        else:
            return None
        value = node.output[0]
    if value != spec.outputs[0].name or (values.bias is None and residual is None and act == POST_NONE):
        return None
    try:  # a parameter or constant table; a value computed in the kernel has no buffer
        bias = values.buffer_of(values.bias) if values.bias is not None else None
        return _Post(bias, values.buffer_of(residual) if residual else None, act, lo, hi)
    except Unsupported:
        return None


def lower_conv(spec: KernelSpec, match: AnchorMatch | None = None) -> Kernel:
    """The kernel of a Conv or ConvTranspose `anchor` spec (its match computed here when not given)."""
    match = match or match_anchor(spec)
    node = match.anchor
    if node.op_type not in ("Conv", "ConvTranspose"):
        raise Unsupported(f"{node.op_type} anchors are not lowered by lower/conv.py")
    values = _ConvValues(spec, match)
    g = conv_geometry(node, values)
    x, w = match.operands[:2]
    for view in (x, w):
        if view.offset or view.strides != dense_strides(view.shape):
            raise Unsupported(f"Conv operand {view.tensor!r} is not dense (a conv takes no prologue)")
    out_buf, dest, _, _, flat = destination(spec, values, match, "conv epilogue")  # no norm, no tail
    values.raw_at = (out_buf[dest], None)
    write_back = None if _is_raw(match, dest) and values.bias is None else dest

    def finish(rows: tuple[Expr, Expr], cols: tuple[Expr, Expr]) -> list[Stmt]:
        if write_back is None and not flat:
            return []
        return [epilogue_nest(values, match, out_buf[dest], write_back, flat, out_buf, rows, cols)]

    transpose = node.op_type == "ConvTranspose"
    method = "conv_transpose_col2im" if transpose else conv_method(g)
    if not transpose and winograd_shape(g) and _packs_weight(values, w):
        method = "conv_winograd"
    if method == "conv_direct" and not _packs_weight(values, w):
        method = "conv_im2col_tiled"  # the band is read by the library's afc_conv_ap only
    weights: tuple[Buffer, Loop, int] | None = None
    body: list[Stmt] = []
    if math.prod(match.domain) and transpose:
        body = _col2im(g, values.buffer_of(x.tensor), values.buffer_of(w.tensor), out_buf[dest], finish)
    elif math.prod(match.domain) and g.kdim:
        if method == "conv_depthwise":
            lower = _depthwise_library if depthwise_in_library(g) else _depthwise
            body = lower(g, values.buffer_of(x.tensor), values.buffer_of(w.tensor), out_buf[dest], finish)
        elif method == "conv_winograd":
            weights = _winograd_weights(values, g, w)
            post = _post_ops(spec, match, values)
            body = _winograd(g, values.buffer_of(x.tensor), out_buf[dest], weights, post, finish)
        elif method == "conv_direct":
            _, _, ct, ctn = direct_tiles(g)
            weights = _packed_weights(values, g, w, (ct, ctn))
            assert weights is not None
            body = _direct(g, values.buffer_of(x.tensor), out_buf[dest], weights, finish)
        else:
            weights = _packed_weights(values, g, w)
            post = _post_ops(spec, match, values) if weights is not None else None
            body = _gemm_tiles(values, g, method, x, w, out_buf[dest], weights, finish, post)
    rows = weights is not None and method not in ("conv_direct", "conv_winograd") and pixels_as_rows(g)
    what = (
        f"method: {method}; {_schedule(g, method, weights is not None)}; "
        f"{node.op_type} {g.n}x{g.cin}x{g.d}x{g.h}x{g.w} -> {g.cout}x{g.od}x{g.oh}x{g.ow}, "
        f"kernel {g.kd}x{g.kh}x{g.kw}, stride {g.sd}x{g.sh}x{g.sw}, group {g.group}; epilogue "
        f"{' -> '.join(n.op_type for n in match.epilogue) or 'none'}"
        + ("; the weight packed once at load (contraction library)" if weights else "")
        + ("; pixels as rows (Y^T = col^T x W^T)" if rows else "")
    )
    return anchor_kernel(spec, values, body, what, [weights] if weights else [])


def _schedule(g: ConvGeometry, method: str, packed: bool) -> str:
    """The task split in words, for the kernel's description."""
    if method == "conv_transpose_col2im":
        ct, ctn = _transpose_tiles(g)
        return (
            f"{g.n} images x {g.group} groups x {ctn} channel blocks of {ct}; contraction "
            f"[{ct * g.taps}x{g.cig}]x[{g.cig}x{g.plane}] then scatter-add"
        )
    if method == "conv_depthwise":
        return f"{g.n * g.cout} channel planes, {g.kh}x{g.kw} window in {g.sw} column phase(s)"
    if method == "conv_winograd":
        rt, bands, kt, kblocks, tr = winograd_tiles(g)
        return (
            f"{g.n} images x {bands} bands of {rt} tile rows x {kblocks} channel tiles of {kt}; "
            f"Winograd F(2x2, 3x3): 16 products [tiles x {g.cin}]x[{g.cin} x {kt}] per block of "
            f"{tr} tile rows"
        )
    if method == "conv_direct":
        rt, rtn, ct, ctn = direct_tiles(g)
        return (
            f"{g.n} images x {g.group} groups x {rtn} tiles of {rt} output rows x {ctn} channel tiles "
            f"of {ct}; K = {g.kdim} read from a band of {g.sh}x{g.sw} phases of "
            f"{_phase_width(g, g.sw)}-column rows"
        )
    pt, ptn, ct, ctn = conv_tiles(g, PANEL_QUANTUM if packed else 16, packed and pixels_as_rows(g))
    return (
        f"{g.n} images x {g.group} groups x {ptn} pixel tiles of {pt} x {ctn} channel tiles of {ct}; "
        f"K = {g.kdim}"
    )


def _packs_weight(values: _ConvValues, w: OperandView) -> bool:
    """Whether the library contracts with this conv's weight packed once at load (an fp32
    constant, the `library` mode); otherwise OpenBLAS reads it in place."""
    if contraction_mode() != "library" or w.tensor not in values.spec.weights:
        return False
    b = values.buffer_of(w.tensor)
    return b.role == "input" and b.dtype is DType.F32


def _packed_weights(
    values: _ConvValues, g: ConvGeometry, w: OperandView, tiles: tuple[int, int] | None = None
) -> tuple[Buffer, Loop, int] | None:
    """The weight as the library's A-panels, one block per (group, channel tile of `conv_tiles`,
    or of `tiles` = (channel tile, channel tiles) where given), filled once at load (with the
    pixels as rows: `W^T[K x Cout]` as B-panels, one block per channel tile); None when OpenBLAS
    contracts (not a weight, or the `blas` mode)."""
    if not _packs_weight(values, w):
        return None
    b = values.buffer_of(w.tensor)
    if tiles is None and pixels_as_rows(g):
        _, _, ct, _ = conv_tiles(g, PANEL_QUANTUM, rows=True)
        return pack_weights(k=g.kdim, n=g.cog, nb=ct, b=b, offset=0, rs=1, cs=g.kdim)
    ct, ctn = tiles if tiles is not None else conv_tiles(g, PANEL_QUANTUM)[2:]
    block = _round_up(_round_up(ct, A_PANEL_QUANTUM) * max(g.kdim, 1), 16)
    packed = Buffer("packed_w", DType.F32, g.group * ctn * block, "packed")
    gi, t, c0 = ir.var("g"), ir.var("t"), ir.var("c0")
    pack = Call(
        PACK_A_ROUTINE,
        (
            ir.minimum(c0 + ct, g.cog) - c0,
            ir.index(g.kdim),
            ir.addr(b, (gi * g.cog + c0) * g.kdim),
            ir.index(g.kdim),
            ir.index(1),
            ir.addr(packed, (gi * ctn + t) * block),
        ),
    )
    fill = Loop(gi, g.group, (Loop(t, ctn, (Let(c0, t * ct), pack)),))
    return packed, fill, block


def _epilogue_chunks(g: ConvGeometry, pt: int, ct: int) -> bool:
    """Whether a `conv1x1_gemm` tile (channels as rows, the input's pixels read in place) runs
    as chunks of EPILOGUE_CHUNK_ROWS channels, each finished by the epilogue right after its
    product: with one product over all the tile's channels (256 x 224 pixels, 224 KiB), the
    epilogue reads the tile back from L2 and waits on its residual in one burst after it.
    The tile's packed pixels must fit the library's kept block."""
    return ct > EPILOGUE_CHUNK_ROWS and g.kdim * _round_up(pt, PANEL_QUANTUM) <= EPILOGUE_CHUNK_MAX_B_FLOATS


def _gemm_tiles(
    values: _ConvValues,
    g: ConvGeometry,
    method: str,
    x: OperandView,
    w: OperandView,
    dest: Buffer,
    weights: tuple[Buffer, Loop, int] | None,
    finish: _Finish,
    post: _Post | None = None,
) -> list[Stmt]:
    """`conv1x1_gemm` / `conv_im2col_tiled`: one contraction per (task, channel tile), or, for a
    1x1 conv with a generated epilogue whose tile's pixels fit the library's kept block
    (`_epilogue_chunks`), one per chunk of EPILOGUE_CHUNK_ROWS of the tile's channels, each
    finished right after its product. Where `post` says the epilogue is the library's post-ops,
    one call finishes each tile of the product before its store.

    Channel tiles run inside the task, sharing its im2col tile, when there are already enough
    tasks for the threads; otherwise each is a task of its own (the im2col of a pixel tile is
    then built once per channel tile: cheap next to the product, since a conv only needs
    channel tiles to make tasks when its pixels are few)."""
    x_buf, w_buf = values.buffer_of(x.tensor), values.buffer_of(w.tensor)
    pixels = g.pixels
    rows = weights is not None and pixels_as_rows(g)
    pt, ptn, ct, ctn = conv_tiles(g, PANEL_QUANTUM if weights is not None else 16, rows)
    keys = g.n * g.group * ptn
    im2col = method == "conv_im2col_tiled"
    # channel tiles inside the task (one im2col per pixel tile) when the tasks are enough
    # without them; with the pixels as rows, pixel tiles are balanced, so one per thread is
    inner = im2col and ctn > 1 and (keys >= MIN_TASKS or (rows and keys >= 2))
    tasks = keys if inner else keys * ctn
    macs = g.n * g.cout * pixels * g.kdim
    parallel = tasks > 1 and macs >= PARALLEL_MIN_MACS
    task, key, cb = ir.var("task"), ir.var("key"), ir.var("cb")
    pi, gi, ni = ir.var("pi"), ir.var("gi"), ir.var("ni")
    p0, p1, ch0, ch1, row0 = (ir.var(v) for v in ("p0", "p1", "ch0", "ch1", "row0"))
    head: list[Stmt] = [Let(key, task)] if inner else [Let(cb, task % ctn), Let(key, task // ctn)]
    head += [
        Let(pi, key % ptn),
        Let(gi, (key // ptn) % g.group),
        Let(ni, key // (ptn * g.group)),
        Let(p0, pi * pt),
        Let(p1, ir.minimum(p0 + pt, pixels)),
    ]
    xg = (ni * g.cin + gi * g.cig) * g.plane
    scratch: tuple[Buffer, ...] = ()
    # pixels as rows over a padded band: the library gathers each A block from the band itself
    band_rows = rows and im2col and _band_gather(g, pt)
    if band_rows:
        band = _band_rows(g, pt)
        pad = Buffer("pad", DType.F32, g.cig * band * _band_width(g), "scratch")
        scratch = (pad,)
        head += _im2col_padded(g, x_buf, xg, None, pad, band, p0, p1)
        b_ptr, ldb = ir.addr(x_buf, 0), ir.index(0)  # unused: the band is the operand
    elif im2col:
        col = Buffer("col", DType.F32, g.kdim * pt, "scratch")
        scratch = (col,)
        if _padded_im2col(g, pt):
            band = _band_rows(g, pt)
            pad = Buffer("pad", DType.F32, g.cig * band * _band_width(g), "scratch")
            scratch += (pad,)
            head += _im2col_padded(g, x_buf, xg, col, pad, band, p0, p1)
        else:
            head.append(_im2col(g, x_buf, xg, col, p0, p1))
        b_ptr, ldb = ir.addr(col, 0), p1 - p0
    else:
        b_ptr, ldb = ir.addr(x_buf, xg + p0), ir.index(pixels)
    a: Expr | PackedPanels
    product: list[Stmt]
    finished = kept = False
    if rows:
        # Y^T[pixels x channels] = col^T x W^T into this thread's `tile`, then stored transposed
        assert weights is not None
        packed, _, block = weights
        ldt = ct + TILE_ROW_PAD
        tile = Buffer("tile", DType.F32, pt * ldt, "scratch")
        scratch += (tile,)
        if band_rows:
            wpd = _band_width(g)
            geometry = (g.ow, g.sh, g.sw)
            taps = (band * wpd, wpd, g.kh, g.kw, g.dh, g.dw)
            tile_product: Stmt = Call(
                DIRECT_ROWS_CONV_ROUTINE,
                (
                    p1 - p0,
                    ch1 - ch0,
                    ir.index(g.kdim),
                    p0,
                    *(ir.index(v) for v in geometry),
                    ir.addr(pad, 0),
                    *(ir.index(v) for v in taps),
                    ir.addr(packed, cb * block),
                    ir.addr(tile, 0),
                    ir.index(ldt),
                ),
            )
        else:
            # the channel tiles of a 1x1 conv of one pixel tile (7x7) all read the same activation:
            # each thread packs it once per call, not once per channel tile it takes (MobileNetV2's
            # 960 -> 320 at 7x7 in 4 tiles, two threads, Intel Xeon: 0.94-0.96 of the time,
            # ResNet-50's 2048 -> 512 0.98; benchmarks/anchor_ab.py)
            kept = not im2col and ptn == 1 and ctn > 1
            tile_product = contraction(
                trans_a=True,
                m=p1 - p0,
                n=ch1 - ch0,
                k=g.kdim,
                alpha=1.0,
                a=b_ptr,
                lda=ldb,
                b=PackedPanels(ir.addr(packed, cb * block)),
                c=ir.addr(tile, 0),
                ldc=ldt,
                a_input=kept,
            )
        stored, at = (p1 - p0, ch1 - ch0, ir.addr(tile, 0), ir.index(ldt)), row0 * pixels + p0
        if post is not None:  # the epilogue on the transposed registers, not a pass after the store
            store = post.store(g, stored, dest, (gi * g.cog + ch0, at))
            finished = True
        else:
            store = Call(STORE_T_ROUTINE, (*stored, ir.addr(dest, at), ir.index(pixels)))
        product = [tile_product, store]
    elif (
        weights is not None
        and not im2col
        and post is None
        and _epilogue_chunks(g, pt, ct)
        and finish((ch0, ch1), (p0, p1))
    ):
        # (with a generated epilogue to finish) a 1x1 conv's tile in chunks of EPILOGUE_CHUNK_ROWS
        # output channels, each finished while in L1, the tile's pixels packed once for all its
        # chunks (an epilogue of post-ops takes the whole-tile call below: nothing to read back)
        packed, _, block = weights
        rc, rn = ir.var("rc"), ir.var("rn")
        a_at = ir.addr(packed, (gi * ctn + cb) * block + rc * g.kdim)
        at = (row0 + rc) * pixels + p0
        one = ir.const(1.0, DType.F32)
        operands = (a_at, b_ptr, ldb, ir.index(1), ir.addr(dest, at), ir.index(pixels))
        chunk: list[Stmt] = [
            Let(rn, ir.minimum(ch1 - ch0 - rc, EPILOGUE_CHUNK_ROWS)),
            Call(PACKED_A_INPUT_ROUTINE, (rn, p1 - p0, ir.index(g.kdim), one, *operands)),
            *finish((row0 + rc, row0 + rc + rn), (p0, p1)),
        ]
        product = [Loop(rc, ch1 - ch0, tuple(chunk), step=EPILOGUE_CHUNK_ROWS)]
        finished = kept = True
    elif weights is not None and post is not None:
        # the library finishes each tile of the last depth block before storing it
        packed, _, block = weights
        a_at = ir.addr(packed, (gi * ctn + cb) * block)
        tile = (ch1 - ch0, p1 - p0, a_at, b_ptr, ldb, gi * g.cog + ch0, row0 * pixels + p0)
        product = [post.product(g, tile, dest)]
        finished = True
    else:
        if weights is not None:
            packed, _, block = weights
            a = PackedPanels(ir.addr(packed, (gi * ctn + cb) * block))
        else:
            a = ir.addr(w_buf, (gi * g.cog + ch0) * g.kdim)
        product = [
            contraction(
                trans_a=False,
                m=ch1 - ch0,
                n=p1 - p0,
                k=g.kdim,
                alpha=1.0,
                a=a,
                lda=g.kdim,
                b=b_ptr,
                ldb=ldb,
                c=ir.addr(dest, row0 * pixels + p0),
                ldc=pixels,
            )
        ]
    per_tile: list[Stmt] = [
        Let(ch0, cb * ct),
        Let(ch1, ir.minimum(ch0 + ct, g.cog)),
        Let(row0, ni * g.cout + gi * g.cog + ch0),
        *product,
        *([] if finished else finish((row0, row0 + (ch1 - ch0)), (p0, p1))),
    ]
    head += [Loop(cb, ctn, tuple(per_tile))] if inner else per_tile
    loop = Loop(task, tasks, tuple(head), parallel=parallel, dynamic=parallel, scratch=scratch, macs=macs)
    # afc_gemm_ap_in keeps its packing for the call's later chunks: the call's start is marked
    return [Call(BEGIN_CALL_ROUTINE, ()), loop] if kept else [loop]


def _im2col(g: ConvGeometry, x: Buffer, xg: Expr, col: Buffer, p0: Expr, p1: Expr) -> Loop:
    """`col[(c, kd, kh, kw)][p - p0]` for output pixels [p0, p1) of one group's input channels,
    zero off the image: per tap and output row, a zero run, a (strided) copy run and a zero
    run, bounds worked out once per row so that the copy loop has no checks."""
    kk, ci, kz, ky, kx = ir.var("kk"), ir.var("ci"), ir.var("kz"), ir.var("ky"), ir.var("kx")
    orow, iz, iy, off, rb = ir.var("orow"), ir.var("iz"), ir.var("iy"), ir.var("off"), ir.var("rb")
    q0, q1, lo, hi, dst = ir.var("q0"), ir.var("q1"), ir.var("lo"), ir.var("hi"), ir.var("dst")
    ox = ir.var("ox")
    zero = ir.const(0.0, DType.F32)

    def run(start: Expr, stop: Expr, value: Expr | None) -> Loop:
        return Loop(
            ox, stop, (Store(col, dst + ox, value if value is not None else zero),), vector=True, start=start
        )

    in_rows = ir.logical_and(
        ir.logical_and(ir.ge(iz, 0), ir.lt(iz, g.d)), ir.logical_and(ir.ge(iy, 0), ir.lt(iy, g.h))
    )
    copy = ir.load(x, rb + ox * g.sw + off)
    row = (
        Let(iz, (orow // g.oh) * g.sd - g.pf + kz * g.dd),
        Let(iy, (orow % g.oh) * g.sh - g.pt + ky * g.dh),
        Let(q0, ir.maximum(p0 - orow * g.ow, 0)),
        Let(q1, ir.minimum(p1 - orow * g.ow, g.ow)),
        Let(dst, kk * (p1 - p0) + orow * g.ow - p0),
        If(
            in_rows,
            (
                Let(rb, xg + ci * g.plane + (iz * g.h + iy) * g.w),
                Let(lo, ir.clamp(ir.select(ir.lt(off, 0), (-off + (g.sw - 1)) // g.sw, 0), q0, q1)),
                Let(hi, ir.clamp(ir.select(ir.ge(g.w - 1 - off, 0), (g.w - 1 - off) // g.sw + 1, 0), lo, q1)),
                run(q0, lo, None),
                run(lo, hi, copy),
                run(hi, q1, None),
            ),
            (run(q0, q1, None),),
        ),
    )
    return Loop(
        kk,
        g.kdim,
        (
            Let(ci, kk // g.taps),
            Let(kz, (kk // (g.kh * g.kw)) % g.kd),
            Let(ky, (kk // g.kw) % g.kh),
            Let(kx, kk % g.kw),
            Let(off, kx * g.dw - g.pl),
            Loop(orow, (p1 - 1) // g.ow + 1, row, start=p0 // g.ow),
        ),
    )


def _padded_im2col(g: ConvGeometry, pt: int) -> bool:
    """Whether the im2col of a conv goes through a zero-padded copy of its input band
    (`_im2col_padded`): 2-D and 1-D convs whose band (the input rows a pixel tile reads, whole
    rows) is at most 1/PADDED_BAND_REUSE of the im2col tile, so that the copy is repaid by the
    per-row bounds work it saves. Measured on ResNet-50 and MobileNetV2 (one thread): stride-1
    3x3 convs (each input read 9 times, band 18-24% of the tile) and ResNet-50's 7x7 stem (12%)
    gain 3-6%; stride-2 3x3 convs (band 48-64%) gain on 7-pixel rows, lose up to 9% on 28- and
    112-pixel rows; strided 1x1 convs (band = tile, no padding) lose 10%."""
    if g.d != 1 or g.od != 1 or g.kd != 1:
        return False
    return PADDED_BAND_REUSE * g.cig * _band_rows(g, pt) * _band_width(g) <= g.kdim * pt


def _band_gather(g: ConvGeometry, pt: int) -> bool:
    """Whether a conv with its pixels as rows reads its taps from the zero-padded band
    (`afc_conv_bp`) rather than from an im2col tile: 2-D and 1-D convs whose band is no larger
    than the im2col tile. The band is then the only copy of the activation (an im2col tile is
    packed once more), so it needs no PADDED_BAND_REUSE margin: a stride-2 3x3 (band 53% of the
    tile) gathers from it, a stride-2 1x1 (the band holds 4x the pixels it reads) does not.
    Measured on ResNet-50 (one thread, process CPU time, Zen 4 AVX-512): its 14x14 3x3 convs
    2.25-2.28 -> 2.13-2.14 ms."""
    if g.d != 1 or g.od != 1 or g.kd != 1:
        return False
    return g.cig * _band_rows(g, pt) * _band_width(g) <= g.kdim * pt


def _band_rows(g: ConvGeometry, pt: int) -> int:
    """Padded input rows the widest pixel tile `pt` reads: its output rows (a tile starting
    anywhere in a row spans at most (pt + ow - 2) // ow + 1 of them) and the kernel's reach."""
    out_rows = min(g.oh, (pt + g.ow - 2) // g.ow + 1)
    return (out_rows - 1) * g.sh + (g.kh - 1) * g.dh + 1


def _band_width(g: ConvGeometry) -> int:
    """Padded input columns the output row reads (left padding included)."""
    return (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1


def _im2col_padded(
    g: ConvGeometry, x: Buffer, xg: Expr, col: Buffer | None, pad: Buffer, band: int, p0: Expr, p1: Expr
) -> list[Stmt]:
    """`_im2col` through a zero-padded copy of the input rows that output pixels [p0, p1) read
    (`pad[c][row][column]`, `band` rows per channel, in this thread's workspace): the bounds are
    worked out once per input channel row, with compile-time column runs, and every tap's row of
    the tile is then a plain (strided) copy. On ResNet-50's 14- and 7-pixel rows the per-row
    bounds of `_im2col` (a 7-float copy each) cost more than the copy. Without `col`, only the band
    (the library's `afc_conv_bp` gathers from it)."""
    wpd = _band_width(g)
    ci, r0, r1, y0 = ir.var("ci"), ir.var("r0"), ir.var("r1"), ir.var("y0")
    kk, ky, kx, orow = ir.var("kk"), ir.var("ky"), ir.var("kx"), ir.var("orow")
    q0, q1, dst, src, ox = ir.var("q0"), ir.var("q1"), ir.var("dst"), ir.var("src"), ir.var("ox")
    band_fill = _fill_band(g, x, xg, pad, band * wpd, (r1 - r0 - 1) * g.sh + ((g.kh - 1) * g.dh + 1), y0)
    head = [Let(r0, p0 // g.ow), Let(r1, (p1 - 1) // g.ow + 1), Let(y0, r0 * g.sh - g.pt), band_fill]
    if col is None:
        return head
    gather = Loop(
        kk,
        g.kdim,
        (
            Let(ci, kk // g.taps),
            Let(ky, (kk // g.kw) % g.kh),
            Let(kx, kk % g.kw),
            Loop(
                orow,
                r1,
                (
                    Let(q0, ir.maximum(p0 - orow * g.ow, 0)),
                    Let(q1, ir.minimum(p1 - orow * g.ow, g.ow)),
                    Let(dst, kk * (p1 - p0) + orow * g.ow - p0),
                    Let(src, (ci * band + (orow - r0) * g.sh + ky * g.dh) * wpd + kx * g.dw),
                    Loop(
                        ox,
                        q1,
                        (Store(col, dst + ox, ir.load(pad, src + ox * g.sw)),),
                        vector=True,
                        start=q0,
                    ),
                ),
                start=r0,
            ),
        ),
    )
    return [*head, gather]


def _fill_band(
    g: ConvGeometry,
    x: Buffer,
    xg: Expr,
    pad: Buffer,
    plane: Expr | int,
    rows: Expr,
    y0: Expr,
    phases: tuple[int, int] = (1, 1),
    phase: Expr | int = 0,
) -> Loop:
    """The zero-padded band of one group's input channels: `rows` rows from input row `y0` on
    (rows off the image are zeros), `_band_width` columns each (the left padding's zeros, the
    input row, zeros), channel c's rows from `pad[c * plane]` on. The bounds are worked out once
    per row and the column runs are compile-time constants.

    With `phases` = (sh, sw) (`conv_direct` of a strided conv) the band is split into sh x sw
    phase planes of `phase` floats, row phase a and column phase b at `(a * sw + b) * phase`:
    padded row a + i * sh, column b + j * sw at row i, column j of its plane (`_phase_width`
    columns), and `rows` counts the rows of a plane; the taps of a strided conv then read unit
    stride runs, as a stride-1 conv's do."""
    rs, cs = phases
    wq = _phase_width(g, cs)
    ci, i, xx = ir.var("ci"), ir.var("yy"), ir.var("xx")
    zero = ir.const(0.0, DType.F32)

    def fill(start: int, stop: int, value: Expr | None) -> list[Stmt]:
        if stop <= start:
            return []
        v = value if value is not None else zero
        return [Loop(xx, stop, (Store(pad, rowd + xx, v),), vector=True, start=start)]

    body: list[Stmt] = []
    for a in range(rs):
        for b in range(cs):
            suffix = "" if rs * cs == 1 else f"_{a}_{b}"
            iy, rowd = ir.var("iy" + suffix), ir.var("rowd" + suffix)
            # plane columns [lo, hi) hold input columns (j * cs + b - pl) in [0, w)
            lo = min(max(0, -(-(g.pl - b) // cs)), wq)
            hi = max(lo, min(-(-(g.w + g.pl - b) // cs), wq))
            copy = ir.load(x, xg + ci * g.plane + iy * g.w + (xx * cs + (b - g.pl)))
            body += [
                Let(iy, y0 + i * rs + a),
                Let(rowd, ci * plane + (a * cs + b) * phase + i * wq),
                If(
                    ir.logical_and(ir.ge(iy, 0), ir.lt(iy, g.h)),
                    (*fill(0, lo, None), *fill(lo, hi, copy), *fill(hi, wq, None)),
                    tuple(fill(0, wq, None)),
                ),
            ]
    return Loop(ci, g.cig, (Loop(i, rows, tuple(body)),))


def _phase_width(g: ConvGeometry, sw: int) -> int:
    """Columns of a band's rows split into `sw` column phases (`_fill_band`): the band width
    rounded up to whole phases, over `sw`."""
    return -(-_band_width(g) // sw)


def _direct(
    g: ConvGeometry, x: Buffer, dest: Buffer, weights: tuple[Buffer, Loop, int], finish: _Finish
) -> list[Stmt]:
    """`conv_direct`: per task (image, group, tile of `rt` whole output rows, channel tile), the
    zero-padded band of the input rows the tile reads (`_fill_band`, the only copy of the
    activation), then one `afc_conv_ap` call that reads every tap of the implicit im2col from the
    band in place and writes the output rows, then the epilogue on them. Against im2col + B
    packing (`conv_im2col_tiled`) this drops two copies of K x pixels floats per tile: measured
    in C on ResNet-50's 64-channel 3x3 conv at 56x56, one thread, Zen 4: 96-98 -> 102-106
    GFLOP/s on AVX-512, 91-95 -> 96-101 on AVX2 (the FMA peak is 117)."""
    rt, rtn, ct, ctn = direct_tiles(g)
    packed, _, block = weights
    wp, reach, nph = _phase_width(g, g.sw), (g.kh - 1) * g.dh // g.sh, g.sh * g.sw
    # the library reads dropped columns up to a panel and a plane row past the last channel
    slack = PANEL_QUANTUM + wp
    pad = Buffer("pad", DType.F32, g.cig * nph * (rt + reach) * wp + slack, "scratch")
    pixels = g.pixels
    tasks = g.n * g.group * rtn * ctn
    macs = g.n * g.cout * pixels * g.kdim
    parallel = tasks > 1 and macs >= PARALLEL_MIN_MACS
    task, key, cb, ri, gi, ni = (ir.var(v) for v in ("task", "key", "cb", "ri", "gi", "ni"))
    r0, rows, phase, plane, p0, ch0, ch1, row0, xx = (
        ir.var(v) for v in ("r0", "rows", "phase", "plane", "p0", "ch0", "ch1", "row0", "xx")
    )
    zero = ir.const(0.0, DType.F32)
    body: list[Stmt] = [
        Let(cb, task % ctn),
        Let(key, task // ctn),
        Let(ri, key % rtn),
        Let(gi, (key // rtn) % g.group),
        Let(ni, key // (rtn * g.group)),
        Let(r0, ri * rt),
        Let(rows, ir.minimum(r0 + rt, g.oh) - r0),
        Let(phase, (rows + reach) * wp),
        Let(plane, phase * nph),
        Let(p0, r0 * g.ow),
        _fill_band(
            g,
            x,
            (ni * g.cin + gi * g.cig) * g.plane,
            pad,
            plane,
            rows + reach,
            r0 * g.sh - g.pt,
            (g.sh, g.sw),
            phase,
        ),
        Loop(xx, plane * g.cig + slack, (Store(pad, xx, zero),), vector=True, start=plane * g.cig),
        Let(ch0, cb * ct),
        Let(ch1, ir.minimum(ch0 + ct, g.cog)),
        Let(row0, ni * g.cout + gi * g.cog + ch0),
        Call(
            DIRECT_CONV_ROUTINE,
            (
                ch1 - ch0,
                rows,
                ir.index(g.ow),
                ir.index(g.kdim),
                ir.addr(packed, (gi * ctn + cb) * block),
                ir.addr(pad, 0),
                plane,
                phase,
                ir.index(wp),
                ir.index(g.sh),
                ir.index(g.sw),
                ir.index(g.kh),
                ir.index(g.kw),
                ir.index(g.dh),
                ir.index(g.dw),
                ir.addr(dest, row0 * pixels + p0),
                ir.index(pixels),
            ),
        ),
        *finish((row0, row0 + (ch1 - ch0)), (p0, p0 + rows * g.ow)),
    ]
    return [Loop(task, tasks, tuple(body), parallel=parallel, dynamic=parallel, scratch=(pad,), macs=macs)]


# Channels per vector of the Winograd transforms (afc.c: AFC_WINO_LANES): a conv's input and
# output channels must be multiples of it.
WINO_LANES = 16
# Floats of a block's transformed input (16 x its tiles x the input channels) the tile rows of a
# block are chosen to fit, 1 MiB: a block streams its channel tile's transformed weight (16 x
# input x output channels) once, so larger blocks read it less often. ResNet-50's 256-channel
# 3x3 at 14x14 on two threads (Zen 4, in C): blocks of 2 tile rows 0.548 ms, of 7 0.491.
WINO_BLOCK_FLOATS = 1 << 18
# The input copy and transform of a tile per input channel, in the products' multiply-adds per
# output channel (16): on ResNet-50's 64-channel 3x3 at 56x56 (one thread, Zen 4) the call took
# 1.14 ms, its products 0.91 (16 x 64 x 64 multiply-adds a tile), the output transform and store
# 0.07, the copy and transform the remaining 0.17. A task repeats them for its own output
# channels and for the tile row above and below its band (`winograd_tiles`).
WINO_INPUT_MACS = 12
# A task's fixed cost in tiles' products (its calls, the partial panels of its blocks).
WINO_TASK_TILES = 1
# Floats of a conv's transformed weight (16 x input x output channels) above which it is
# "weight-bound": a channel tile's transforms no longer stay in a core's L2 between tasks, so
# every task streams its tile's (16 x input channels x its output channels) from L3 again, and
# fewer, larger tasks beat the ROBUST_TASKS preference. ResNet-50's 256-channel 3x3 at 14x14
# (4 MiB of transforms) in the model, AMD EPYC Zen 5, two threads, all its Winograd convs
# together: 14 tasks of one tile row 5.25 ms, 2 tasks (the whole image, two channel tiles) 4.24;
# the AVX2 build 9.34 -> 8.12; one thread 8.70 -> 7.62. At 28x28 (1 MiB) and 56x56 the
# 14-task splits stay as good or better (2 tasks at 56x56: 5.80 -> 7.07 ms).
WINO_L2_FLOATS = 1 << 18


def winograd_shape(g: ConvGeometry) -> bool:
    """Whether a conv runs as Winograd F(2x2, 3x3) (`conv_winograd`, afc.h: afc_wino3x3): a 2-D
    3x3 conv of stride 1, undilated, padding 1 (the output the input's size), one group, even
    height and width, channels in whole transform vectors (ResNet's 3x3s but those at 7x7 and the
    strided ones). Its products do 16 multiply-adds per 2x2 output tile and channel pair where the
    direct sum does 36; the transforms' coefficients (0, +-1, 1/2) are exact, so the results
    differ from the direct sum's by rounding only (ResNet-50's logits within 6.6e-6 of
    onnxruntime's, 5.7e-6 with the direct sum). ResNet-50's 64-channel 3x3 at 56x56, one thread,
    AMD EPYC Zen 4 (AVX-512), in C: 2.04 ms by the direct sum (afc_conv_bp), 1.14 by this."""
    return (
        g.d == g.od == g.kd == 1
        and (g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, g.pt, g.pl) == (3, 3, 1, 1, 1, 1, 1, 1)
        and g.group == 1
        and (g.oh, g.ow) == (g.h, g.w)
        and g.h % 2 == 0
        and g.w % 2 == 0
        and g.cin % WINO_LANES == 0
        and g.cout % WINO_LANES == 0
    )


def winograd_tiles(g: ConvGeometry) -> tuple[int, int, int, int, int]:
    """(tile rows per task, bands, output channels per task, channel tiles, tile rows per block)
    of `conv_winograd`: of the splits into equal bands of tile rows and channel tiles of whole
    B panels, the one BALANCE_THREADS threads finish soonest (each task's tiles costed as their
    products plus the input copy and transform, which a channel tile repeats, plus the input of
    the band's halo and WINO_TASK_TILES tiles a task), preferring at least ROBUST_TASKS tasks,
    then fewer tasks (weight-bound convs, over WINO_L2_FLOATS of transforms: the soonest
    finished, then fewer tasks). A block's tile rows keep its transformed input within
    WINO_BLOCK_FLOATS."""
    th, tw = g.oh // 2, g.ow // 2
    robust = 16 * g.cin * g.cout <= WINO_L2_FLOATS
    splits = [1] + [b for b in (2, 4) if g.cout % (b * PANEL_QUANTUM) == 0]
    best: tuple[tuple[bool, float, int], tuple[int, int, int, int]] | None = None
    for kblocks in splits:
        kt = g.cout // kblocks
        for bands in range(1, th + 1):
            rt = -(-th // bands)
            real = -(-th // rt)
            # tasks in loop order: bands outer, channel tiles inner
            sizes = [min(rt, th - i * rt) for i in range(real) for _ in range(kblocks)] * g.n
            costs = [
                size * tw * (kt + WINO_INPUT_MACS) + tw * WINO_INPUT_MACS + WINO_TASK_TILES * kt
                for size in sizes
            ]
            key = (robust and len(sizes) < ROBUST_TASKS, two_ended_makespan(costs), len(sizes))
            if best is None or key < best[0]:
                best = (key, (rt, real, kt, kblocks))
    assert best is not None
    rt, real, kt, kblocks = best[1]
    tr = max(1, min(rt, WINO_BLOCK_FLOATS // (16 * tw * g.cin)))
    return rt, real, kt, kblocks, tr


def _winograd_weights(values: _ConvValues, g: ConvGeometry, w: OperandView) -> tuple[Buffer, Loop, int]:
    """The weight's 16 Winograd transforms as B-panels (afc_wino3x3_pack), filled once at load:
    the packed buffer, its fill, and the floats between transforms (whole PANEL_QUANTUM-column
    panels, so that a channel tile's panels start at a multiple of it on every ISA)."""
    ldu = _round_up(g.cout, PANEL_QUANTUM) * g.cin
    packed = Buffer("packed_w", DType.F32, 16 * ldu, "packed")
    t = ir.var("t")
    pack = Call(
        WINOGRAD_PACK_ROUTINE,
        (
            ir.index(g.cin),
            ir.index(g.cout),
            ir.addr(values.buffer_of(w.tensor), 0),
            ir.addr(packed, 0),
            ir.index(ldu),
        ),
    )
    return packed, Loop(t, 1, (pack,)), ldu


def _winograd(
    g: ConvGeometry,
    x: Buffer,
    dest: Buffer,
    weights: tuple[Buffer, Loop, int],
    post: _Post | None,
    finish: _Finish,
) -> list[Stmt]:
    """`conv_winograd`: per task (image, band of tile rows, channel tile) one afc_wino3x3 call,
    which copies the band's input rows, transforms them, runs the 16 products and the output
    transform and stores the output rows with the post-ops; an epilogue the post-ops cannot
    express runs after it on the task's output rows."""
    rt, bands, kt, kblocks, tr = winograd_tiles(g)
    packed, _, ldu = weights
    th = g.oh // 2
    ws = Buffer(
        "wino",
        DType.F32,
        (2 * tr + 2) * (g.w + 2) * g.cin + 8 * tr * g.w * (g.cin + kt) + 2 * tr * g.w * kt,
        "scratch",
    )
    tasks = g.n * bands * kblocks
    macs = g.n * g.cout * g.pixels * g.kdim
    parallel = tasks > 1 and macs >= PARALLEL_MIN_MACS
    task, kb, bi, ni, ty0, ty1, k0, row0, p0 = (
        ir.var(v) for v in ("task", "kb", "bi", "ni", "ty0", "ty1", "k0", "row0", "p0")
    )
    # without post-ops the call's are none (NULL bias and residual, no activation)
    ops = (post or _Post(None, None, POST_NONE)).ops(g, k0, row0 * g.pixels + p0)
    body: list[Stmt] = [
        Let(kb, task % kblocks),
        Let(bi, (task // kblocks) % bands),
        Let(ni, task // (kblocks * bands)),
        Let(ty0, bi * rt),
        Let(ty1, ir.minimum(ty0 + rt, th)),
        Let(k0, kb * kt),
        Let(row0, ni * g.cout + k0),
        Let(p0, ty0 * (2 * g.ow)),
        Call(
            WINOGRAD_ROUTINE,
            (
                ir.index(g.cin),
                ir.index(kt),
                ir.index(g.h),
                ir.index(g.w),
                ir.addr(x, ni * (g.cin * g.plane)),
                ty0,
                ty1,
                ir.addr(packed, k0 * g.cin),
                ir.index(ldu),
                ir.addr(dest, row0 * g.pixels + p0),
                ir.index(g.pixels),
                *ops,
                ir.index(tr),
                ir.addr(ws, 0),
            ),
        ),
    ]
    if post is None:
        body += finish((row0, row0 + kt), (p0, ty1 * (2 * g.ow)))
    return [Loop(task, tasks, tuple(body), parallel=parallel, dynamic=parallel, scratch=(ws,), macs=macs)]


def depthwise_in_library(g: ConvGeometry) -> bool:
    """Whether a depthwise conv runs in the contraction library: an undilated 3x3 of stride 1 whose
    output rows are as wide as the input's (`afc_dw3x3`), or of stride 2 (`afc_dw3x3_s2`), its
    padded plane within what the AVX2 build keeps per thread (DEPTHWISE_LIBRARY_PAD_FLOATS): all
    of MobileNetV2's depthwise convs. The library reads each padded input row once per vector and
    keeps its three column shifts in registers (at stride 2: its even columns, its odd ones, its
    even ones one further) with the row before it, where the generated loop loads every tap
    unaligned (most loads split across cache lines) or pads a 7-wide row to a vector. Against
    the generated loop on Zen 4 (AVX-512), one thread: 0.45x at 7x7 to 28x28, 0.75x at 56x56,
    0.8x at 112x112, 0.43-0.73x at stride 2 (0.5-0.9x on two threads); the AVX2 build on the same
    host 0.79-0.89x at stride 1, 0.82-1.2x at stride 2, the model 0.97x."""
    if (g.kh, g.kw, g.dh, g.dw) != (3, 3, 1, 1):
        return False
    vectors = 8 * -(-g.ow // 8) + 8  # the AVX2 build's padded row, in floats
    if (g.sh, g.sw) == (1, 1):
        return g.ow == g.w and (g.oh + 2) * vectors <= DEPTHWISE_LIBRARY_PAD_FLOATS
    return (g.sh, g.sw) == (2, 2) and 2 * (2 * g.oh + 1) * vectors <= DEPTHWISE_LIBRARY_PAD_FLOATS


def _depthwise_library(g: ConvGeometry, x: Buffer, w: Buffer, dest: Buffer, finish: _Finish) -> list[Stmt]:
    """A task per run of planes (`_depthwise_tasks`: about 14 KiB of output at 7x7 to 28x28, a
    plane at 56x56 and 112x112), computed by `afc_dw3x3` / `afc_dw3x3_s2` and then finished by
    the epilogue while in L1 or L2."""
    planes = g.n * g.cout
    # a multiply-add here (with its share of loads and lane shuffles) costs about 4 of a GEMM
    # micro-kernel's, as in the generated loop
    macs = 4 * planes * g.pixels * g.taps
    parallel = planes > 1 and macs >= PARALLEL_MIN_MACS
    per_task, tasks = _depthwise_tasks(planes, g.pixels * g.taps)
    task, p0, p1 = ir.var("task"), ir.var("p0"), ir.var("p1")
    body: list[Stmt] = [
        Let(p0, task * per_task),
        Let(p1, ir.minimum(task * per_task + per_task, planes)),
        Call(
            DEPTHWISE_3X3_ROUTINE if g.sh == 1 else DEPTHWISE_3X3_S2_ROUTINE,
            (
                p0,
                p1,
                ir.index(g.cout),
                ir.addr(x, 0),
                ir.addr(w, 0),
                ir.addr(dest, 0),
                *(ir.index(v) for v in (g.h, g.w, g.oh, *((g.ow,) if g.sh == 2 else ()), g.pt, g.pl)),
            ),
        ),
        *finish((p0, p1), (ir.index(0), ir.index(g.pixels))),
    ]
    return [Loop(task, tasks, tuple(body), parallel=parallel, macs=macs)]  # static: `_depthwise_tasks`


def _depthwise(g: ConvGeometry, x: Buffer, w: Buffer, dest: Buffer, finish: _Finish) -> list[Stmt]:
    """Direct depthwise loop, a task per run of channel planes. The zero-padded plane is stored as
    `sw` column phases (phase q holds padded columns q, q + sw, ...), so every tap reads a
    unit-stride run even for stride 2 and the inner loop vectorizes without gathers.

    Planes at most DEPTHWISE_FLAT_WIDTH wide (MobileNetV2's 7x7) are computed flat: a row of 7
    outputs is a fraction of a vector (4 lanes and 3 scalars), so instead the padded plane, also
    split in `sh` row phases so that output row oy reads phase rows oy + (ky*dh)//sh, is read as
    one run per tap: output (oy, ox) at oy * wq + ox of a per-thread `acc`, the padded columns
    between the rows computed and dropped (61 outputs, 4 vectors, for 49 kept); a copy then
    packs the kept ones into the output plane."""
    flat = g.ow <= DEPTHWISE_FLAT_WIDTH and g.oh > 1
    rph = g.sh if flat else 1  # row phases
    hp = (g.oh - 1) * g.sh + (g.kh - 1) * g.dh + 1
    wp = (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1
    wq = -(-wp // g.sw)
    phase = -(-hp // rph) * wq
    planes = g.n * g.cout
    # a direct loop: a multiply-add here costs about 4 of the contraction library's
    macs = 4 * planes * g.pixels * g.kh * g.kw
    parallel = planes > 1 and macs >= PARALLEL_MIN_MACS
    per_task, tasks = _depthwise_tasks(planes, g.pixels * g.kh * g.kw)
    pad = Buffer("pad", DType.F32, rph * g.sw * phase, "scratch")
    span = (g.oh - 1) * wq + g.ow  # the flat outputs, dropped columns included
    acc = Buffer("acc", DType.F32, span, "scratch")
    plane, ch, ih, t = ir.var("plane"), ir.var("ch"), ir.var("ih"), ir.var("t")
    oy, ox, base, task, j = ir.var("oy"), ir.var("ox"), ir.var("base"), ir.var("task"), ir.var("j")
    # Padded column q = ph + sw * t holds input column q - pl: each phase's valid run [t0, t1).
    runs = [
        (
            ph,
            max(0, -(-(g.pl - ph) // g.sw)),
            min(wq, (g.w - 1 + g.pl - ph) // g.sw + 1, -(-(wp - ph) // g.sw)),
        )
        for ph in range(g.sw)
    ]
    zero = _depthwise_border(pad, runs, rph * g.sw * phase, hp, g.pt, g.h, wq, phase, flat)
    body: list[Stmt] = [Let(ch, plane % g.cout)]
    # Padded row r is row r // rph of row phase r % rph.
    r = ih + g.pt
    row = r * wq if rph == 1 else (r % rph) * (g.sw * phase) + (r // rph) * wq
    copies: list[Stmt] = []
    for ph, t0, t1 in runs:
        if t1 > t0:
            src = ir.load(x, plane * (g.h * g.w) + ih * g.w + (ph - g.pl) + t * g.sw)
            copies.append(Loop(t, t1, (Store(pad, ph * phase + row + t, src),), vector=True, start=t0))
    if copies:
        body.append(Loop(ih, min(g.h, hp - g.pt), tuple(copies), start=max(0, -g.pt)))

    def tap_at(ky: Expr | int, kx: Expr | int) -> Expr:
        """The pad offset of tap (ky, kx) for output (0, 0)."""
        o, oyk = kx * g.dw, ky * g.dh
        rows = oyk * wq if rph == 1 else (oyk % rph) * (g.sw * phase) + (oyk // rph) * wq
        return (o % g.sw) * phase + rows + o // g.sw

    # flat: output j = oy * wq + ox; else output row oy, column ox
    at, count = (j, span) if flat else (base + ox, g.ow)
    taps = [(ky, kx) for ky in range(g.kh) for kx in range(g.kw)]
    window: Expr
    if len(taps) <= MAX_UNROLLED_TAPS:
        # The taps unrolled with compile-time offsets: the accumulator stays in a register and
        # the loop over output columns vectorizes.
        wk = [ir.var(f"w{k}", DType.F32) for k in range(len(taps))]
        body += [Let(v, ir.load(w, ch * len(taps) + k)) for k, v in enumerate(wk)]
        terms = [wk[k] * ir.load(pad, at + tap_at(ky, kx)) for k, (ky, kx) in enumerate(taps)]
        window = terms[0]
        for term in terms[1:]:
            window = window + term
    else:
        tap = ir.var("tap")
        window = ir.fold(
            "sum",
            tap,
            0,
            len(taps),
            ir.load(w, ch * len(taps) + tap) * ir.load(pad, at + tap_at(tap // g.kw, tap % g.kw)),
        )
    if flat:
        body.append(Loop(j, span, (Store(acc, j, window),), vector=True))
        keep = Store(dest, plane * g.pixels + oy * g.ow + ox, ir.load(acc, oy * wq + ox))
        body.append(Loop(oy, g.oh, (Loop(ox, g.ow, (keep,), vector=True),)))
        body += finish((plane, plane + 1), (ir.index(0), ir.index(g.pixels)))
    else:
        store = Store(dest, plane * g.pixels + oy * g.ow + ox, window)
        row_body: tuple[Stmt, ...] = (Let(base, oy * (g.sh * wq)), Loop(ox, count, (store,), vector=True))
        by_row = g.ow >= DEPTHWISE_ROW_EPILOGUE_WIDTH
        if by_row:  # each output row finished while it is in L1
            row_body += tuple(finish((plane, plane + 1), (oy * g.ow, oy * g.ow + g.ow)))
        body.append(Loop(oy, g.oh, row_body))
        if not by_row:
            body += finish((plane, plane + 1), (ir.index(0), ir.index(g.pixels)))
    stop = (task + 1) * per_task if planes % per_task == 0 else ir.minimum((task + 1) * per_task, planes)
    planes_loop = Loop(plane, stop, tuple(body), start=task * per_task)
    scratch = (pad, acc) if flat else (pad,)
    # a static split, as `_depthwise_tasks` says why
    return [Loop(task, tasks, (*zero, planes_loop), parallel=parallel, scratch=scratch, macs=macs)]


def _depthwise_border(
    pad: Buffer,
    runs: Sequence[tuple[int, int, int]],
    floats: int,
    hp: int,
    pt: int,
    h: int,
    wq: int,
    phase: int,
    flat: bool,
) -> list[Stmt]:
    """Zeroes the cells of a depthwise conv's padded plane that its copies never write: the plane's
    border, once per task (the copies write the same cells for every plane). Column phase `ph`'s
    padded rows [max(pt, 0), min(h + pt, hp)) hold input rows in columns [t0, t1) (`runs`); every
    other cell is padding. A flat plane (split in row phases too) and one of at most
    DEPTHWISE_BORDER_FLOATS, where a few short loops per row would cost more than one long one,
    are zeroed whole."""
    z, zr = ir.var("z"), ir.var("zr")
    zero = ir.const(0.0, DType.F32)
    if flat or floats <= DEPTHWISE_BORDER_FLOATS:
        return [Loop(z, floats, (Store(pad, z, zero),), vector=True)]
    r_lo, r_hi = max(pt, 0), min(h + pt, hp)

    def cols(ph: int, lo: int, hi: int) -> Loop:
        return Loop(z, hi, (Store(pad, ph * phase + zr * wq + z, zero),), vector=True, start=lo)

    loops: list[Stmt] = []
    for ph, t0, t1 in runs:
        whole = (cols(ph, 0, wq),)
        edges = (cols(ph, 0, t0), cols(ph, t1, wq)) if t1 > t0 else whole
        loops += [Loop(zr, r_lo, whole), Loop(zr, r_hi, edges, start=r_lo), Loop(zr, hp, whole, start=r_hi)]
    return loops


def _depthwise_tasks(planes: int, plane_macs: int) -> tuple[int, int]:
    """(planes per task, tasks) of a depthwise conv: whole planes, about DEPTHWISE_TASK_MACS
    multiply-adds a task but at least DEPTHWISE_MIN_TASKS tasks to share out. A task per plane
    costs a zeroed border per plane, as much as the work of a small plane (MobileNetV2's 960
    planes of 7x7).

    The tasks are split statically, each thread a contiguous run of them, rather than handed out
    one at a time: they are equal, and at 14x14 and 28x28 a task is about a microsecond of work,
    of which each dynamic take cost a good part (an atomic on a cache line both cores write, so
    the line moves between them at every take). A worker that has not started its share leaves it
    to the caller (threadpool/), so a sleeping worker still costs no wait. Measured on an Intel
    Xeon host (2 vCPUs, AVX-512), a depthwise 3x3 after a 1x1 conv, fastest of 150 profiled runs:
    192 planes of 28x28 on two threads 0.045 -> 0.033 ms (one thread: 0.034: the dynamic split
    had made two threads slower than one), 384 of 14x14 0.021 -> 0.013; MobileNetV2 on two
    threads, against onnxruntime in the same process, four pairs of alternating processes:
    1.26-1.31x -> 1.20-1.24x (with a busy neighbour on one vCPU: 1.26-1.28 -> 1.22, and one
    outlier run on each side, 1.76 and 1.82)."""
    per_task = max(1, min(planes // DEPTHWISE_MIN_TASKS, DEPTHWISE_TASK_MACS // max(1, plane_macs)))
    tasks = -(-planes // per_task)
    return -(-planes // tasks), tasks


def _transpose_tiles(g: ConvGeometry) -> tuple[int, int]:
    """(channel block, blocks) of a ConvTranspose: a block's column buffer (ct x taps x input
    pixels) within 4 x COL_TILE_FLOATS, blocks equal-sized."""
    ct = max(1, min(g.cog, COL_TILE_FLOATS * 4 // max(1, g.taps * g.plane)))
    ctn = -(-g.cog // ct)
    return -(-g.cog // ctn), ctn


def _col2im(g: ConvGeometry, x: Buffer, w: Buffer, dest: Buffer, finish: _Finish) -> list[Stmt]:
    """`conv_transpose_col2im`: per (image, group, block of output channels), one contraction
    `col = W_g^T x X[n, g]` into a per-thread workspace slice, then a scatter-add (col2im) of
    each tap's column rows into the zeroed output block, then the epilogue on that block. The
    scatter's column range is worked out per tap and row, so its inner loop has no checks."""
    khw, hw, ohw = g.taps, g.plane, g.pixels
    ct, ctn = _transpose_tiles(g)
    tasks = g.n * g.group * ctn
    macs = g.n * g.cin * hw * g.cog * khw
    parallel = tasks > 1 and macs >= PARALLEL_MIN_MACS
    col = Buffer("col", DType.F32, ct * khw * hw, "scratch")
    task, cb, gi, ni = ir.var("task"), ir.var("cb"), ir.var("gi"), ir.var("ni")
    ch0, ch1, row0, z = ir.var("ch0"), ir.var("ch1"), ir.var("row0"), ir.var("z")
    co, kk, kz, ky, kx, off = (ir.var(v) for v in ("co", "kk", "kz", "ky", "kx", "off"))
    irow, oz, oy, lo, hi, iw = (ir.var(v) for v in ("irow", "oz", "oy", "lo", "hi", "iw"))
    src, dst = ir.var("src"), ir.var("dst")
    at = dst + iw * g.sw
    scatter = Loop(
        irow,
        g.d * g.h,
        (
            Let(oz, (irow // g.h) * g.sd - g.pf + kz * g.dd),
            Let(oy, (irow % g.h) * g.sh - g.pt + ky * g.dh),
            If(
                ir.logical_and(
                    ir.logical_and(ir.ge(oz, 0), ir.lt(oz, g.od)),
                    ir.logical_and(ir.ge(oy, 0), ir.lt(oy, g.oh)),
                ),
                (
                    Let(dst, row0 * ohw + co * ohw + (oz * g.oh + oy) * g.ow + off),
                    Loop(
                        iw,
                        hi,
                        (Store(dest, at, ir.load(dest, at) + ir.load(col, src + irow * g.w + iw)),),
                        start=lo,
                    ),
                ),
            ),
        ),
    )
    per_tap = (
        Let(kz, kk // (g.kh * g.kw)),
        Let(ky, (kk // g.kw) % g.kh),
        Let(kx, kk % g.kw),
        Let(off, kx * g.dw - g.pl),
        # input columns iw with 0 <= iw * sw + off < ow
        Let(lo, ir.clamp(ir.select(ir.lt(off, 0), (-off + (g.sw - 1)) // g.sw, 0), 0, g.w)),
        Let(hi, ir.clamp(ir.select(ir.ge(g.ow - 1 - off, 0), (g.ow - 1 - off) // g.sw + 1, 0), lo, g.w)),
        Let(src, (co * khw + kk) * hw),
        scatter,
    )
    body: list[Stmt] = [
        Let(cb, task % ctn),
        Let(gi, (task // ctn) % g.group),
        Let(ni, task // (ctn * g.group)),
        Let(ch0, cb * ct),
        Let(ch1, ir.minimum(ch0 + ct, g.cog)),
        contraction(
            trans_a=True,
            m=(ch1 - ch0) * khw,
            n=ir.index(hw),
            k=g.cig,
            alpha=1.0,
            a=ir.addr(w, gi * (g.cig * g.cog * khw) + ch0 * khw),
            lda=g.cog * khw,
            b=ir.addr(x, (ni * g.cin + gi * g.cig) * hw),
            ldb=hw,
            c=ir.addr(col, 0),
            ldc=hw,
        ),
        Let(row0, ni * g.cout + gi * g.cog + ch0),
        Loop(z, (ch1 - ch0) * ohw, (Store(dest, row0 * ohw + z, ir.const(0.0, DType.F32)),), vector=True),
        Loop(co, ch1 - ch0, (Loop(kk, khw, per_tap),)),
        *finish((row0, row0 + (ch1 - ch0)), (ir.index(0), ir.index(ohw))),
    ]
    return [Loop(task, tasks, tuple(body), parallel=parallel, dynamic=parallel, scratch=(col,), macs=macs)]
