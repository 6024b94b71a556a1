"""Conv and ConvTranspose anchors (NCHW, 1-D and 2-D), each shape routed to the method that suits it.

* `conv1x1_gemm`: 1x1 kernel, stride 1, no padding. The input already is the GEMM operand:
  `Y[n, g] = W_g[Cout/g, Cin/g] x X[n, g][Cin/g, H*W]`, tiled over output pixels (and output
  channels when there are too few pixel tiles to keep the threads busy).
* `conv_depthwise`: one input and one output channel per group. A direct loop per channel plane
  over a zero-padded copy of the plane, so the inner loop over output columns has no bounds checks
  and vectorizes; kernel size, strides and dilations are compile-time constants, so a 3x3 is
  fully unrolled by the compiler.
* `conv_im2col_tiled`: everything else (grouped by a loop over groups). The im2col matrix of one
  tile of output pixels is built in a per-thread buffer sized to stay in L2, multiplied by one
  single-threaded sgemm straight into the output, and the epilogue finishes the tile while it is
  hot (a whole-image im2col would be a large extra round trip to memory).
* `conv_transpose_col2im`: per (image, group, block of output channels): one sgemm
  `col = W_g^T x X[n, g]` into a per-thread buffer, then a scatter-add (col2im) into the output
  block, then the epilogue on that block.

Every method calls BLAS single-threaded from inside the kernel's own OpenMP loop, except that
`conv1x1_gemm` and `conv_im2col_tiled` call the contraction library (`afc_gemm_ap`, weights
packed once at load; backend/cpu/contraction) when the anchor is given a packed weight buffer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import onnx

from ..contraction import PANEL_QUANTUM
from .common import CodegenUnsupported, attrs_of
from .epilogue import Operands
from .gemm import PARALLEL_MIN_MACS, EpilogueCall, parallel_or_serial

# Floats in one per-thread im2col tile: 96K floats = 384 KiB, inside a 512 KiB-1 MiB L2 with
# room left for the weight panel OpenBLAS packs.
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
# Depthwise windows up to this many taps are unrolled by the generator (7x7 included).
MAX_UNROLLED_TAPS = 49


@dataclass(frozen=True)
class PackedWeights:
    """Conv weights packed once by the runtime: at `ptr` (a C expression), per (group, channel
    tile of `conv_tiles`), the library's A-panels of that tile's rows of the group's
    `[Cout/group, Cin/group*kh*kw]` weight matrix, `block` floats apart (a C constant expression:
    the panel height is the ISA's `AFC_MR`, known to the C compiler only)."""

    ptr: str
    block: str


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


def conv_geometry(node: onnx.NodeProto, ops: Operands) -> ConvGeometry:
    """Shapes, strides, dilations and begin paddings of a Conv or ConvTranspose node."""
    x = ops.shape(node.input[0])
    w = ops.shape(node.input[1])
    y = ops.shape(node.output[0])
    nsp = len(x) - 2
    if nsp not in (1, 2, 3) or len(w) != len(x) or len(y) != len(x):
        raise CodegenUnsupported(f"{node.op_type} with {nsp} spatial dims is not generated (1-D to 3-D are)")
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
            raise CodegenUnsupported(f"Conv weights {w} do not match {cin} input channels in {group} groups")
    if cin % group or cout % group or y[1] != cout:
        raise CodegenUnsupported(f"{node.op_type} channels do not split into {group} groups")
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
    return "conv_im2col_tiled"


def _round_up(x: int, q: int) -> int:
    return -(-x // q) * q


def _pixel_tile(pixels: int, kdim: int, quantum: int = 16) -> int:
    pt = max(MIN_PIXEL_TILE, COL_TILE_FLOATS // max(1, kdim))
    if pt >= pixels:
        return pixels
    count = -(-pixels // pt)
    return min(pixels, _round_up(-(-pixels // count), quantum))


def _channel_tile(g: ConvGeometry, base_tasks: int, pt: int) -> int:
    """Output channels per task: enough tasks for the threads, output tile within OUT_TILE_FLOATS."""
    macs = g.n * g.cout * g.pixels * g.kdim
    count = max(1, -(-g.cog * pt // OUT_TILE_FLOATS))
    if macs >= PARALLEL_MIN_MACS and base_tasks * count < MIN_TASKS:
        count = max(count, min(-(-MIN_TASKS // base_tasks), max(1, g.cog // 16)))
    count = min(count, g.cog)
    return -(-g.cog // count)


def _im2col_fn(name: str, g: ConvGeometry) -> str:
    """C: gather the im2col rows of output pixels [p0, p1) of one group's input channels."""
    return f"""\
/* im2col of output pixels [p0, p1): col[(c, kd, kh, kw)][p - p0] (zero off the image) */
static void {name}(const float *restrict x, float *restrict col, long p0, long p1) {{
  const long width = p1 - p0;
  for (long kk = 0; kk < {g.kdim}L; ++kk) {{
    const long c = kk / {g.taps}L, kz = (kk / {g.kh * g.kw}L) % {g.kd}L;
    const long kh = (kk / {g.kw}L) % {g.kh}L, kw = kk % {g.kw}L;
    const float *restrict xc = x + c * {g.plane}L;
    float *restrict dst = col + kk * width;
    const long off = kw * {g.dw}L - {g.pl}L;
    long p = p0;
    while (p < p1) {{
      const long oz = p / {g.oh * g.ow}L, oh = (p / {g.ow}L) % {g.oh}L, ow = p % {g.ow}L;
      const long run = ({g.ow}L - ow) < (p1 - p) ? ({g.ow}L - ow) : (p1 - p);
      const long iz = oz * {g.sd}L - {g.pf}L + kz * {g.dd}L;
      const long ih = oh * {g.sh}L - {g.pt}L + kh * {g.dh}L;
      if (iz < 0 || iz >= {g.d}L || ih < 0 || ih >= {g.h}L) {{
        for (long j = 0; j < run; ++j) dst[j] = 0.0f;
      }} else {{
        const float *restrict xr = xc + (iz * {g.h}L + ih) * {g.w}L;
        long lo = off < 0 ? (-off + {g.sw - 1}L) / {g.sw}L - ow : -ow;
        long hi = {g.w - 1}L - off >= 0 ? ({g.w - 1}L - off) / {g.sw}L - ow + 1 : 0;
        lo = lo < 0 ? 0 : (lo > run ? run : lo);
        hi = hi > run ? run : (hi < lo ? lo : hi);
        for (long j = 0; j < lo; ++j) dst[j] = 0.0f;
        for (long j = lo; j < hi; ++j) dst[j] = xr[(ow + j) * {g.sw}L + off];
        for (long j = hi; j < run; ++j) dst[j] = 0.0f;
      }}
      dst += run;
      p += run;
    }}
  }}
}}
"""


def conv_tiles(g: ConvGeometry, quantum: int = 16) -> tuple[int, int, int, int]:
    """(pixel tile, pixel tiles, channel tile, channel tiles) of the GEMM methods' tasks; pixel
    tiles are multiples of `quantum` (the contraction library's PANEL_QUANTUM when it contracts:
    a tile of whole panels wastes no lanes, measured 97 -> 109 GFLOP/s for a 176- vs 192-pixel
    tile of ResNet-50's first 3x3 conv)."""
    p = g.pixels
    pt = _pixel_tile(p, g.kdim, quantum)
    ptn = -(-p // pt)
    if ptn > 1 and (g.n * g.group * ptn) % 2:
        pt = min(p, _round_up(-(-p // (ptn + 1)), quantum))
        ptn = -(-p // pt)
    ct = _channel_tile(g, g.n * g.group * ptn, pt)
    return pt, ptn, ct, -(-g.cog // ct)


def emit_conv_body(
    g: ConvGeometry,
    x_ptr: str,
    w_ptr: str,
    y_ptr: str,
    epilogue: EpilogueCall | None,
    symbol: str,
    packed: PackedWeights | None = None,
) -> tuple[list[str], list[str], str]:
    """(helper functions, kernel body lines, method) for a Conv.

    With `packed` (the weights as the contraction library's A-panels, one block per group and
    channel tile of `conv_tiles`) the GEMM of a tile is `afc_gemm_ap` instead of BLAS."""
    method = conv_method(g)
    if method == "conv_depthwise":
        return [], _depthwise_body(g, x_ptr, w_ptr, y_ptr, epilogue), method
    helpers: list[str] = []
    p = g.pixels
    im2col = method == "conv_im2col_tiled"
    pt, ptn, ct, ctn = conv_tiles(g, PANEL_QUANTUM if packed is not None else 16)
    tasks = g.n * g.group * ptn * ctn
    macs = g.n * g.cout * p * g.kdim
    parallel = tasks > 1 and macs >= PARALLEL_MIN_MACS
    lines = [
        f"  const float *restrict X = {x_ptr};",
        f"  const float *restrict Wt = {w_ptr};",
        f"  float *restrict Y = {y_ptr};",
        f"  /* {method}: {tasks} tasks = {g.n} images x {g.group} groups x {ptn} pixel tiles of {pt}"
        f" x {ctn} channel tiles of {ct}; K = {g.kdim} */",
        "  #pragma omp parallel",
        "  {",
    ]
    if im2col:
        fn = f"{symbol}_im2col"
        helpers.append(_im2col_fn(fn, g))
        lines.append(f"    float *col = (float *)malloc(sizeof(float) * {g.kdim * pt});")
        lines.append("    long last = -1;")
    lines += [
        "    #pragma omp for schedule(dynamic, 1)",
        f"    for (long task = 0; task < {tasks}L; ++task) {{",
        f"      const long ct = task % {ctn}L, key = task / {ctn}L;",
        f"      const long pi = key % {ptn}L, g = (key / {ptn}L) % {g.group}L, n = key / {ptn * g.group}L;",
        f"      const long p0 = pi * {pt}L, p1 = p0 + {pt}L < {p}L ? p0 + {pt}L : {p}L;",
        f"      const long c0 = ct * {ct}L, c1 = c0 + {ct}L < {g.cog}L ? c0 + {ct}L : {g.cog}L;",
        f"      const float *xg = X + (n * {g.cin}L + g * {g.cig}L) * {g.plane}L;",
    ]
    if im2col:
        lines += [
            f"      if (key != last) {{ {fn}(xg, col, p0, p1); last = key; }}",
            "      const float *bm = col; const long ldb = p1 - p0;",
        ]
    else:
        lines.append(f"      const float *bm = xg + p0; const long ldb = {p}L;")
    lines += [
        f"      const long row0 = n * {g.cout}L + g * {g.cog}L + c0;",
        f"      float *y = Y + row0 * {p}L + p0;",
    ]
    if packed is not None:
        lines.append(
            f"      afc_gemm_ap(c1 - c0, p1 - p0, {g.kdim}L, 1.0f,"
            f" {packed.ptr} + (g * {ctn}L + ct) * {packed.block}, bm, ldb, 1, y, {p}L);"
        )
    else:
        lines.append(
            f"      AF_SGEMM(AfRowMajor, AfNoTrans, AfNoTrans, (af_blasint)(c1 - c0), (af_blasint)(p1 - p0),"
            f" {g.kdim},"
            f" 1.0f, Wt + (g * {g.cog}L + c0) * {g.kdim}L, {g.kdim}, bm, (af_blasint)ldb, 0.0f, y, {p});"
        )
    if epilogue is not None:
        lines.append("      " + epilogue("y", f"{p}L", "row0", "row0 + (c1 - c0)", "p0", "p1"))
    lines.append("    }")
    if im2col:
        lines.append("    free(col);")
    lines.append("  }")
    return helpers, parallel_or_serial(lines, parallel), method


def _depthwise_body(
    g: ConvGeometry, x_ptr: str, w_ptr: str, y_ptr: str, epilogue: EpilogueCall | None
) -> list[str]:
    """Direct depthwise loop. The zero-padded plane is stored as `sw` column phases (phase q holds
    padded columns q, q + sw, ...), so every tap reads a unit-stride run even for stride 2 and the
    inner loop vectorizes without gathers."""
    hp = (g.oh - 1) * g.sh + (g.kh - 1) * g.dh + 1
    wp = (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1
    wq = -(-wp // g.sw)
    phase = hp * wq
    planes = g.n * g.cout
    macs = planes * g.pixels * g.kh * g.kw
    parallel = planes > 1 and macs >= PARALLEL_MIN_MACS // 4
    lines = [
        f"  const float *restrict X = {x_ptr};",
        f"  const float *restrict Wt = {w_ptr};",
        f"  float *restrict Y = {y_ptr};",
        f"  /* conv_depthwise: {planes} channel planes, {g.kh}x{g.kw} window, padded plane {hp}x{wp}"
        f" in {g.sw} column phase(s) */",
        "  #pragma omp parallel",
        "  {",
        f"    float *pad = (float *)malloc(sizeof(float) * {g.sw * phase});",
        "    #pragma omp for schedule(dynamic, 1)",
        f"    for (long plane = 0; plane < {planes}L; ++plane) {{",
        f"      const long c = plane % {g.cout}L;",
        f"      const float *restrict x = X + plane * {g.h * g.w}L;",
        f"      const float *restrict w = Wt + c * {g.kh * g.kw}L;",
        f"      float *restrict y = Y + plane * {g.pixels}L;",
        f"      memset(pad, 0, sizeof(float) * {g.sw * phase});",
        f"      for (long ih = 0; ih < {g.h}L; ++ih) {{",
        f"        const long r = ih + {g.pt}L;",
        f"        if (r < 0 || r >= {hp}L) continue;",
        f"        const float *restrict xr = x + ih * {g.w}L;",
    ]
    # Padded column q = ph + sw * t holds input column q - pl; copy each phase's valid run.
    for ph in range(g.sw):
        t0 = max(0, -(-(g.pl - ph) // g.sw))
        t1 = min(wq, (g.w - 1 + g.pl - ph) // g.sw + 1, -(-(wp - ph) // g.sw))
        if t1 > t0:
            lines.append(
                f"        for (long t = {t0}L; t < {t1}L; ++t) "
                f"pad[{ph * phase}L + r * {wq}L + t] = xr[{ph - g.pl}L + t * {g.sw}L];"
            )
    lines.append("      }")
    taps = [(kh, kw) for kh in range(g.kh) for kw in range(g.kw)]
    if len(taps) <= MAX_UNROLLED_TAPS:
        # One pass per output row, the taps unrolled with compile-time offsets: the accumulator
        # stays in a register and the loop over output columns vectorizes.
        for k, _ in enumerate(taps):
            lines.append(f"      const float w{k} = w[{k}];")
        lines += [
            f"      for (long oh = 0; oh < {g.oh}L; ++oh) {{",
            f"        float *restrict yr = y + oh * {g.ow}L;",
            f"        const float *restrict base = pad + oh * {g.sh * wq}L;",
            f"        for (long ow = 0; ow < {g.ow}L; ++ow) {{",
        ]
        for k, (kh, kw) in enumerate(taps):
            off = kw * g.dw
            offset = (off % g.sw) * phase + kh * g.dh * wq + off // g.sw
            term = f"w{k} * base[{offset}L + ow]"
            lines.append(f"          {'float acc = ' if k == 0 else 'acc += '}{term};")
        lines += ["          yr[ow] = acc;", "        }", "      }"]
    else:
        lines += [
            f"      for (long oh = 0; oh < {g.oh}L; ++oh) {{",
            f"        float *restrict yr = y + oh * {g.ow}L;",
            f"        for (long ow = 0; ow < {g.ow}L; ++ow) yr[ow] = 0.0f;",
            f"        for (long kh = 0; kh < {g.kh}L; ++kh) {{",
            f"          for (long kw = 0; kw < {g.kw}L; ++kw) {{",
            f"            const float wv = w[kh * {g.kw}L + kw];",
            f"            const long off = kw * {g.dw}L;",
            f"            const float *restrict xr = pad + (off % {g.sw}L) * {phase}L"
            f" + (oh * {g.sh}L + kh * {g.dh}L) * {wq}L + off / {g.sw}L;",
            f"            for (long ow = 0; ow < {g.ow}L; ++ow) yr[ow] += wv * xr[ow];",
            "          }",
            "        }",
            "      }",
        ]
    if epilogue is not None:
        lines.append("      " + epilogue("y", f"{g.pixels}L", "plane", "plane + 1", "0", f"{g.pixels}L"))
    lines += ["    }", "    free(pad);", "  }"]
    return parallel_or_serial(lines, parallel)


def emit_conv_transpose_body(
    g: ConvGeometry, x_ptr: str, w_ptr: str, y_ptr: str, epilogue: EpilogueCall | None
) -> tuple[list[str], str]:
    """(kernel body lines, method) for a ConvTranspose: sgemm into a column buffer, then col2im."""
    khw = g.taps
    hw = g.plane
    ohw = g.pixels
    ct = max(1, min(g.cog, COL_TILE_FLOATS * 4 // max(1, khw * hw)))
    ctn = -(-g.cog // ct)
    ct = -(-g.cog // ctn)
    tasks = g.n * g.group * ctn
    macs = g.n * g.cin * hw * g.cog * khw
    parallel = tasks > 1 and macs >= PARALLEL_MIN_MACS
    lines = [
        f"  const float *restrict X = {x_ptr};",
        f"  const float *restrict Wt = {w_ptr};",
        f"  float *restrict Y = {y_ptr};",
        f"  /* conv_transpose_col2im: {tasks} tasks = {g.n} images x {g.group} groups x {ctn} channel"
        f" blocks of {ct}; sgemm [{ct * khw}x{g.cig}]x[{g.cig}x{hw}] then scatter-add */",
        "  #pragma omp parallel",
        "  {",
        f"    float *col = (float *)malloc(sizeof(float) * {ct * khw * hw});",
        "    #pragma omp for schedule(dynamic, 1)",
        f"    for (long task = 0; task < {tasks}L; ++task) {{",
        f"      const long cb = task % {ctn}L, g = (task / {ctn}L) % {g.group}L,"
        f" n = task / {ctn * g.group}L;",
        f"      const long c0 = cb * {ct}L, c1 = c0 + {ct}L < {g.cog}L ? c0 + {ct}L : {g.cog}L;",
        f"      const float *xg = X + (n * {g.cin}L + g * {g.cig}L) * {hw}L;",
        f"      AF_SGEMM(AfRowMajor, AfTrans, AfNoTrans, (af_blasint)((c1 - c0) * {khw}L), {hw},"
        f" {g.cig}, 1.0f,"
        f" Wt + g * {g.cig * g.cog * khw}L + c0 * {khw}L, {g.cog * khw}, xg, {hw}, 0.0f, col, {hw});",
        f"      const long row0 = n * {g.cout}L + g * {g.cog}L + c0;",
        f"      float *y = Y + row0 * {ohw}L;",
        f"      for (long i = 0; i < (c1 - c0) * {ohw}L; ++i) y[i] = 0.0f;",
        "      for (long co = 0; co < c1 - c0; ++co) {",
        f"        float *restrict yc = y + co * {ohw}L;",
        f"        for (long kk = 0; kk < {khw}L; ++kk) {{",
        f"          const long kz = kk / {g.kh * g.kw}L, kh = (kk / {g.kw}L) % {g.kh}L, kw = kk % {g.kw}L;",
        f"          const float *restrict src = col + (co * {khw}L + kk) * {hw}L;",
        f"          const long off = kw * {g.dw}L - {g.pl}L;",
        f"          for (long ir = 0; ir < {g.d * g.h}L; ++ir) {{",
        f"            const long iz = ir / {g.h}L, ih = ir % {g.h}L;",
        f"            const long oz = iz * {g.sd}L - {g.pf}L + kz * {g.dd}L;",
        f"            const long oh = ih * {g.sh}L - {g.pt}L + kh * {g.dh}L;",
        f"            if (oz < 0 || oz >= {g.od}L || oh < 0 || oh >= {g.oh}L) continue;",
        f"            float *restrict yr = yc + (oz * {g.oh}L + oh) * {g.ow}L;",
        f"            const float *restrict sr = src + ir * {g.w}L;",
        f"            for (long iw = 0; iw < {g.w}L; ++iw) {{",
        f"              const long ow = iw * {g.sw}L + off;",
        f"              if (ow >= 0 && ow < {g.ow}L) yr[ow] += sr[iw];",
        "            }",
        "          }",
        "        }",
        "      }",
    ]
    if epilogue is not None:
        lines.append("      " + epilogue("y", f"{ohw}L", "row0", "row0 + (c1 - c0)", "0", f"{ohw}L"))
    lines += ["    }", "    free(col);", "  }"]
    return parallel_or_serial(lines, parallel), "conv_transpose_col2im"


def bias_shape(node: onnx.NodeProto, ops: Operands) -> tuple[int, ...]:
    """Conv's own bias B[Cout] read as [Cout, 1, ...] against the NCHW output."""
    y = ops.shape(node.output[0])
    b = ops.shape(node.input[2])
    if math.prod(b) != y[1]:
        raise CodegenUnsupported(f"{node.op_type} bias {b} does not match {y[1]} output channels")
    return (y[1],) + (1,) * (len(y) - 2)
