"""ConvTranspose anchors as C text (NCHW, 1-D to 3-D); Conv is lowered to the kernel IR
(lower/conv.py, which also defines the conv geometry used here).

* `conv_transpose_col2im`: per (image, group, block of output channels): one sgemm
  `col = W_g^T x X[n, g]` into a per-thread buffer, then a scatter-add (col2im) into the output
  block, then the epilogue on that block. BLAS is called single-threaded from inside the
  kernel's own OpenMP loop.
"""

from __future__ import annotations

import math

import onnx

from ....lower.conv import COL_TILE_FLOATS, ConvGeometry
from .common import CodegenUnsupported
from .epilogue import Operands
from .gemm import PARALLEL_MIN_MACS, EpilogueCall, parallel_or_serial


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
