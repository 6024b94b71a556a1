"""The contraction library (and the attention tiles of afa.c) as a loadable shared object with
exported entry points, for tests and benchmarks that call it directly through ctypes (kernels
include the library instead)."""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..cache import KernelCache
from ..compiler import KernelSource, compile_kernels
from ..isa import IsaTarget, target_isa
from . import PANEL_QUANTUM, attention_source, library_source

EXPORTS = r"""
#include <omp.h>
/* The ISA's fp32 peak: `iters` rounds of 12 independent FMA chains per thread on the widest
 * vectors the library uses, from registers only. Returns the FLOPs done (all threads). */
double afcx_peak(int64_t iters) {
  double flops = 0.0;
  #pragma omp parallel reduction(+ : flops)
  {
#if defined(__AVX512F__)
    __m512 acc[12], x = _mm512_set1_ps(1e-7f), y = _mm512_set1_ps(0.999f);
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps((float)i);
    for (int64_t it = 0; it < iters; ++it)
      for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], y, x);
    float out[16];
    for (int i = 1; i < 12; ++i) acc[0] = _mm512_add_ps(acc[0], acc[i]);
    _mm512_storeu_ps(out, acc[0]);
    flops += (double)iters * 12 * 16 * 2 + (out[0] == 12345.0f);
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 acc[12], x = _mm256_set1_ps(1e-7f), y = _mm256_set1_ps(0.999f);
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps((float)i);
    for (int64_t it = 0; it < iters; ++it)
      for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], y, x);
    float out[8];
    for (int i = 1; i < 12; ++i) acc[0] = _mm256_add_ps(acc[0], acc[i]);
    _mm256_storeu_ps(out, acc[0]);
    flops += (double)iters * 12 * 8 * 2 + (out[0] == 12345.0f);
#else
    float acc[12][16];
    for (int i = 0; i < 12; ++i)
      for (int j = 0; j < 16; ++j) acc[i][j] = (float)i;
    for (int64_t it = 0; it < iters; ++it)
      for (int i = 0; i < 12; ++i)
        for (int j = 0; j < 16; ++j) acc[i][j] = acc[i][j] * 0.999f + 1e-7f;
    flops += (double)iters * 12 * 16 * 2 + (acc[3][5] == 12345.0f);
#endif
  }
  return flops;
}
/* What waking the OpenMP team costs a parallel loop, in ns (the measurement behind
 * backend/cpu/threads.py PASSIVE_WAKE_NS): a loop of `work_ns` of busy work in 40 chunks handed
 * out dynamically (as contraction tiles are) over `threads` threads whose workers sat idle
 * `gap_ns` first takes T2 = (work_ns + W) / 2 when the workers join W late, so each probe gives
 * W = 2 T2 - work_ns (above work_ns: no worker joined before the work was done); the median of
 * `reps` (1-255) probes is returned. The caller's core is busy meanwhile, as in a kernel. */
static void afcx_busy_ns(double ns) {
  const double t0 = omp_get_wtime();
  while ((omp_get_wtime() - t0) * 1e9 < ns) {
  }
}
int64_t afcx_team_wake_ns(int64_t threads, int64_t reps, int64_t gap_ns, int64_t work_ns) {
  int64_t w[255];
  reps = reps < 1 ? 1 : reps > 255 ? 255 : reps;
  double last = omp_get_wtime();
  for (int64_t r = 0; r < reps; ++r) {
    while ((omp_get_wtime() - last) * 1e9 < (double)gap_ns) {
    }
    const double t0 = omp_get_wtime();
    #pragma omp parallel for schedule(dynamic, 1) num_threads((int)threads)
    for (int c = 0; c < 40; ++c) afcx_busy_ns((double)work_ns / 40.0);
    last = omp_get_wtime();
    const int64_t t2 = (int64_t)((last - t0) * 1e9);
    w[r] = 2 * t2 > work_ns ? 2 * t2 - work_ns : 0;
  }
  for (int64_t i = 1; i < reps; ++i)
    for (int64_t j = i; j > 0 && w[j - 1] > w[j]; --j) {
      const int64_t x = w[j - 1];
      w[j - 1] = w[j];
      w[j] = x;
    }
  return w[reps / 2];
}
int64_t afcx_mr(void) { return AFC_MR; }
int64_t afcx_nr(void) { return AFC_NR; }
const char *afcx_kernel(void) { return AFC_KERNEL; }
int64_t afcx_packed_a_floats(int64_t m, int64_t k) { return afc_packed_a_floats(m, k); }
int64_t afcx_packed_b_floats(int64_t k, int64_t n) { return afc_packed_b_floats(k, n); }
void afcx_pack_a(int64_t m, int64_t k, const float *a, int64_t rs, int64_t cs, float *ap) {
  afc_pack_a(m, k, a, rs, cs, ap);
}
void afcx_pack_b(int64_t k, int64_t n, const float *b, int64_t rs, int64_t cs, float *bp) {
  afc_pack_b(k, n, b, rs, cs, bp);
}
void afcx_gemm_ap(int64_t m, int64_t n, int64_t k, float alpha, const float *ap, const float *b,
                  int64_t b_rs, int64_t b_cs, float *c, int64_t ldc) {
  afc_gemm_ap(m, n, k, alpha, ap, b, b_rs, b_cs, c, ldc);
}
/* afc_gemm_ap's packing driver, forced where it would read B in place (tests) */
void afcx_gemm_ap_packed(int64_t m, int64_t n, int64_t k, float alpha, const float *ap, const float *b,
                         int64_t b_rs, int64_t b_cs, float *c, int64_t ldc) {
  afc_gemm_ap_impl(m, n, k, alpha, ap, b, b_rs, b_cs, c, ldc, 0);
}
void afcx_gemm_bp(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t a_rs,
                  int64_t a_cs, const float *bp, float *c, int64_t ldc) {
  afc_gemm_bp(m, n, k, alpha, a, a_rs, a_cs, bp, c, ldc);
}
/* the two paths of afc_gemm_bp, each forced (tests, and the measurement behind AFC_GEMV_ROWS) */
void afcx_gemv_bp(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t a_rs,
                  int64_t a_cs, const float *bp, float *c, int64_t ldc) {
  afc_gemv_bp(m, n, k, alpha, a, a_rs, a_cs, bp, c, ldc);
}
void afcx_gemm_bp_panels(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t a_rs,
                         int64_t a_cs, const float *bp, float *c, int64_t ldc) {
  afc_gemm_bp_panels(m, n, k, alpha, a, a_rs, a_cs, bp, c, ldc);
}
int64_t afcx_gemv_rows(void) { return AFC_GEMV_ROWS; }
float afcx_softmax_row(float *s, int64_t end, int64_t cols) {
  float norm;
  afa_softmax_row(s, end, cols, &norm);
  return norm;
}
void afcx_conv_ap(int64_t m, int64_t rows, int64_t ow, int64_t k, const float *ap, const float *band,
                  int64_t plane, int64_t phase, int64_t wp, int64_t sh, int64_t sw, int64_t kh, int64_t kw,
                  int64_t dh, int64_t dw, float *c, int64_t ldc) {
  afc_conv_ap(m, rows, ow, k, ap, band, plane, phase, wp, sh, sw, kh, kw, dh, dw, c, ldc);
}
void afcx_conv_bp(int64_t m, int64_t n, int64_t k, int64_t p0, int64_t ow, int64_t sh, int64_t sw,
                  const float *band, int64_t plane, int64_t wp, int64_t kh, int64_t kw, int64_t dh,
                  int64_t dw, const float *bp, float *c, int64_t ldc) {
  afc_conv_bp(m, n, k, p0, ow, sh, sw, band, plane, wp, kh, kw, dh, dw, bp, c, ldc);
}
void afcx_gemm_bp_in(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t a_rs,
                     int64_t a_cs, const float *bp, float *c, int64_t ldc) {
  afc_gemm_bp_in(m, n, k, alpha, a, a_rs, a_cs, bp, c, ldc);
}
void afcx_gemm_ap_in(int64_t m, int64_t n, int64_t k, float alpha, const float *ap, const float *b,
                     int64_t b_rs, int64_t b_cs, float *c, int64_t ldc) {
  afc_gemm_ap_in(m, n, k, alpha, ap, b, b_rs, b_cs, c, ldc);
}
void afcx_gemm_ap_post(int64_t m, int64_t n, int64_t k, const float *ap, const float *b, int64_t b_rs,
                       float *c, int64_t ldc, const float *bias, const float *res, int64_t res_ld,
                       int64_t act, float lo, float hi) {
  afc_gemm_ap_post(m, n, k, ap, b, b_rs, c, ldc, bias, res, res_ld, (int)act, lo, hi);
}
void afcx_begin_call(void) { afc_begin_call(); }
void afcx_store_t(int64_t m, int64_t n, const float *tile, int64_t ldt, float *out, int64_t ldo) {
  afc_store_t(m, n, tile, ldt, out, ldo);
}
void afcx_store_t_post(int64_t m, int64_t n, const float *tile, int64_t ldt, float *out, int64_t ldo,
                       const float *bias, const float *res, int64_t res_ld, int64_t act, float lo, float hi) {
  afc_store_t_post(m, n, tile, ldt, out, ldo, bias, res, res_ld, (int)act, lo, hi);
}
void afcx_dw3x3(int64_t p0, int64_t p1, int64_t cout, const float *x, const float *w, float *y, int64_t h,
                int64_t wd, int64_t oh, int64_t pt, int64_t pl) {
  afc_dw3x3(p0, p1, cout, x, w, y, h, wd, oh, pt, pl);
}
void afcx_dw3x3_s2(int64_t p0, int64_t p1, int64_t cout, const float *x, const float *w, float *y, int64_t h,
                   int64_t wd, int64_t oh, int64_t ow, int64_t pt, int64_t pl) {
  afc_dw3x3_s2(p0, p1, cout, x, w, y, h, wd, oh, ow, pt, pl);
}
void afcx_dw3x3_pw(int64_t c, const float *x, int64_t h, int64_t w, const float *w1, const float *bias,
                   int64_t act, float lo, float hi, int64_t stride, int64_t pt, int64_t pl, int64_t cout,
                   const float *ap, float *y, int64_t oh, int64_t ow, int64_t oy0, int64_t oy1, float *buf) {
  afc_dw3x3_pw(c, x, h, w, w1, bias, (int)act, lo, hi, stride, pt, pl, cout, ap, y, oh, ow, oy0, oy1, buf);
}
void afcx_pw_dw3x3(int64_t cexp, int64_t cin, const float *ap, const float *x, int64_t h, int64_t w,
                   const float *bias, int64_t act, float lo, float hi, const float *w2, float *y, int64_t oh,
                   int64_t ow, int64_t stride, int64_t pt, int64_t pl, int64_t oy0, int64_t oy1, int64_t band,
                   int64_t first, float *buf) {
  afc_pw_dw3x3(cexp, cin, ap, x, h, w, bias, (int)act, lo, hi, w2, y, oh, ow, stride, pt, pl, oy0, oy1, band,
               (int)first, buf);
}
/* tiles of a whole GEMM over OpenMP threads, as an anchor kernel runs them (benchmarks) */
void afcx_gemm_ap_parallel(int64_t m, int64_t n, int64_t k, const float *ap, const float *b, float *c,
                           int64_t mb, int64_t nb) {
  const int64_t mt = (m + mb - 1) / mb, nt = (n + nb - 1) / nb;
  #pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < mt * nt; ++t) {
    const int64_t m0 = (t / nt) * mb, n0 = (t % nt) * nb;
    const int64_t m1 = m0 + mb < m ? m0 + mb : m, n1 = n0 + nb < n ? n0 + nb : n;
    afc_gemm_ap(m1 - m0, n1 - n0, k, 1.0f, ap + m0 * k, b + n0, n, 1, c + m0 * n + n0, n);
  }
}
void afcx_gemm_bp_parallel(int64_t m, int64_t n, int64_t k, const float *a, const float *bp, float *c,
                           int64_t mb, int64_t nb) {
  const int64_t mt = (m + mb - 1) / mb, nt = (n + nb - 1) / nb;
  #pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < mt * nt; ++t) {
    const int64_t m0 = (t / nt) * mb, n0 = (t % nt) * nb;
    const int64_t m1 = m0 + mb < m ? m0 + mb : m, n1 = n0 + nb < n ? n0 + nb : n;
    afc_gemm_bp(m1 - m0, n1 - n0, k, 1.0f, a + m0 * k, k, 1, bp + n0 * k, c + m0 * n + n0, n);
  }
}
"""

_I64 = ctypes.c_int64
_PTR = ctypes.c_void_p
_F32 = ctypes.c_float
# m, n, k, ap, b, b_rs, c, ldc, bias, res, res_ld, act, lo, hi
_POST_ARGS = [_I64, _I64, _I64, _PTR, _PTR, _I64, _PTR, _I64, _PTR, _PTR, _I64, _I64, _F32, _F32]
_SIGNATURES: dict[str, tuple[list[type], type | None]] = {
    "afcx_peak": ([_I64], ctypes.c_double),
    "afcx_team_wake_ns": ([_I64, _I64, _I64, _I64], _I64),
    "afcx_mr": ([], _I64),
    "afcx_nr": ([], _I64),
    "afcx_kernel": ([], ctypes.c_char_p),
    "afcx_packed_a_floats": ([_I64, _I64], _I64),
    "afcx_packed_b_floats": ([_I64, _I64], _I64),
    "afcx_pack_a": ([_I64, _I64, _PTR, _I64, _I64, _PTR], None),
    "afcx_pack_b": ([_I64, _I64, _PTR, _I64, _I64, _PTR], None),
    "afcx_gemm_ap": ([_I64, _I64, _I64, ctypes.c_float, _PTR, _PTR, _I64, _I64, _PTR, _I64], None),
    "afcx_gemm_ap_packed": ([_I64, _I64, _I64, ctypes.c_float, _PTR, _PTR, _I64, _I64, _PTR, _I64], None),
    "afcx_gemm_bp": ([_I64, _I64, _I64, ctypes.c_float, _PTR, _I64, _I64, _PTR, _PTR, _I64], None),
    "afcx_gemv_bp": ([_I64, _I64, _I64, ctypes.c_float, _PTR, _I64, _I64, _PTR, _PTR, _I64], None),
    "afcx_gemm_bp_panels": ([_I64, _I64, _I64, ctypes.c_float, _PTR, _I64, _I64, _PTR, _PTR, _I64], None),
    "afcx_gemv_rows": ([], _I64),
    "afcx_softmax_row": ([_PTR, _I64, _I64], _F32),
    "afcx_conv_ap": ([_I64, _I64, _I64, _I64, _PTR, _PTR, *[_I64] * 9, _PTR, _I64], None),
    "afcx_conv_bp": ([*[_I64] * 7, _PTR, *[_I64] * 6, _PTR, _PTR, _I64], None),
    "afcx_gemm_bp_in": ([_I64, _I64, _I64, ctypes.c_float, _PTR, _I64, _I64, _PTR, _PTR, _I64], None),
    "afcx_gemm_ap_in": ([_I64, _I64, _I64, ctypes.c_float, _PTR, _PTR, _I64, _I64, _PTR, _I64], None),
    "afcx_gemm_ap_post": (_POST_ARGS, None),
    "afcx_begin_call": ([], None),
    "afcx_store_t": ([_I64, _I64, _PTR, _I64, _PTR, _I64], None),
    "afcx_store_t_post": ([_I64, _I64, _PTR, _I64, _PTR, _I64, _PTR, _PTR, _I64, _I64, _F32, _F32], None),
    "afcx_dw3x3": ([_I64, _I64, _I64, _PTR, _PTR, _PTR, *[_I64] * 5], None),
    "afcx_dw3x3_s2": ([_I64, _I64, _I64, _PTR, _PTR, _PTR, *[_I64] * 6], None),
    "afcx_dw3x3_pw": (
        [
            _I64,
            _PTR,
            _I64,
            _I64,
            _PTR,
            _PTR,
            _I64,
            _F32,
            _F32,
            _I64,
            _I64,
            _I64,
            _I64,
            _PTR,
            _PTR,
            *[_I64] * 4,
            _PTR,
        ],
        None,
    ),
    "afcx_pw_dw3x3": (
        [_I64, _I64, _PTR, _PTR, _I64, _I64, _PTR, _I64, _F32, _F32, _PTR, _PTR, *[_I64] * 9, _PTR],
        None,
    ),
    "afcx_gemm_ap_parallel": ([_I64, _I64, _I64, _PTR, _PTR, _PTR, _I64, _I64], None),
    "afcx_gemm_bp_parallel": ([_I64, _I64, _I64, _PTR, _PTR, _PTR, _I64, _I64], None),
}


@dataclass
class Library:
    """The library built for one ISA, with numpy-friendly wrappers."""

    lib: ctypes.CDLL
    isa: IsaTarget

    @property
    def mr(self) -> int:
        return int(self.lib.afcx_mr())

    @property
    def nr(self) -> int:
        return int(self.lib.afcx_nr())

    @property
    def kernel(self) -> str:
        return self.lib.afcx_kernel().decode()

    def pack_a(self, a: np.ndarray) -> np.ndarray:
        """A-panels of a 2-D float32 array (any strides)."""
        m, k = a.shape
        out = np.empty(int(self.lib.afcx_packed_a_floats(m, k)), np.float32)
        rs, cs = (s // 4 for s in a.strides)
        self.lib.afcx_pack_a(m, k, a.ctypes.data, rs, cs, out.ctypes.data)
        return out

    def pack_b(self, b: np.ndarray) -> np.ndarray:
        """B-panels of a 2-D float32 array (any strides)."""
        k, n = b.shape
        out = np.empty(int(self.lib.afcx_packed_b_floats(k, n)), np.float32)
        rs, cs = (s // 4 for s in b.strides)
        self.lib.afcx_pack_b(k, n, b.ctypes.data, rs, cs, out.ctypes.data)
        return out

    def gemm_ap(
        self,
        ap: np.ndarray,
        b: np.ndarray,
        m: int,
        alpha: float = 1.0,
        input_rows: int = 0,
        packed: bool = False,
    ) -> np.ndarray:
        """Packed A x B; with `input_rows`, as afc_gemm_ap_in in chunks of that many rows (a
        multiple of the A-panel height), B packed once per kernel call (afcx_begin_call); with
        `packed`, through the driver that packs B even where afc_gemm_ap reads it in place."""
        k, n = b.shape
        c = np.full((m, n), np.nan, np.float32)
        rs, cs = (s // 4 for s in b.strides)
        if not input_rows:
            fn = self.lib.afcx_gemm_ap_packed if packed else self.lib.afcx_gemm_ap
            fn(m, n, k, alpha, ap.ctypes.data, b.ctypes.data, rs, cs, c.ctypes.data, n)
        for r0 in range(0, m if input_rows else 0, input_rows or 1):
            rows = min(input_rows, m - r0)
            at, out = ap.ctypes.data + 4 * r0 * k, c.ctypes.data + 4 * r0 * n
            self.lib.afcx_gemm_ap_in(rows, n, k, alpha, at, b.ctypes.data, rs, cs, out, n)
        return c

    def gemm_ap_post(
        self,
        ap: np.ndarray,
        b: np.ndarray,
        m: int,
        post: tuple[np.ndarray | None, np.ndarray | None, int, float, float],
    ) -> np.ndarray:
        """`gemm_ap` with post-ops, through afc_gemm_ap_post: `post` is (bias[m] or None,
        residual[m, n] or None, act, lo, hi) as afc.h's AFC_POST_* describe them."""
        bias, res, act, lo, hi = post
        k, n = b.shape
        c = np.full((m, n), np.nan, np.float32)
        bias_at = bias.ctypes.data if bias is not None else None
        res_at = res.ctypes.data if res is not None else None
        operands = (ap.ctypes.data, b.ctypes.data, b.strides[0] // 4, c.ctypes.data, n)
        self.lib.afcx_gemm_ap_post(m, n, k, *operands, bias_at, res_at, n, act, lo, hi)
        return c

    @property
    def gemv_rows(self) -> int:
        """Rows at or below which `gemm_bp` takes the GEMV path (afc.h: AFC_GEMV_ROWS)."""
        return int(self.lib.afcx_gemv_rows())

    def gemm_bp(
        self, a: np.ndarray, bp: np.ndarray, n: int, alpha: float = 1.0, path: str = "auto"
    ) -> np.ndarray:
        """A x packed B; `path` forces one of afc_gemm_bp's two paths ("gemv", "panels"), or
        is afc_gemm_bp_in ("input": A packed once per kernel call, afcx_begin_call)."""
        m, k = a.shape
        c = np.full((m, n), np.nan, np.float32)
        rs, cs = (s // 4 for s in a.strides)
        paths = {
            "auto": "afcx_gemm_bp",
            "gemv": "afcx_gemv_bp",
            "panels": "afcx_gemm_bp_panels",
            "input": "afcx_gemm_bp_in",
        }
        fn = getattr(self.lib, paths[path])
        fn(m, n, k, alpha, a.ctypes.data, rs, cs, bp.ctypes.data, c.ctypes.data, n)
        return c

    def conv_ap(
        self,
        ap: np.ndarray,
        band: np.ndarray,
        m: int,
        ow: int,
        kernel: tuple[int, int],
        strides: tuple[int, int],
        dilations: tuple[int, int],
    ) -> np.ndarray:
        """A conv (afc.h: afc_conv_ap) of the packed weight `ap` (A-panels of m x channels*kh*kw)
        over `band[channels, sh * sw phase planes, plane rows, wp]`, the zero-padded input rows
        split in phases, as C[m, rows * ow] (rows: the plane rows less the taps' reach); the
        band is passed with the zeros the library may read past it."""
        channels, phases, prows, wp = band.shape
        (kh, kw), (sh, sw), (dh, dw) = kernel, strides, dilations
        rows = prows - (kh - 1) * dh // sh
        flat = np.zeros(band.size + PANEL_QUANTUM + wp, np.float32)
        flat[: band.size] = band.ravel()
        c = np.full((m, rows * ow), np.nan, np.float32)
        k = channels * kh * kw
        geometry = (phases * prows * wp, prows * wp, wp, sh, sw, kh, kw, dh, dw)
        self.lib.afcx_conv_ap(
            m, rows, ow, k, ap.ctypes.data, flat.ctypes.data, *geometry, c.ctypes.data, rows * ow
        )
        return c

    def conv_bp(
        self,
        band: np.ndarray,
        bp: np.ndarray,
        n: int,
        pixels: tuple[int, int, int],
        kernel: tuple[int, int],
        strides: tuple[int, int],
        dilations: tuple[int, int],
    ) -> np.ndarray:
        """A conv's tile with its pixels as rows (afc.h: afc_conv_bp): output pixels [p0, p1) of
        rows `ow` wide (`pixels` = (p0, p1, ow)) against the packed W^T `bp` (n columns), the taps
        read from `band[channels, band rows, wp]` (its row 0 is output row p0 // ow's first), as
        C[p1 - p0, n]."""
        (channels, brows, wp), (p0, p1, ow), (kh, kw) = band.shape, pixels, kernel
        c = np.full((p1 - p0, n), np.nan, np.float32)
        flat = np.ascontiguousarray(band)
        geometry = (p0, ow, *strides)
        taps = (brows * wp, wp, kh, kw, *dilations)
        k = channels * kh * kw
        self.lib.afcx_conv_bp(
            p1 - p0, n, k, *geometry, flat.ctypes.data, *taps, bp.ctypes.data, c.ctypes.data, n
        )
        return c

    def dw3x3(
        self,
        x: np.ndarray,
        w: np.ndarray,
        out: tuple[int, int],
        pads: tuple[int, int],
        stride: int = 1,
        planes: tuple[int, int] | None = None,
    ) -> np.ndarray:
        """A depthwise 3x3 (afc.h: afc_dw3x3, or afc_dw3x3_s2 at `stride` 2) of `x[planes, h, wd]`
        by `w[channels, 3, 3]` (plane p takes channel p % channels), `pads` = (top, left), as
        y[planes, oh, ow] (`out` = (oh, ow); ow = wd at stride 1); only `planes` = (p0, p1) are
        written (the rest stay NaN)."""
        n, h, wd = x.shape
        (oh, ow), (p0, p1) = out, planes or (0, n)
        y = np.full((n, oh, ow), np.nan, np.float32)
        xs, ws = np.ascontiguousarray(x, np.float32), np.ascontiguousarray(w, np.float32)
        pointers = (w.shape[0], xs.ctypes.data, ws.ctypes.data, y.ctypes.data)
        if stride == 1:
            self.lib.afcx_dw3x3(p0, p1, *pointers, h, wd, oh, *pads)
        else:
            self.lib.afcx_dw3x3_s2(p0, p1, *pointers, h, wd, oh, ow, *pads)
        return y

    def dw3x3_pw(
        self,
        x: np.ndarray,
        w1: np.ndarray,
        post: tuple[np.ndarray | None, int, float, float],
        w2: np.ndarray,
        stride: int,
        bands: list[tuple[int, int]],
    ) -> np.ndarray:
        """afc_dw3x3_pw over `x[c, h, w]`: the depthwise 3x3 `w1[c, 3, 3]` of `stride`, padded by
        one pixel on each side, with `post` = (bias or None, act, lo, hi), then the 1x1 conv
        `w2[cout, c]`, as y[cout, oh, ow], band by band (`bands`: output rows [oy0, oy1));
        rows outside the bands stay NaN."""
        c, h, w = x.shape
        y, keep, (xs, w1s, ap, bias_at) = self._chain_operands(x, w1, w2, post, stride, w2.shape[0])
        _, oh, ow = y.shape
        act, lo, hi = post[1:]
        buf = np.full(c * max(b - a for a, b in bands) * ow, np.nan, np.float32)
        for oy0, oy1 in bands:
            self.lib.afcx_dw3x3_pw(
                c, xs, h, w, w1s, bias_at, act, lo, hi, stride, 1, 1, w2.shape[0], ap, y.ctypes.data,
                oh, ow, oy0, oy1, buf.ctypes.data,
            )  # fmt: skip
        del keep
        return y

    def softmax_row(self, row: np.ndarray, end: int, cols: int | None = None) -> float:
        """afa_softmax_row on a contiguous float32 `row` in place: exp(s - max) over [0, end),
        zeros over [end, cols) (`cols`: the whole row by default); returns 1 / sum."""
        assert row.dtype == np.float32 and row.flags.c_contiguous
        cols = row.size if cols is None else cols
        assert end <= cols <= row.size
        return float(self.lib.afcx_softmax_row(row.ctypes.data, end, cols))

    def _chain_operands(
        self,
        x: np.ndarray,
        dw: np.ndarray,
        pw: np.ndarray,
        post: tuple[np.ndarray | None, int, float, float],
        stride: int,
        channels: int,
    ) -> tuple[np.ndarray, list[np.ndarray], tuple[int, int, int, int | None]]:
        """A conv chain's NaN-filled output (`channels` planes at `stride`), the arrays its
        pointers point into (kept alive by the caller), and the pointers: x, the depthwise
        weight, the 1x1 conv's A-panels, the bias (None without)."""
        _, h, w = x.shape
        y = np.full((channels, (h - 1) // stride + 1, (w - 1) // stride + 1), np.nan, np.float32)
        keep = [
            np.ascontiguousarray(x, np.float32),
            np.ascontiguousarray(dw, np.float32),
            self.pack_a(np.ascontiguousarray(pw, np.float32)),
        ]
        if post[0] is not None:
            keep.append(np.ascontiguousarray(post[0], np.float32))
        xs, dws, ap = (int(a.ctypes.data) for a in keep[:3])
        return y, keep, (xs, dws, ap, int(keep[3].ctypes.data) if post[0] is not None else None)

    def pw_dw3x3(
        self,
        x: np.ndarray,
        w1: np.ndarray,
        post: tuple[np.ndarray | None, int, float, float],
        w2: np.ndarray,
        stride: int,
        runs: list[range],
        band: int,
    ) -> np.ndarray:
        """afc_pw_dw3x3 over `x[cin, h, w]`: the 1x1 conv `w1[cexp, cin]` with `post` = (bias or
        None, act, lo, hi), then the depthwise 3x3 `w2[cexp, 3, 3]` of `stride`, padded by one
        pixel on each side, as y[cexp, oh, ow]. Each run of output rows is computed in bands of
        `band` rows on one buffer, the run's first band with `first`, the rest reusing what the
        band before it expanded; rows outside the runs stay NaN."""
        cin, h, w = x.shape
        cexp = w1.shape[0]
        y, keep, (xs, w2s, ap, bias_at) = self._chain_operands(x, w2, w1, post, stride, cexp)
        _, oh, ow = y.shape
        act, lo, hi = post[1:]
        buf = np.full(cexp * (stride * (band - 1) + 3) * w, np.nan, np.float32)
        for run in runs:
            for oy0 in range(run.start, run.stop, band):
                oy1 = min(oy0 + band, run.stop)
                self.lib.afcx_pw_dw3x3(
                    cexp, cin, ap, xs, h, w, bias_at, act, lo, hi, w2s, y.ctypes.data, oh, ow, stride,
                    1, 1, oy0, oy1, band, int(oy0 == run.start), buf.ctypes.data,
                )  # fmt: skip
        del keep
        return y


def peak_flops(
    library: Library, seconds: float = 0.2, clock: Callable[[], float] = time.perf_counter
) -> float:
    """FLOP/s of the ISA's FMA peak on the OpenMP threads now configured (best of 3 runs), timed by
    `clock` (`time.process_time` for CPU time, on one thread)."""
    iters = 1 << 16
    best = 0.0
    while True:
        start = clock()
        flops = library.lib.afcx_peak(iters)
        took = clock() - start
        if took > seconds / 3 or iters > 1 << 34:
            break
        iters *= 4
    for _ in range(3):
        start = clock()
        flops = library.lib.afcx_peak(iters)
        best = max(best, flops / (clock() - start))
    return best


def team_wake_ns(
    library: Library, threads: int = 2, probes: int = 15, gap_ns: int = 50_000, work_ns: int = 200_000
) -> int:
    """The median ns by which `threads - 1` idle OpenMP workers join a parallel loop late, as the
    library's `afcx_team_wake_ns` probes it (the figure behind threads.PASSIVE_WAKE_NS)."""
    return int(library.lib.afcx_team_wake_ns(threads, probes, gap_ns, work_ns))


def build_library(isa: IsaTarget | None = None, cache: KernelCache | None = None) -> Library:
    """Compile (through the kernel cache) and load the library with exported entry points."""
    isa = isa or target_isa()
    src = KernelSource("afc_shim", EXPORTS, prelude=library_source() + "\n" + attention_source())
    art = compile_kernels([src], cache=cache, isa=isa)[0]
    lib = art.load()
    for name, (argtypes, restype) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = restype
    return Library(lib, isa)
