/* afa.c - attention tiles for the CPU attention kernel (graph_autofusion.lower.attention).
 *
 * The two products of one (batch, head) of attention, for operands that are not constants:
 *
 *     S[n x cols] = alpha * Q[n x d] K^T        (afa_qk: K packed once per head by afa_pack_kt)
 *     O[n x dv]   = diag(norm) * P[n x cols] V  (afa_pv: V packed once per head by afa_pack_v)
 *
 * Why not sgemm per row block: at attention's shapes (a 64 x 128 x 64 product per call) a BLAS
 * call re-packs both operands on every call, and the packing and call overhead are a large part
 * of the time. Here K^T and V of a head are packed once into AFA_NR-column panels that every row
 * block of the head reuses, and the other operand (Q rows, or the rows of P in the caller's
 * score workspace) is read in place: the micro-kernel broadcasts one element of each of its
 * AFA_MR rows per depth step, so it needs no packing at all. afa_pv scales each output row by
 * `norm` (1 / the row's softmax sum) as it stores it, so the output is written once.
 *
 * Packed layouts (panel p holds columns [p*AFA_NR, p*AFA_NR + AFA_NR), zero past the last):
 *   afa_pack_kt: kt[(p * d + kk) * AFA_NR + j] = K[p*AFA_NR + j][kk]     (d x keys)
 *   afa_pack_v:  vp[(p * keys + kk) * AFA_NR + j] = V[kk][p*AFA_NR + j]   (keys x dv)
 * AFA_NR divides 32 on every ISA, so ceil(x / 32) * 32 columns always hold a packing: callers
 * size their workspace that way without knowing the ISA.
 *
 * The micro-kernel is written with GCC vector extensions (a vector of AFA_VL floats, two per
 * tile row), which gcc maps onto zmm registers for AVX-512 (8 x 32 tile: 16 accumulators), ymm
 * for AVX2 (6 x 16: 12) and xmm elsewhere (4 x 8: 8). Rows past a tile's last valid row read the
 * tile's first row again (computed, never stored), so no row beyond the operand is ever read.
 * AVX2 builds (not AVX-512 ones) differ in three measured places, each commented where it is:
 * half tiles for narrow last panels, P V with row tiles outer, and K^T packed by 8 x 8
 * transposes; with the broadcast load (AFA_SPLAT) they took (AMD EPYC Zen 1, one layer, 1
 * thread, kernel CPU time, minima of 9 alternating rounds) ViT-B/16's attention kernel from
 * 7.6-8.0 to 5.0-5.1 ms against 5.9-6.5 ms for the unfused path, BERT-base's from 3.0-3.1 to 2.1
 * ms against 4.6-4.8. On AVX-512 (Intel Xeon, 2 vCPUs, benchmarks/attention_speed.py, medians of
 * 5-7 alternating rounds) the broadcast load took the 12 layers' attention kernels of ViT-B/16
 * from 23.4 to 15.6-15.8 ms on one thread (12.8 -> 8.9 ms on two), BERT-base's from 9.6 to 6.3
 * (5.3 -> 3.9), GPT-2's from 4.1 to 3.3 on two; row tiles outer and half tiles measured no
 * better there (16.5-17.1 and 15.6-15.8 ms for ViT-B/16 on one thread).
 * The row softmax between the two products (afa_softmax_row) is the library's too: max, exp,
 * sum and the zeros past a row's last key in two passes over the row, with an inline
 * exponential (afa_exp) instead of the vector math library's call per vector. With it, the
 * transposing K^T packing and the half tiles on AVX-512 as well, ViT-B/16's attention per layer
 * went from 0.86-0.89 to 0.68-0.71 ms (one thread, the 12 heads in a C harness; softmax 0.22 ->
 * 0.09 ms) and from 1.32x onnxruntime's nodes to 1.06-1.13x in the model (AMD EPYC Zen 5,
 * `contraction.py --layers vit_b16`; BERT-base's 0.95-1.0x on one thread, 0.8-0.87x on two).
 * All functions are `static` and single-threaded: the kernel owns the parallel loop.
 */
#ifndef AFA_IMPL
#define AFA_IMPL
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__)
#define AFA_MR 8
#define AFA_VL 16
#elif defined(__AVX2__) && defined(__FMA__)
#define AFA_MR 6
#define AFA_VL 8
#else
#define AFA_MR 4
#define AFA_VL 4
#endif
#define AFA_NR (2 * AFA_VL)

typedef float afa_vf __attribute__((vector_size(AFA_VL * sizeof(float)), aligned(4), may_alias));

/* acc + a * b as one fused multiply-add where the ISA has one: kernels build with
 * -ffp-contract=off, under which `acc += a * b` stays a multiply and an add (measured 0.7x). */
#if defined(__AVX512F__)
#include <immintrin.h>
#define AFA_FMA(a, b, acc) ((afa_vf)_mm512_fmadd_ps((__m512)(a), (__m512)(b), (__m512)(acc)))
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define AFA_FMA(a, b, acc) ((afa_vf)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(acc)))
#else
#define AFA_FMA(a, b, acc) ((acc) + (a) * (b))
#endif

/* One element of A at p in every lane, by a broadcast load. `(afa_vf){0} + x` is not x under
 * IEEE rules (-0 + 0 is +0), so without -ffast-math gcc keeps it as a scalar add and a register
 * broadcast per row and depth step: on AVX2 that held the tile at 21-23 GFLOP/s against 30-32
 * with the broadcast load (AMD EPYC Zen 1, 1 thread, ViT-B/16's 197 x 197 x 64 heads, FMA peak
 * 37.6); on AVX-512 the register broadcast is a shuffle on port 5, one of the two FMA ports of
 * Intel's cores: ViT-B/16's attention kernel ran at 61 GFLOP/s there (Intel Xeon, 1 thread, 29%
 * of the FMA peak), BERT-base's at 63 (the header gives the figures after). */
#if defined(__AVX512F__)
#define AFA_SPLAT(p) ((afa_vf)_mm512_set1_ps(*(p)))
#elif defined(__AVX2__) && defined(__FMA__)
#define AFA_SPLAT(p) ((afa_vf)_mm256_broadcast_ss(p))
#else
#define AFA_SPLAT(p) ((afa_vf){0} + *(p))
#endif

#if defined(__AVX2__) && defined(__FMA__)
/* afa_tile for a panel of at most AFA_VL valid columns: one vector per row, half the FMAs. The
 * last K^T panel of ViT-B/16's 197 keys holds 5 (13 panels of 16: the FMAs of 8 of 208 columns
 * saved, QK^T 3-7% faster on AMD EPYC Zen 1, 1 thread; on AVX-512, 7 panels of 32 of which the
 * last runs 16 columns: 0.306-0.315 -> 0.294-0.300 ms per layer on AMD EPYC Zen 5, where an
 * Intel Xeon had measured no difference); the same arithmetic per element as afa_tile. */
static inline __attribute__((always_inline)) void afa_tile_half(int64_t depth, const float *const *rows,
                                                                int64_t acs, const float *restrict panel,
                                                                float *restrict c, int64_t ldc, int64_t ccs,
                                                                int mr, int nr, float alpha,
                                                                const float *restrict rscale) {
  afa_vf c0[AFA_MR];
#pragma GCC unroll 8
  for (int i = 0; i < AFA_MR; ++i) c0[i] = (afa_vf){0};
  const float *r[AFA_MR];
#pragma GCC unroll 8
  for (int i = 0; i < AFA_MR; ++i) r[i] = rows[i];
  for (int64_t kk = 0; kk < depth; ++kk) {
    const afa_vf b0 = *(const afa_vf *)panel;
#pragma GCC unroll 8
    for (int i = 0; i < AFA_MR; ++i) c0[i] = AFA_FMA(AFA_SPLAT(&r[i][kk * acs]), b0, c0[i]);
    panel += AFA_NR;
  }
#pragma GCC unroll 8
  for (int i = 0; i < AFA_MR; ++i) {
    if (i >= mr) break;
    const float s = rscale ? rscale[i] : alpha;
    const afa_vf v0 = c0[i] * s;
    float tmp[AFA_VL];
    memcpy(tmp, &v0, sizeof v0);
    float *row = c + i * ldc;
    for (int j = 0; j < nr; ++j) row[j * ccs] = tmp[j];
  }
}
#define AFA_HALF_TILES 1
#else
#define AFA_HALF_TILES 0
#endif

/* C[mr x nr] (row stride ldc, column stride ccs) = scale_i * sum_kk A[i][kk] * panel[kk][0:nr],
 * scale_i = rscale ? rscale[i] : alpha. Row i of A starts at rows[i]; its depth step is `acs`. */
static inline __attribute__((always_inline)) void afa_tile(int64_t depth, const float *const *rows,
                                                           int64_t acs, const float *restrict panel,
                                                           float *restrict c, int64_t ldc,
                                                           int64_t ccs, int mr, int nr, float alpha,
                                                           const float *restrict rscale) {
#if AFA_HALF_TILES
  if (nr <= AFA_VL) {
    afa_tile_half(depth, rows, acs, panel, c, ldc, ccs, mr, nr, alpha, rscale);
    return;
  }
#endif
  afa_vf c0[AFA_MR], c1[AFA_MR];
#pragma GCC unroll 8
  for (int i = 0; i < AFA_MR; ++i) {
    c0[i] = (afa_vf){0};
    c1[i] = (afa_vf){0};
  }
  const float *r[AFA_MR];
#pragma GCC unroll 8
  for (int i = 0; i < AFA_MR; ++i) r[i] = rows[i];
  for (int64_t kk = 0; kk < depth; ++kk) {
    const afa_vf b0 = *(const afa_vf *)panel;
    const afa_vf b1 = *(const afa_vf *)(panel + AFA_VL);
#pragma GCC unroll 8
    for (int i = 0; i < AFA_MR; ++i) {
      const afa_vf a = AFA_SPLAT(&r[i][kk * acs]);
      c0[i] = AFA_FMA(a, b0, c0[i]);
      c1[i] = AFA_FMA(a, b1, c1[i]);
    }
    panel += AFA_NR;
  }
#pragma GCC unroll 8
  for (int i = 0; i < AFA_MR; ++i) {
    if (i >= mr) break;
    const float s = rscale ? rscale[i] : alpha;
    const afa_vf v0 = c0[i] * s, v1 = c1[i] * s;
    float *row = c + i * ldc;
    if (nr == AFA_NR && ccs == 1) {
      *(afa_vf *)row = v0;
      *(afa_vf *)(row + AFA_VL) = v1;
    } else {
      float tmp[AFA_NR];
      memcpy(tmp, &v0, sizeof v0);
      memcpy(tmp + AFA_VL, &v1, sizeof v1);
      for (int j = 0; j < nr; ++j) row[j * ccs] = tmp[j];
    }
  }
}

/* K[keys x d] (row stride rs, column stride cs) into the d x keys panels of afa_qk. */
static void afa_pack_kt(int64_t keys, int64_t d, const float *k, int64_t rs, int64_t cs, float *kt) {
  for (int64_t p = 0; p < keys; p += AFA_NR) {
    const int64_t cols = keys - p < AFA_NR ? keys - p : AFA_NR;
    float *dst = kt + p * d;
    if (cols < AFA_NR) memset(dst, 0, sizeof(float) * (size_t)(d * AFA_NR));
    int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
    /* 8 keys x 8 depth steps at a time through an 8 x 8 register transpose rather than one
     * strided scalar store per element (ViT-B/16's K^T packing per layer 0.10-0.15 ms, 2-3% of
     * the kernel, on AMD EPYC Zen 1; K^T and V of its 12 heads 0.055 -> 0.024 ms on Zen 5). */
    if (cs == 1)
      for (; j + 8 <= cols; j += 8) {
        const float *src = k + (p + j) * rs;
        int64_t kk = 0;
        for (; kk + 8 <= d; kk += 8) {
          __m256 t[8];
          for (int x = 0; x < 8; ++x) t[x] = _mm256_loadu_ps(src + x * rs + kk);
          afv_transpose8x8(t); /* t[x]: keys j..j+7 at depth kk + x */
          for (int x = 0; x < 8; ++x) _mm256_storeu_ps(dst + (kk + x) * AFA_NR + j, t[x]);
        }
        for (; kk < d; ++kk)
          for (int x = 0; x < 8; ++x) dst[kk * AFA_NR + j + x] = src[x * rs + kk];
      }
#endif
    for (; j < cols; ++j) {
      const float *src = k + (p + j) * rs;
      for (int64_t kk = 0; kk < d; ++kk) dst[kk * AFA_NR + j] = src[kk * cs];
    }
  }
}

/* V[keys x dv] (row stride rs, column stride cs) into the keys x dv panels of afa_pv. */
static void afa_pack_v(int64_t keys, int64_t dv, const float *v, int64_t rs, int64_t cs, float *vp) {
  for (int64_t p = 0; p < dv; p += AFA_NR) {
    const int64_t cols = dv - p < AFA_NR ? dv - p : AFA_NR;
    float *dst = vp + p * keys;
    for (int64_t kk = 0; kk < keys; ++kk) {
      const float *src = v + kk * rs + p * cs;
      float *d = dst + kk * AFA_NR;
      if (cs == 1 && cols == AFA_NR) {
        memcpy(d, src, sizeof(float) * AFA_NR);
      } else {
        for (int64_t j = 0; j < cols; ++j) d[j] = src[j * cs];
        for (int64_t j = cols; j < AFA_NR; ++j) d[j] = 0.0f;
      }
    }
  }
}

/* exp(x) for x <= 0 (a score minus its row's maximum), 0 below -87 (as the row kernels flush
 * it); NaN stays NaN. Cephes' expf: x = n ln2 + r with ln2 in two parts, |r| <= ln2 / 2, a
 * degree-7 polynomial for e^r, then 2^n. Within 1 ulp of the correctly rounded exp on every
 * float in [-87, 0] (checked exhaustively on AVX-512; test_attention_tiles.py samples it on
 * every ISA). Inline rather than the vector math library's call: glibc's 16-lane expf costs
 * about 14 cycles a vector on AMD EPYC Zen 5, most of ViT-B/16's softmax time. */
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#define AFA_LOG2E 1.44269504088896341f
#define AFA_LN2_HI 0.693359375f /* ln 2 = AFA_LN2_HI + AFA_LN2_LO, the first exact in 9 bits */
#define AFA_LN2_LO -2.12194440e-4f
/* e^r = 1 + r + r^2 P(r), P's coefficients highest power first */
static const float afa_exp_poly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                      4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
#endif
#if defined(__AVX512F__)
static inline __attribute__((always_inline)) __m512 afa_exp(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.0f);
  const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  x = _mm512_max_ps(lo, x); /* the second operand where either is NaN: NaN stays */
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(AFA_LOG2E)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(AFA_LN2_HI), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(AFA_LN2_LO), r);
  __m512 p = _mm512_set1_ps(afa_exp_poly[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(afa_exp_poly[i]));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_scalef_ps((__mmask16)~under, p, n);
}
#elif defined(__AVX2__) && defined(__FMA__)
static inline __attribute__((always_inline)) __m256 afa_exp(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.0f);
  const __m256 keep = _mm256_cmp_ps(x, lo, _CMP_NLT_UQ); /* x >= -87 or NaN */
  x = _mm256_max_ps(lo, x);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(AFA_LOG2E)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(AFA_LN2_HI), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(AFA_LN2_LO), r);
  __m256 p = _mm256_set1_ps(afa_exp_poly[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(afa_exp_poly[i]));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  /* 2^n for n in [-126, 0] (x >= -87): a normal float's exponent field */
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep);
}
#endif

/* One row of scores s[0, end) into its softmax numerators in place, s[j] = exp(s[j] - max),
 * zeros in s[end, cols) (keys past a causal row's diagonal that its block's P V still reads),
 * and *norm = 1 / sum: the kernel's scores are already scaled and masked. A row with no finite
 * score keeps 0 as its max, as the row kernels do, so exp never sees inf - inf. */
static void afa_softmax_row(float *s, int64_t end, int64_t cols, float *norm) {
  int64_t j = 0;
  float mx, total;
#if defined(__AVX512F__)
  __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0;
  for (; j + 32 <= end; j += 32) {
    m0 = _mm512_max_ps(_mm512_loadu_ps(s + j), m0);
    m1 = _mm512_max_ps(_mm512_loadu_ps(s + j + 16), m1);
  }
  for (; j < end; j += 16) {
    const __mmask16 k = end - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (end - j)) - 1u);
    m0 = _mm512_max_ps(_mm512_mask_loadu_ps(m0, k, s + j), m0);
  }
  mx = _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0;
  for (; j + 16 <= end; j += 16) {
    m0 = _mm256_max_ps(_mm256_loadu_ps(s + j), m0);
    m1 = _mm256_max_ps(_mm256_loadu_ps(s + j + 8), m1);
  }
  m0 = _mm256_max_ps(m0, m1);
  float lanes[8];
  _mm256_storeu_ps(lanes, m0);
  mx = lanes[0];
  for (int l = 1; l < 8; ++l) mx = lanes[l] > mx ? lanes[l] : mx;
  for (; j < end; ++j) mx = s[j] > mx ? s[j] : mx;
#else
  mx = -INFINITY;
  for (; j < end; ++j) mx = s[j] > mx ? s[j] : mx;
#endif
  if (mx == -INFINITY) mx = 0.0f;
  j = 0;
#if defined(__AVX512F__)
  const __m512 vm = _mm512_set1_ps(mx);
  __m512 t0 = _mm512_setzero_ps(), t1 = t0;
  for (; j + 32 <= end; j += 32) {
    const __m512 e0 = afa_exp(_mm512_sub_ps(_mm512_loadu_ps(s + j), vm));
    const __m512 e1 = afa_exp(_mm512_sub_ps(_mm512_loadu_ps(s + j + 16), vm));
    _mm512_storeu_ps(s + j, e0);
    _mm512_storeu_ps(s + j + 16, e1);
    t0 = _mm512_add_ps(t0, e0);
    t1 = _mm512_add_ps(t1, e1);
  }
  for (; j < end; j += 16) {
    const __mmask16 k = end - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (end - j)) - 1u);
    const __m512 e = _mm512_maskz_mov_ps(k, afa_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), vm)));
    _mm512_mask_storeu_ps(s + j, k, e);
    t0 = _mm512_add_ps(t0, e);
  }
  total = _mm512_reduce_add_ps(_mm512_add_ps(t0, t1));
#elif defined(__AVX2__) && defined(__FMA__)
  const __m256 vm = _mm256_set1_ps(mx);
  __m256 t0 = _mm256_setzero_ps(), t1 = t0;
  for (; j + 16 <= end; j += 16) {
    const __m256 e0 = afa_exp(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
    const __m256 e1 = afa_exp(_mm256_sub_ps(_mm256_loadu_ps(s + j + 8), vm));
    _mm256_storeu_ps(s + j, e0);
    _mm256_storeu_ps(s + j + 8, e1);
    t0 = _mm256_add_ps(t0, e0);
    t1 = _mm256_add_ps(t1, e1);
  }
  if (j < end) { /* the last 1-15 keys as whole vectors of a copy padded with -inf (exp: 0) */
    float tail[16];
    const int64_t left = end - j;
    for (int x = 0; x < 16; ++x) tail[x] = x < left ? s[j + x] : -INFINITY;
    const __m256 e0 = afa_exp(_mm256_sub_ps(_mm256_loadu_ps(tail), vm));
    const __m256 e1 = afa_exp(_mm256_sub_ps(_mm256_loadu_ps(tail + 8), vm));
    _mm256_storeu_ps(tail, e0);
    _mm256_storeu_ps(tail + 8, e1);
    t0 = _mm256_add_ps(t0, e0);
    t1 = _mm256_add_ps(t1, e1);
    for (int64_t x = 0; x < left; ++x) s[j + x] = tail[x];
  }
  float sums[8];
  _mm256_storeu_ps(sums, _mm256_add_ps(t0, t1));
  total = 0.0f;
  for (int l = 0; l < 8; ++l) total += sums[l];
#else
  total = 0.0f;
  for (; j < end; ++j) {
    const float x = s[j] - mx;
    s[j] = x < -87.0f ? 0.0f : expf(x);
    total += s[j];
  }
#endif
  for (j = end; j < cols; ++j) s[j] = 0.0f;
  *norm = 1.0f / total;
}

/* The keys a tile of rows [i0, i0 + mr) of a block needs: all `cols`, or for a causal block
 * (lead: the block's first row plus the diagonal's offset) those up to its last row's diagonal. */
static inline int64_t afa_keys(int64_t cols, int64_t lead, int64_t i0, int mr) {
  const int64_t last = lead + i0 + mr;
  return last < cols ? (last > 0 ? last : 0) : cols;
}

/* S[n x cols] (row stride lds) = alpha * Q[n x d] (row stride rs, column stride cs) x K^T, with
 * K^T the panels of afa_pack_kt (depth d). Panels outer: one K^T panel stays in L1 while the
 * row tiles of Q pass it. A tile of rows skips the panels past afa_keys (lead >= cols: none);
 * the caller masks what a partial panel stores past a row's diagonal. */
static void afa_qk(int64_t n, int64_t cols, int64_t d, float alpha, const float *q, int64_t rs,
                   int64_t cs, const float *kt, float *s, int64_t lds, int64_t lead) {
  for (int64_t p = 0; p < cols; p += AFA_NR) {
    const int nr = (int)(cols - p < AFA_NR ? cols - p : AFA_NR);
    for (int64_t i0 = 0; i0 < n; i0 += AFA_MR) {
      const int mr = (int)(n - i0 < AFA_MR ? n - i0 : AFA_MR);
      if (p >= afa_keys(cols, lead, i0, mr)) continue;
      const float *rows[AFA_MR];
      for (int i = 0; i < AFA_MR; ++i) rows[i] = q + (i0 + (i < mr ? i : 0)) * rs;
      afa_tile(d, rows, cs, kt + p * d, s + i0 * lds + p, lds, 1, mr, nr, alpha, 0);
    }
  }
}

/* O[n x dv] (row stride ldo, column stride ocs) = diag(norm) * P[n x cols] (row stride ldp) x V, with
 * V the panels of afa_pack_v over `keys` rows (keys >= cols: a causal block stops early). A tile
 * of rows sums over afa_keys keys only (P is 0 past each row's diagonal). */
static void afa_pv(int64_t n, int64_t dv, int64_t cols, const float *pm, int64_t ldp, const float *vp,
                   int64_t keys, const float *norm, float *o, int64_t ldo, int64_t ocs, int64_t lead) {
  /* AVX2 runs row tiles outer, so a tile's AFA_MR rows of P stay in L1 while the V panels pass
   * them, rather than every V panel streaming the whole block of P from L2 again: ViT-B/16's
   * P V per layer 1.84 -> 1.70 ms (AMD EPYC Zen 1, 1 thread: 32 -> 35 GFLOP/s). Other builds
   * keep V panels outer, as measured before. */
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
  const int rows_outer = 1;
#else
  const int rows_outer = 0;
#endif
  const int64_t outer = rows_outer ? n : dv, outer_step = rows_outer ? AFA_MR : AFA_NR;
  const int64_t inner = rows_outer ? dv : n, inner_step = rows_outer ? AFA_NR : AFA_MR;
  for (int64_t x = 0; x < outer; x += outer_step) {
    for (int64_t y = 0; y < inner; y += inner_step) {
      const int64_t i0 = rows_outer ? x : y, p = rows_outer ? y : x;
      const int nr = (int)(dv - p < AFA_NR ? dv - p : AFA_NR);
      const int mr = (int)(n - i0 < AFA_MR ? n - i0 : AFA_MR);
      const float *rows[AFA_MR];
      for (int i = 0; i < AFA_MR; ++i) rows[i] = pm + (i0 + (i < mr ? i : 0)) * ldp;
      afa_tile(afa_keys(cols, lead, i0, mr), rows, 1, vp + p * keys, o + i0 * ldo + p * ocs, ldo, ocs, mr,
               nr, 1.0f, norm + i0);
    }
  }
}
#endif
