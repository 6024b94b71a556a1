/* afc.c - the contraction library (see afc.h for the ABI). Included after afc.h. The guard lets
 * every kernel of a combined translation unit carry the library while only the first copy is
 * compiled. */
#ifndef AFC_IMPL
#define AFC_IMPL
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#define AFC_BUF_FLOATS (AFC_KC * AFC_NC > AFC_MC * AFC_KC ? AFC_KC * AFC_NC : AFC_MC * AFC_KC)

/* The depth of each K block: K (> 0) split into equal blocks of at most `most` (AFC_KC for the
 * drivers' blocks), so no block is a thin remainder (K = 576 runs as 2 x 288, not 256 + 256 + 64:
 * every block re-reads and re-writes the C tile, which a thin one does not amortize). */
static inline int64_t afc_depth_block(int64_t k, int64_t most) {
  const int64_t blocks = (k + most - 1) / most;
  return (k + blocks - 1) / blocks;
}

static inline int64_t afc_kc(int64_t k) { return afc_depth_block(k, AFC_KC); }

/* The rows of each A block of afc_gemm_bp: M split into equal blocks of at most AFC_MC, rounded
 * up to whole panels (a conv's 196 pixels as rows run as 104 + 92, not 192 + 4: every block
 * streams all of B's micro-panels past its A panels, which a 4-row block does not amortize). */
static inline int64_t afc_mc(int64_t m) {
  const int64_t blocks = (m + AFC_MC - 1) / AFC_MC;
  const int64_t rows = (m + blocks - 1) / blocks;
  return (rows + AFC_MR - 1) / AFC_MR * AFC_MR;
}

/* The per-thread block buffer for the operand packed per call: allocated on a thread's first
 * call and kept for the thread's life (OpenMP pools reuse their threads), so a tile costs no
 * malloc. */
static float *afc_buffer(void) {
  static _Thread_local float *buf;
  if (!buf) {
    buf = (float *)aligned_alloc(64, sizeof(float) * AFC_BUF_FLOATS);
    if (!buf) abort();
  }
  return buf;
}

static int64_t afc_packed_a_floats(int64_t m, int64_t k) {
  return (m + AFC_MR - 1) / AFC_MR * AFC_MR * (k > 0 ? k : 1);
}

static int64_t afc_packed_b_floats(int64_t k, int64_t n) {
  return (n + AFC_NR - 1) / AFC_NR * AFC_NR * (k > 0 ? k : 1);
}

#if defined(__AVX2__) && AFC_MR <= 8
/* One panel of `rows` rows (at most MR) of row-major A (unit depth stride) at depths [0, kc): 8
 * depths at a time, the panel's rows (padded to 8 with zeros) transposed in eight ymm registers, MR
 * lanes of each stored. A matmul's activation is packed like this once per tile and depth block;
 * the scalar loop did a strided store per float, about a cycle each: 6-8% of a 128 x 192 tile's
 * time at K = 768 on Zen 4, a tenth of that transposed. Returns the depths done (a multiple of 8). */
static inline __attribute__((always_inline)) int64_t afc_pack_a_panel_rows(const int rows, int64_t kc,
                                                                          const float *a, int64_t rs, float *dst) {
  int64_t kk = 0;
  for (; kk + 8 <= kc; kk += 8) {
    __m256 r[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) r[i] = i < rows ? _mm256_loadu_ps(a + i * rs + kk) : _mm256_setzero_ps();
    afv_transpose8x8(r); /* r[j]: the panel's rows at depth kk + j */
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
#if AFC_MR == 8
      _mm256_storeu_ps(dst + (kk + j) * AFC_MR, r[j]);
#else
      /* MR < 8 lanes per depth: a whole 8-lane store spills 8 - MR zeros into the next depth's
       * slot, which the next store (or the tail loop) overwrites, so only the block's last depth
       * is stored in parts, never past the panel. A masked store (vmaskmovps) instead is
       * microcoded on AMD cores; with it, packing cost 5-7% of a 128 x 192 x 768 tile on Zen 1. */
      if (j < 7) {
        _mm256_storeu_ps(dst + (kk + j) * AFC_MR, r[j]);
      } else {
        _mm_storeu_ps(dst + (kk + j) * AFC_MR, _mm256_castps256_ps128(r[j]));
        _mm_storel_pi((__m64 *)(dst + (kk + j) * AFC_MR + 4), _mm256_extractf128_ps(r[j], 1));
      }
#endif
    }
  }
  return kk;
}
#endif

/* The rows of A-panel `p` of an m-row block of the rows paths (afc_gemm_bp, afc_conv_bp: pixels or
 * tokens as rows; `balance` 0: the weights' panels of the columns paths, p * MR on): `*start` and
 * `*rows`. A block keeps ceil(m / MR) panels, but on AVX2 their rows are balanced (49 pixels: 4
 * panels of 6 and 5 of 5, not 8 of 6 and one of 1; 32 tokens: 2 of 6 and 4 of 5, not 5 of 6 and one
 * of 2): the kernels run a panel of 4 or 5 rows at full speed (afc_ukernel: 8 or 10 accumulator
 * chains keep both FMA pipes busy), while a last panel of 1-3 rows waits on the FMA latency (2-6
 * chains): the 49th row of a 49-row product cost 0.62 of a 6-row panel. The same products, bit for
 * bit. Measured in C, one thread, B from L2/L3, best of 100 (AMD EPYC Zen 3), fixed -> balanced
 * panels: ResNet-50's 7x7 1x1s (49 pixels; 2048 -> 512, 512 -> 2048) 1.102 -> 1.058 and 1.091 ->
 * 1.039 ms, MobileNetV2's 960 -> 160 0.170 -> 0.163; a matmul chain's 32-row blocks (BERT's FFN,
 * 768 -> 3072 and 3072 -> 768) 1.636 -> 1.544 and 1.634 -> 1.556, 128 tokens x 768 x 768 1.540 ->
 * 1.522. The kernels in one process (benchmarks/anchor_ab.py, two threads): ResNet-50's 7x7 convs
 * 0.94-0.97 of their time, BERT's FFN chain 0.96; whole BERT-base 0.99 (both library texts compiled
 * into one process).
 * AVX-512 (8-row panels, one 512-bit FMA a cycle on Zen 4, latency 4): a panel of r rows costs about
 * 2r cycles a depth step where afc_ukernel runs exactly its rows (7 and 6 rows, 14 and 12
 * accumulators) but a tail of 1 row 4 cycles, of 2-4 rows 8 (the half kernel) and of 5 rows 12 (4 +
 * 1); balanced panels cost 2m, so they win when m % 8 is 1, 2, 3 or 5 (49 pixels: 7 panels of 7,
 * not 6 of 8 and one of 1), tie at 6 or 7 and at 4, where they measured 1.5% slower (ResNet-50's
 * 14x14 3x3 in tiles of 100 pixels: 4 panels of 7 rows against a half panel), so that one stays
 * fixed. Two threads, Zen 4, both library texts in one process (benchmarks/anchor_ab.py): ResNet-50's
 * 7x7 3x3 0.96-0.98 of its time, its 7x7 1x1s 0.95-0.99, MobileNetV2's 960 -> 320 0.96. */
#if AFC_MR == 6 || AFC_MR == 8
#define AFC_BALANCED_PANELS 1
#else
#define AFC_BALANCED_PANELS 0
#endif
static inline void afc_panel_span(int64_t m, int64_t p, int balance, int64_t *start, int *rows) {
  if (balance && AFC_BALANCED_PANELS && (AFC_MR != 8 || m % 8 != 4)) {
    const int64_t panels = (m + AFC_MR - 1) / AFC_MR, q = m / panels, extra = m % panels;
    *start = p * q + (p < extra ? p : extra);
    *rows = (int)(q + (p < extra));
  } else {
    *start = p * AFC_MR;
    *rows = (int)(m - *start < AFC_MR ? m - *start : AFC_MR);
  }
}

/* Rows [0, m) x depth [0, kc) of a strided A into A-panels of depth `kc` (panel stride kc*MR),
 * panel p holding the rows afc_panel_span(m, p, balance) gives it. */
static void afc_pack_a_spans(int64_t m, int64_t kc, const float *a, int64_t rs, int64_t cs, float *ap, int balance) {
  for (int64_t panel = 0; panel * AFC_MR < m; ++panel) {
    int64_t p;
    int rows;
    afc_panel_span(m, panel, balance, &p, &rows);
    float *dst = ap + panel * AFC_MR * kc;
#if defined(__AVX2__) && AFC_MR <= 8
    /* whole panels by register transposes (MR rows, a compile-time count), and so the short ones
     * the rows paths balance to (any count: 49 rows as 7 x 7 on AVX-512, 10 as 5 x 5), zeros in the
     * lanes past `rows` */
    if (cs == 1) {
      const float *src = a + p * rs;
      int64_t kk = rows == AFC_MR ? afc_pack_a_panel_rows(AFC_MR, kc, src, rs, dst)
                                  : afc_pack_a_panel_rows(rows, kc, src, rs, dst);
      for (; kk < kc; ++kk)
        for (int64_t i = 0; i < AFC_MR; ++i) dst[kk * AFC_MR + i] = i < rows ? src[i * rs + kk] : 0.0f;
      continue;
    }
#endif
#if defined(__AVX512VL__) && AFC_MR == 8
    if (rs == 1 && cs != 1) {
      /* A read transposed (below), a panel's rows by one masked load per depth: the lanes past
       * `rows` read as zeros (and no memory past the rows), so a 7-row panel costs what a whole
       * one does, where a float at a time it had cost ResNet-50's 7x7 1x1 of 2048 channels 7%. */
      const float *src = a + p;
      const __mmask8 lanes = (__mmask8)((1u << rows) - 1u);
      for (int64_t kk = 0; kk < kc; ++kk)
        _mm256_storeu_ps(dst + kk * AFC_MR, _mm256_maskz_loadu_ps(lanes, src + kk * cs));
      continue;
    }
#endif
    if (rows < AFC_MR) memset(dst, 0, sizeof(float) * (size_t)(kc * AFC_MR));
    if (rs == 1 && cs != 1) {
      /* A read transposed (a conv's pixels as rows: A[pixel][channel] = x[channel * ld + pixel]):
       * a panel's MR rows at one depth are contiguous, one short copy per depth. */
      const float *src = a + p;
      if (rows == AFC_MR) {
        for (int64_t kk = 0; kk < kc; ++kk) memcpy(dst + kk * AFC_MR, src + kk * cs, sizeof(float) * AFC_MR);
      } else {
        for (int64_t kk = 0; kk < kc; ++kk)
          for (int64_t i = 0; i < rows; ++i) dst[kk * AFC_MR + i] = src[kk * cs + i];
      }
      continue;
    }
    for (int64_t i = 0; i < rows; ++i) {
      const float *src = a + (p + i) * rs;
      if (cs == 1) {
        for (int64_t kk = 0; kk < kc; ++kk) dst[kk * AFC_MR + i] = src[kk];
      } else {
        for (int64_t kk = 0; kk < kc; ++kk) dst[kk * AFC_MR + i] = src[kk * cs];
      }
    }
  }
}

/* Depth [0, kc) x columns [0, n) of a strided B into B-panels of depth `kc` (panel stride kc*NR). */
static void afc_pack_b_block(int64_t kc, int64_t n, const float *b, int64_t rs, int64_t cs, float *bp) {
  for (int64_t q = 0; q < n; q += AFC_NR) {
    const int64_t cols = n - q < AFC_NR ? n - q : AFC_NR;
    float *dst = bp + q * kc;
    for (int64_t kk = 0; kk < kc; ++kk) {
      float *d = dst + kk * AFC_NR;
      const float *src = b + kk * rs + q * cs;
      if (cs == 1 && cols == AFC_NR) {
        memcpy(d, src, sizeof(float) * AFC_NR);
      } else {
        for (int64_t j = 0; j < cols; ++j) d[j] = src[j * cs];
        for (int64_t j = cols; j < AFC_NR; ++j) d[j] = 0.0f;
      }
    }
  }
}

static void afc_pack_a(int64_t m, int64_t k, const float *a, int64_t rs, int64_t cs, float *ap) {
  afc_pack_a_spans(m, k, a, rs, cs, ap, 0);
}

static void afc_pack_b(int64_t k, int64_t n, const float *b, int64_t rs, int64_t cs, float *bp) {
  afc_pack_b_block(k, n, b, rs, cs, bp);
}

/* The micro-kernel's operands at depth kk. Packed panels, unless a driver reads one operand in
 * place from a conv's input band through the depth offsets `offs` (a tap per depth):
 *   B row kk: of a packed panel, or at `offs[kk]` floats from `bp` (afc_conv_ap: the tap's run of
 *     the band) when `offs` is given and `arow` is not;
 *   A element (i, kk): of a packed panel (`ap`, advanced MR floats per depth), or, with `arow`
 *     (afc_conv_bp: a pixel per tile row), at `arow[i] + offs[kk]`, B then packed.
 * `offs` and `arow` are compile-time constants (null or not) in every inlined call, so the GEMM
 * drivers' micro-kernels index their panels directly. */
#define AFC_BROW(bp, arow, offs, kk) ((offs) && !(arow) ? (bp) + (offs)[kk] : (bp) + (kk) * AFC_NR)
#define AFC_APTR(ap, arow, offs, kk, i) ((arow) ? (arow)[i] + (offs)[kk] : (ap) + (i))

/* Post-ops of a finished product tile (afc_gemm_ap_post): rows [i0, i0 + mr) and columns
 * [j0, j0 + nr) of C, right after the micro-kernel stored them (in L1), in the order and with the
 * comparisons of the ONNX ops they stand for (ops/elementwise.py): + bias[i], then + the residual,
 * then Relu (v > 0 ? v : 0) or Clip (v < lo ? lo : v, then v > hi ? hi : v). */
static inline void afc_post_tile(const afc_post *p, int64_t i0, int64_t j0, int mr, int nr, float *c, int64_t ldc) {
  for (int i = 0; i < mr; ++i) {
    float *restrict row = c + i * ldc;
    const float bias = p->bias ? p->bias[i0 + i] : 0.0f;
    const float *restrict res = p->res ? p->res + (i0 + i) * p->res_ld + j0 : 0;
    const int has_bias = p->bias != 0, has_res = p->res != 0, act = p->act;
    const float lo = p->lo, hi = p->hi;
#pragma omp simd
    for (int j = 0; j < nr; ++j) {
      float v = row[j];
      if (has_bias) v = v + bias;
      if (has_res) v = v + res[j];
      if (act == AFC_POST_RELU) v = v > 0.0f ? v : 0.0f;
      if (act == AFC_POST_CLIP) {
        v = v < lo ? lo : v;
        v = v > hi ? hi : v;
      }
      row[j] = v;
    }
  }
}

#if defined(__AVX2__)
/* The post-ops of afc_post_tile on one 8-float vector of tile row i in registers, before its
 * store (`r`: the residual at the vector's first column, or NULL): the AVX2 micro-kernel's, and
 * afc_store_t_post's on every AVX2-capable build. */
static inline __attribute__((always_inline)) __m256 afc_post_v8(const afc_post *p, int64_t i, const float *r,
                                                               __m256 v) {
  if (p->bias) v = _mm256_add_ps(v, _mm256_set1_ps(p->bias[i]));
  if (r) v = _mm256_add_ps(v, _mm256_loadu_ps(r));
  if (p->act == AFC_POST_RELU) {
    v = _mm256_and_ps(v, _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_GT_OQ));
  } else if (p->act == AFC_POST_CLIP) {
    const __m256 lo = _mm256_set1_ps(p->lo), hi = _mm256_set1_ps(p->hi);
    v = _mm256_blendv_ps(v, lo, _mm256_cmp_ps(v, lo, _CMP_LT_OQ));
    v = _mm256_blendv_ps(v, hi, _mm256_cmp_ps(v, hi, _CMP_GT_OQ));
  }
  return v;
}
#endif

/* The micro-kernel: C[mr x nr] (= or +=) alpha * sum_kk ap[kk][0:MR] (x) bp[kk][0:NR].
 * `ap`, `bp` are panels of depth kc; mr <= MR and nr <= NR say how much of the tile is stored.
 * `pf` (advancing `pfs` floats per depth step, one prefetch per step: a new line every 16 / pfs
 * steps) is (a share of) the panel the driver streams next: a weight panel that comes from L3 or
 * memory arrives while this one computes (the hardware prefetcher ramps up again at every 4 KiB
 * page of a panel). Drivers pass the current panel with pfs = 0 when there is nothing to fetch. */
#if defined(__AVX512F__)
/* A tile of at most 16 columns (the tail of a row of panels: 196 = 6 x 32 + 4 pixels) runs on
 * one vector per row, half the FMAs of the full kernel. */
static inline __attribute__((always_inline)) void afc_ukernel_16(const int R, int64_t kc, const float *restrict ap,
                                                                 const float *const *arow,
                                                                 const float *restrict bp, const int32_t *offs,
                                                                 float *restrict c, int64_t ldc, int mr, int nr,
                                                                 float alpha, int acc) {
  __m512 c0[AFC_MR];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) c0[i] = _mm512_setzero_ps();
  for (int64_t kk = 0; kk < kc; ++kk) {
    const __m512 b0 = _mm512_loadu_ps(AFC_BROW(bp, arow, offs, kk));
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i)
      c0[i] = _mm512_fmadd_ps(_mm512_set1_ps(*AFC_APTR(ap, arow, offs, kk, i)), b0, c0[i]);
    if (!arow) ap += AFC_MR;
  }
  const __m512 va = _mm512_set1_ps(alpha);
  const __mmask16 k0 = (__mmask16)(nr >= 16 ? 0xFFFFu : (1u << nr) - 1u);
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
    if (i >= mr) break;
    float *row = c + i * ldc;
    __m512 v = alpha != 1.0f ? _mm512_mul_ps(c0[i], va) : c0[i];
    if (acc) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(k0, row));
    _mm512_mask_storeu_ps(row, k0, v);
  }
}

/* The post-ops of afc_post_tile on one vector of tile row i in registers, before its store (`r`:
 * the residual at the vector's first column, or NULL; `k`: its valid lanes). */
static inline __attribute__((always_inline)) __m512 afc_post_v16(const afc_post *p, int64_t i, const float *r,
                                                                __mmask16 k, __m512 v) {
  if (p->bias) v = _mm512_add_ps(v, _mm512_set1_ps(p->bias[i]));
  if (r) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(k, r));
  if (p->act == AFC_POST_RELU) {
    v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GT_OQ), v);
  } else if (p->act == AFC_POST_CLIP) {
    const __m512 lo = _mm512_set1_ps(p->lo), hi = _mm512_set1_ps(p->hi);
    v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, lo, _CMP_LT_OQ), lo);
    v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, hi, _CMP_GT_OQ), hi);
  }
  return v;
}

/* ... on a tile row's two vectors (columns j .. j + 31). */
static inline __attribute__((always_inline)) void afc_post_row(const afc_post *p, int64_t i, int64_t j,
                                                             __mmask16 k0, __mmask16 k1, __m512 *v0, __m512 *v1) {
  const float *r = p->res ? p->res + i * p->res_ld + j : 0;
  *v0 = afc_post_v16(p, i, r, k0, *v0);
  *v1 = afc_post_v16(p, i, r ? r + 16 : 0, k1, *v1);
}

/* `post` (the tile's first row and column in the call: pi0, pj0) is applied to the accumulators
 * before they are stored (afc_gemm_ap_post); the one-vector tail applies it after. */
static inline __attribute__((always_inline)) void afc_ukernel_rp(const int R, int64_t kc, const float *restrict ap,
                                                               const float *const *arow,
                                                               const float *restrict bp, const int32_t *offs,
                                                               float *restrict c, int64_t ldc, int mr, int nr,
                                                               float alpha, int acc, const float *pf, int64_t pfs,
                                                               const afc_post *post, int64_t pi0, int64_t pj0) {
  if (nr <= 16) {
    afc_ukernel_16(R, kc, ap, arow, bp, offs, c, ldc, mr, nr, alpha, acc);
    if (post) afc_post_tile(post, pi0, pj0, mr, nr, c, ldc);
    return;
  }
  __m512 c0[AFC_MR], c1[AFC_MR];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
    c0[i] = _mm512_setzero_ps();
    c1[i] = _mm512_setzero_ps();
  }
  for (int64_t kk = 0; kk < kc; ++kk) {
    if (!arow) { /* afc_conv_bp's in-place A has no panel stream to fetch ahead */
      _mm_prefetch((const char *)pf, _MM_HINT_T0);
      pf += pfs;
    }
    const float *b = AFC_BROW(bp, arow, offs, kk);
    const __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const __m512 a = _mm512_set1_ps(*AFC_APTR(ap, arow, offs, kk, i));
      c0[i] = _mm512_fmadd_ps(a, b0, c0[i]);
      c1[i] = _mm512_fmadd_ps(a, b1, c1[i]);
    }
    if (!arow) ap += AFC_MR;
  }
  const __m512 va = _mm512_set1_ps(alpha);
  const __mmask16 k0 = nr >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nr) - 1u);
  const __mmask16 k1 = nr >= 32 ? (__mmask16)0xFFFF : nr > 16 ? (__mmask16)((1u << (nr - 16)) - 1u) : 0;
  if (alpha != 1.0f) {
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      c0[i] = _mm512_mul_ps(c0[i], va);
      c1[i] = _mm512_mul_ps(c1[i], va);
    }
  }
  if (mr == AFC_MR && nr == AFC_NR) {
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      float *row = c + i * ldc;
      if (acc) {
        c0[i] = _mm512_add_ps(c0[i], _mm512_loadu_ps(row));
        c1[i] = _mm512_add_ps(c1[i], _mm512_loadu_ps(row + 16));
      }
      if (post) afc_post_row(post, pi0 + i, pj0, (__mmask16)0xFFFF, (__mmask16)0xFFFF, &c0[i], &c1[i]);
      _mm512_storeu_ps(row, c0[i]);
      _mm512_storeu_ps(row + 16, c1[i]);
    }
    return;
  }
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
    if (i >= mr) break;
    float *row = c + i * ldc;
    if (acc) {
      c0[i] = _mm512_add_ps(c0[i], _mm512_maskz_loadu_ps(k0, row));
      c1[i] = _mm512_add_ps(c1[i], _mm512_maskz_loadu_ps(k1, row + 16));
    }
    if (post) afc_post_row(post, pi0 + i, pj0, k0, k1, &c0[i], &c1[i]);
    _mm512_mask_storeu_ps(row, k0, c0[i]);
    _mm512_mask_storeu_ps(row + 16, k1, c1[i]);
  }
}

static inline __attribute__((always_inline)) void afc_ukernel_r(const int R, int64_t kc, const float *restrict ap,
                                                              const float *const *arow,
                                                              const float *restrict bp, const int32_t *offs,
                                                              float *restrict c, int64_t ldc, int mr, int nr,
                                                              float alpha, int acc, const float *pf, int64_t pfs) {
  afc_ukernel_rp(R, kc, ap, arow, bp, offs, c, ldc, mr, nr, alpha, acc, pf, pfs, 0, 0, 0);
}
#elif defined(__AVX2__) && defined(__FMA__)
/* A tile of at most 8 columns runs on one vector per row (see the AVX-512 twin). */
static inline __attribute__((always_inline)) void afc_ukernel_8(const int R, int64_t kc, const float *restrict ap,
                                                                const float *const *arow,
                                                                const float *restrict bp, const int32_t *offs,
                                                                float *restrict c, int64_t ldc, int mr, int nr,
                                                                float alpha, int acc) {
  __m256 c0[AFC_MR];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) c0[i] = _mm256_setzero_ps();
  for (int64_t kk = 0; kk < kc; ++kk) {
    const __m256 b0 = _mm256_loadu_ps(AFC_BROW(bp, arow, offs, kk));
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i)
      c0[i] = _mm256_fmadd_ps(_mm256_broadcast_ss(AFC_APTR(ap, arow, offs, kk, i)), b0, c0[i]);
    if (!arow) ap += AFC_MR;
  }
  float tile[AFC_MR * 8];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) _mm256_storeu_ps(tile + i * 8, c0[i]);
  for (int i = 0; i < mr; ++i) {
    float *row = c + i * ldc;
    for (int j = 0; j < nr; ++j) {
      const float v = alpha * tile[i * 8 + j];
      row[j] = acc ? row[j] + v : v;
    }
  }
}

/* `post` as in the AVX-512 twin: on the accumulators of a whole tile, on the stored tile else. */
static inline __attribute__((always_inline)) void afc_ukernel_rp(const int R, int64_t kc, const float *restrict ap,
                                                               const float *const *arow,
                                                               const float *restrict bp, const int32_t *offs,
                                                               float *restrict c, int64_t ldc, int mr, int nr,
                                                               float alpha, int acc, const float *pf, int64_t pfs,
                                                               const afc_post *post, int64_t pi0, int64_t pj0) {
  if (nr <= 8) {
    afc_ukernel_8(R, kc, ap, arow, bp, offs, c, ldc, mr, nr, alpha, acc);
    if (post) afc_post_tile(post, pi0, pj0, mr, nr, c, ldc);
    return;
  }
  __m256 c0[AFC_MR], c1[AFC_MR];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
    c0[i] = _mm256_setzero_ps();
    c1[i] = _mm256_setzero_ps();
  }
  for (int64_t kk = 0; kk < kc; ++kk) {
    if (!arow) { /* afc_conv_bp's in-place A has no panel stream to fetch ahead */
      _mm_prefetch((const char *)pf, _MM_HINT_T0);
      pf += pfs;
    }
    const float *b = AFC_BROW(bp, arow, offs, kk);
    const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const __m256 a = _mm256_broadcast_ss(AFC_APTR(ap, arow, offs, kk, i));
      c0[i] = _mm256_fmadd_ps(a, b0, c0[i]);
      c1[i] = _mm256_fmadd_ps(a, b1, c1[i]);
    }
    if (!arow) ap += AFC_MR;
  }
  const __m256 va = _mm256_set1_ps(alpha);
  if (alpha != 1.0f) {
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      c0[i] = _mm256_mul_ps(c0[i], va);
      c1[i] = _mm256_mul_ps(c1[i], va);
    }
  }
  if (mr == R && nr == AFC_NR) {
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      float *row = c + i * ldc;
      if (acc) {
        c0[i] = _mm256_add_ps(c0[i], _mm256_loadu_ps(row));
        c1[i] = _mm256_add_ps(c1[i], _mm256_loadu_ps(row + 8));
      }
      if (post) {
        const float *r = post->res ? post->res + (pi0 + i) * post->res_ld + pj0 : 0;
        c0[i] = afc_post_v8(post, pi0 + i, r, c0[i]);
        c1[i] = afc_post_v8(post, pi0 + i, r ? r + 8 : 0, c1[i]);
      }
      _mm256_storeu_ps(row, c0[i]);
      _mm256_storeu_ps(row + 8, c1[i]);
    }
    return;
  }
  float tile[AFC_MR * AFC_NR];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
    _mm256_storeu_ps(tile + i * AFC_NR, c0[i]);
    _mm256_storeu_ps(tile + i * AFC_NR + 8, c1[i]);
  }
  for (int i = 0; i < mr; ++i) {
    float *row = c + i * ldc;
    for (int j = 0; j < nr; ++j) row[j] = acc ? row[j] + tile[i * AFC_NR + j] : tile[i * AFC_NR + j];
  }
  if (post) afc_post_tile(post, pi0, pj0, mr, nr, c, ldc);
}

static inline __attribute__((always_inline)) void afc_ukernel_r(const int R, int64_t kc, const float *restrict ap,
                                                              const float *const *arow,
                                                              const float *restrict bp, const int32_t *offs,
                                                              float *restrict c, int64_t ldc, int mr, int nr,
                                                              float alpha, int acc, const float *pf, int64_t pfs) {
  afc_ukernel_rp(R, kc, ap, arow, bp, offs, c, ldc, mr, nr, alpha, acc, pf, pfs, 0, 0, 0);
}
#else
static inline void afc_ukernel_r(const int R, int64_t kc, const float *restrict ap, const float *const *arow,
                                 const float *restrict bp, const int32_t *offs, float *restrict c, int64_t ldc,
                                 int mr, int nr, float alpha, int acc, const float *pf, int64_t pfs) {
  (void)R; /* the portable kernel's cost is per tile row anyway */
  (void)pf;
  (void)pfs;
  float tile[AFC_MR][AFC_NR];
  for (int i = 0; i < AFC_MR; ++i)
    for (int j = 0; j < AFC_NR; ++j) tile[i][j] = 0.0f;
  for (int64_t kk = 0; kk < kc; ++kk) {
    const float *b = AFC_BROW(bp, arow, offs, kk);
    for (int i = 0; i < AFC_MR; ++i) {
      const float a = *AFC_APTR(ap, arow, offs, kk, i);
      for (int j = 0; j < AFC_NR; ++j) tile[i][j] += a * b[j];
    }
    if (!arow) ap += AFC_MR;
  }
  for (int i = 0; i < mr; ++i) {
    float *row = c + i * ldc;
    for (int j = 0; j < nr; ++j) {
      const float v = alpha * tile[i][j];
      row[j] = acc ? row[j] + v : v;
    }
  }
}
#endif

#if !defined(__AVX512F__) && !(defined(__AVX2__) && defined(__FMA__))
/* The portable kernel applies the post-ops to the stored tile, while it is in L1. */
static inline __attribute__((always_inline)) void afc_ukernel_rp(const int R, int64_t kc, const float *restrict ap,
                                                               const float *const *arow,
                                                               const float *restrict bp, const int32_t *offs,
                                                               float *restrict c, int64_t ldc, int mr, int nr,
                                                               float alpha, int acc, const float *pf, int64_t pfs,
                                                               const afc_post *post, int64_t pi0, int64_t pj0) {
  afc_ukernel_r(R, kc, ap, arow, bp, offs, c, ldc, mr, nr, alpha, acc, pf, pfs);
  if (post) afc_post_tile(post, pi0, pj0, mr, nr, c, ldc);
}
#endif

/* The micro-kernel on `mr` valid rows of a panel whose rows are the M side of a pixels- or
 * tokens-as-rows product (afc_gemm_bp, afc_conv_bp), where a panel can have fewer than MR rows
 * (a tile's last, or all of them where afc_panel_span balances a block: ResNet-50's 49 pixels of
 * a 7x7 plane as 7 panels of 7 on AVX-512), and the full kernel would compute the rows past them
 * too. A panel of one row runs a one-row kernel and one of at most MR / 2 rows a half-height one
 * (the row loops are compile-time constants in each), one of MR / 2 + 1 rows runs both (AVX-512),
 * and a panel of 4 or 5 rows (AVX2) or 6 or 7 (AVX-512) runs exactly its rows: the FMAs follow the
 * valid rows. */
static inline __attribute__((always_inline)) void afc_ukernel(int64_t kc, const float *restrict ap,
                                                              const float *const *arow,
                                                              const float *restrict bp, const int32_t *offs,
                                                              float *restrict c, int64_t ldc, int mr, int nr,
                                                              float alpha, int acc, const float *pf, int64_t pfs) {
  if (mr == 1)
    afc_ukernel_r(1, kc, ap, arow, bp, offs, c, ldc, mr, nr, alpha, acc, pf, pfs);
  else if (AFC_MR == 6 && mr == 4)
    /* AVX2's 6-row panels: 4 rows are 8 accumulator chains, enough for both FMA pipes, where 3 + 1
     * ran 6 chains and then 2, each waiting on the FMA latency (ResNet-50's 14x14 convs ended every
     * 100-pixel tile in a panel of 4; one thread, process CPU time, AMD EPYC: 0.980-0.989 of the
     * time for its 3x3 and 1x1s, benchmarks/anchor_ab.py); 5 rows likewise, not 6. The rows paths
     * now balance their panels to 5 or 6 rows where they can (afc_panel_span). */
    afc_ukernel_r(4, kc, ap, arow, bp, offs, c, ldc, mr, nr, alpha, acc, pf, pfs);
  else if (AFC_MR == 6 && mr == 5)
    afc_ukernel_r(5, kc, ap, arow, bp, offs, c, ldc, mr, nr, alpha, acc, pf, pfs);
  else if (AFC_MR == 8 && mr == 7)
    afc_ukernel_r(7, kc, ap, arow, bp, offs, c, ldc, mr, nr, alpha, acc, pf, pfs);
  else if (AFC_MR == 8 && mr == 6)
    afc_ukernel_r(6, kc, ap, arow, bp, offs, c, ldc, mr, nr, alpha, acc, pf, pfs);
  else if (mr <= AFC_MR / 2)
    afc_ukernel_r(AFC_MR / 2, kc, ap, arow, bp, offs, c, ldc, mr, nr, alpha, acc, pf, pfs);
  else if (AFC_MR >= 6 && mr == AFC_MR / 2 + 1) {
    /* AVX-512: ViT-B/16's 197 tokens end in a panel of 5, 4 rows + 1 (not for the portable kernel, which
     * computes all its rows whatever R says: two calls would cost two panels) */
    const int h = AFC_MR / 2;
    afc_ukernel_r(h, kc, ap, arow, bp, offs, c, ldc, h, nr, alpha, acc, pf, pfs);
    afc_ukernel_r(1, kc, arow ? ap : ap + h, arow ? arow + h : arow, bp, offs, c + h * ldc, ldc, 1, nr, alpha, acc,
                  pf, 0);
  } else
    afc_ukernel_r(AFC_MR, kc, ap, arow, bp, offs, c, ldc, mr, nr, alpha, acc, pf, pfs);
}

/* The micro-kernel on one A-panel of a packed left operand (the weight, in the pixels-as-columns
 * paths): AFC_MR rows, or on AVX2 a last panel of 4 rows on exactly its rows, as afc_ukernel
 * does for the rows paths (64 output channels: 10 panels of 6 and one of 4; ResNet-50's 256 -> 64
 * 1x1 at 56x56 0.979-0.988 of the time on one thread, 0.973 on two, AMD EPYC, anchor_ab). The
 * AVX2 kernel keeps a tile in registers through its post-ops whenever its rows are all valid. */
static inline __attribute__((always_inline)) void afc_ukernel_ap(int64_t kc, const float *restrict ap,
                                                               const float *restrict bp, const int32_t *offs,
                                                               float *restrict c, int64_t ldc, int mr, int nr,
                                                               float alpha, int acc, const float *pf, int64_t pfs,
                                                               const afc_post *post, int64_t pi0, int64_t pj0) {
  if (AFC_MR == 6 && mr == 4)
    afc_ukernel_rp(4, kc, ap, 0, bp, offs, c, ldc, mr, nr, alpha, acc, pf, pfs, post, pi0, pj0);
  else
    afc_ukernel_rp(AFC_MR, kc, ap, 0, bp, offs, c, ldc, mr, nr, alpha, acc, pf, pfs, post, pi0, pj0);
}

/* Few rows against packed B (a batch-1..few Gemm/MatMul: GEMV-shaped). The micro-kernel path
 * computes whole AFC_MR-row panels, so at m = 1 it does 8x (AVX-512) the FMAs that matter, and it
 * splits K into blocks that each re-read and re-write C. Here every B panel streams past once,
 * k-major, as packed (the layout needs nothing new: a panel is k * NR contiguous floats, and
 * consecutive panels are consecutive in memory, one stream the hardware prefetcher follows); the m
 * rows of A are broadcast from where they lie (any strides), and the tile stays in registers over
 * the whole depth, written once. One FMA chain per row and vector would stall on the FMA latency
 * (4 cycles, 1-2 issued per cycle) at m = 1-2, so the depth is split over `u` independent chains
 * (u = 4 at one row, 2 at two, 1 from three: 6-8 chains in flight), summed at the end; the sum
 * order is then not the micro-kernel's, which is within the usual fp32 tolerance. Used by
 * afc_gemm_bp below AFC_GEMV_ROWS rows (afc.h says how it was chosen). */
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#if defined(__AVX512F__)
typedef __m512 afc_vec;
#define AFC_VW 16
#define afc_vzero _mm512_setzero_ps
#define afc_vload _mm512_loadu_ps
#define afc_vset1 _mm512_set1_ps
#define afc_vfma _mm512_fmadd_ps
#define afc_vadd _mm512_add_ps
#define afc_vmul _mm512_mul_ps
#define afc_vstore _mm512_storeu_ps
#else
typedef __m256 afc_vec;
#define AFC_VW 8
#define afc_vzero _mm256_setzero_ps
#define afc_vload _mm256_loadu_ps
#define afc_vset1 _mm256_set1_ps
#define afc_vfma _mm256_fmadd_ps
#define afc_vadd _mm256_add_ps
#define afc_vmul _mm256_mul_ps
#define afc_vstore _mm256_storeu_ps
#endif
/* `mr` rows (1..AFC_GEMV_ROWS) and `u` chains are constants once inlined into the switch below. */
static inline __attribute__((always_inline)) void afc_gemv_panel(const int mr, const int u, int64_t k, float alpha,
                                                                 const float *a, int64_t a_rs, int64_t a_cs,
                                                                 const float *restrict bp, float *c, int64_t ldc,
                                                                 int nr) {
  afc_vec acc[7][4][2]; /* at most 7 rows: 14 accumulators and 2 B vectors in 16 registers */
#pragma GCC unroll 8
  for (int r = 0; r < mr; ++r)
#pragma GCC unroll 4
    for (int q = 0; q < u; ++q) acc[r][q][0] = acc[r][q][1] = afc_vzero();
  int64_t kk = 0;
  for (; kk + u <= k; kk += u) {
#pragma GCC unroll 4
    for (int q = 0; q < u; ++q) {
      const float *b = bp + (kk + q) * AFC_NR;
      const afc_vec b0 = afc_vload(b), b1 = afc_vload(b + AFC_VW);
#pragma GCC unroll 8
      for (int r = 0; r < mr; ++r) {
        const afc_vec x = afc_vset1(a[r * a_rs + (kk + q) * a_cs]);
        acc[r][q][0] = afc_vfma(x, b0, acc[r][q][0]);
        acc[r][q][1] = afc_vfma(x, b1, acc[r][q][1]);
      }
    }
  }
  for (; kk < k; ++kk) {
    const float *b = bp + kk * AFC_NR;
    const afc_vec b0 = afc_vload(b), b1 = afc_vload(b + AFC_VW);
#pragma GCC unroll 8
    for (int r = 0; r < mr; ++r) {
      const afc_vec x = afc_vset1(a[r * a_rs + kk * a_cs]);
      acc[r][0][0] = afc_vfma(x, b0, acc[r][0][0]);
      acc[r][0][1] = afc_vfma(x, b1, acc[r][0][1]);
    }
  }
  const afc_vec va = afc_vset1(alpha);
#pragma GCC unroll 8
  for (int r = 0; r < mr; ++r) {
#pragma GCC unroll 4
    for (int q = 1; q < u; ++q) {
      acc[r][0][0] = afc_vadd(acc[r][0][0], acc[r][q][0]);
      acc[r][0][1] = afc_vadd(acc[r][0][1], acc[r][q][1]);
    }
    afc_vec v0 = acc[r][0][0], v1 = acc[r][0][1];
    if (alpha != 1.0f) {
      v0 = afc_vmul(v0, va);
      v1 = afc_vmul(v1, va);
    }
    float *row = c + r * ldc;
    if (nr == AFC_NR) {
      afc_vstore(row, v0);
      afc_vstore(row + AFC_VW, v1);
    } else {
      float tile[AFC_NR];
      afc_vstore(tile, v0);
      afc_vstore(tile + AFC_VW, v1);
      memcpy(row, tile, sizeof(float) * (size_t)nr);
    }
  }
}

static void afc_gemv_bp(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t a_rs,
                        int64_t a_cs, const float *bp, float *c, int64_t ldc) {
  for (int64_t j0 = 0; j0 < n; j0 += AFC_NR) {
    const int nr = (int)(n - j0 < AFC_NR ? n - j0 : AFC_NR);
    const float *panel = bp + j0 * k;
    float *cc = c + j0;
    switch (m) {
      case 1: afc_gemv_panel(1, 4, k, alpha, a, a_rs, a_cs, panel, cc, ldc, nr); break;
      case 2: afc_gemv_panel(2, 2, k, alpha, a, a_rs, a_cs, panel, cc, ldc, nr); break;
      case 3: afc_gemv_panel(3, 1, k, alpha, a, a_rs, a_cs, panel, cc, ldc, nr); break;
      case 4: afc_gemv_panel(4, 1, k, alpha, a, a_rs, a_cs, panel, cc, ldc, nr); break;
      case 5: afc_gemv_panel(5, 1, k, alpha, a, a_rs, a_cs, panel, cc, ldc, nr); break;
      case 6: afc_gemv_panel(6, 1, k, alpha, a, a_rs, a_cs, panel, cc, ldc, nr); break;
      case 7: afc_gemv_panel(7, 1, k, alpha, a, a_rs, a_cs, panel, cc, ldc, nr); break;
      default: abort(); /* at most 7 rows (afc_gemm_bp keeps m within AFC_GEMV_ROWS) */
    }
  }
}
#else
static void afc_gemv_bp(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t a_rs,
                        int64_t a_cs, const float *bp, float *c, int64_t ldc) {
  for (int64_t j0 = 0; j0 < n; j0 += AFC_NR) {
    const int64_t nr = n - j0 < AFC_NR ? n - j0 : AFC_NR;
    const float *panel = bp + j0 * k;
    for (int64_t r = 0; r < m; ++r) {
      float acc[AFC_NR];
      for (int j = 0; j < AFC_NR; ++j) acc[j] = 0.0f;
      for (int64_t kk = 0; kk < k; ++kk) {
        const float x = a[r * a_rs + kk * a_cs];
        for (int j = 0; j < AFC_NR; ++j) acc[j] += x * panel[kk * AFC_NR + j];
      }
      for (int64_t j = 0; j < nr; ++j) c[r * ldc + j0 + j] = alpha * acc[j];
    }
  }
}
#endif

/* The residual of the post-ops' next tile (AFC_MR rows from row i, AFC_NR columns from column j),
 * fetched while this tile computes: its loads come after the depth loop, too late for the
 * out-of-order window to overlap them with the FMAs, so a tile whose residual comes from L3 or
 * memory stalled on them. */
static inline void afc_fetch_res(const afc_post *p, int64_t i, int64_t j, int64_t m) {
  for (int r = 0; r < AFC_MR && i + r < m; ++r) {
    const float *row = p->res + (i + r) * p->res_ld + j;
    __builtin_prefetch(row, 0, 3);
    __builtin_prefetch(row + AFC_NR - 1, 0, 3);
  }
}

/* The depth of afc_gemm_ap_inplace's K blocks. Its B micro-panel is KC rows at B's row stride,
 * which can map them onto few L1 sets: a 56x56 plane's rows (3136 floats) lie 4 sets apart, so
 * 128 rows of one 64-byte line (AVX2's 16 columns) fill all 8 ways of 16 sets, and so do 128 rows
 * of two lines (AVX-512's 32 columns) in 32 sets, the A panels streaming past them too. Measured
 * in C, one thread, B from L3, Zen 4, best of 5 alternating runs: AVX-512 at 128 against 256,
 * ResNet-50's 256 -> 128 at 56x56 2.00 against 2.12 ms (512 -> 128 at 28x28 within 2%), at 64
 * within 3% of 128; AVX2 at 64 against 128, that 256 -> 128 2.17 against 2.30, its 256 -> 64 1.05
 * against 1.14, 512 -> 128 at 28x28 1.02 against 1.04. */
#ifndef AFC_INPLACE_KC
#if defined(__AVX512F__)
#define AFC_INPLACE_KC 128
#else
#define AFC_INPLACE_KC 64
#endif
#endif

/* afc_gemm_ap(_post) for a B of unit column stride (a 1x1 conv's input pixels, an im2col tile)
 * read where it lies instead of packed: the micro-kernel takes B's row kk at b + kk * b_rs
 * (`offs`), as afc_conv_ap reads its band. Packing costs a load and a store per element of B,
 * which the element's M / MR micro-kernel calls must amortize (AFC_INPLACE_MAX_ROWS: few rows), and
 * a 1x1 conv's activation was just written by the previous kernel, in L2 or L3. The Goto order of
 * afc_gemm_ap_impl: a B micro-panel stays in L1 while the A panels stream past it; the first
 * NR / 16 A-panel calls of each micro-panel fetch the next micro-panel's cache lines, one row a
 * depth step (KC rows at B's row stride are KC streams, more than the hardware prefetchers
 * follow); the last micro-panel of a depth block fetches the next block's first one (it had
 * waited on all its lines: ResNet-50's 256 -> 64 at 56x56, two depth blocks, 0.93 of its time on
 * two threads, benchmarks/anchor_ab.py; 0.99 on AVX2, whose 64-deep blocks hide it better).
 * Measured in C, one thread, B from L3 in huge pages as the runtime's arena, best of 5
 * alternating runs (Zen 4), packed -> in place: AVX-512, ResNet-50's 256 -> 64 at 56x56 1.25 ->
 * 0.97-0.98 ms, 256 -> 128 2.14 -> 1.97, 512 -> 128 at 28x28 1.07 -> 0.93, MobileNetV2's 144 -> 24
 * at 56x56 0.31 -> 0.20, 96 -> 24 0.165 -> 0.127, 192 -> 32 at 28x28 0.101 -> 0.088, 32 -> 16 at
 * 112x112 0.17 -> 0.13, 16 -> 96 0.73 -> 0.65-0.72; AVX2, 256 -> 64 1.32 -> 1.05, 144 -> 24 0.25 ->
 * 0.21, 16 -> 96 0.70 -> 0.63. An im2col tile (B hot in L2), AVX-512: ResNet-50's 64-channel 3x3 at
 * 56x56 (784 x 576) 0.57 -> 0.52 ms. In the models, whose activations are mostly hotter than L3,
 * less: ResNet-50's 1x1s at 56x56 0.92-0.96 of their time, the sum of its kernels 0.988 on two
 * threads (both builds in one process, each kernel's fastest of 24 profiled runs; 0.995 for two
 * copies of one build). With a residual among the post-ops, against the packing driver's order
 * for it (A panels outer, the residual fetched ahead): MobileNetV2's 144 -> 24 at 56x56 0.239 ->
 * 0.213 ms (AVX2 0.242 -> 0.217), its 192 -> 32 at 28x28 0.098 -> 0.093, 64 rows (K = 256) at
 * 56x56 1.09 -> 1.04, 128 rows even; at 256 rows (ResNet-50's 64 -> 256 at 56x56, past
 * AFC_INPLACE_MAX_ROWS) 1.09-1.11 packed, 1.57-1.76 in place. A last micro-panel of fewer than NR
 * columns is packed (the micro-kernel loads NR columns, which would read past B's rows).
 * m, n, k > 0. */
static void afc_gemm_ap_inplace(int64_t m, int64_t n, int64_t k, float alpha, const float *ap, const float *b,
                                int64_t b_rs, float *c, int64_t ldc, const afc_post *post) {
  int32_t offs[AFC_INPLACE_KC];
  const int64_t kb = afc_depth_block(k, AFC_INPLACE_KC);
  const int64_t lines = AFC_NR / 16;            /* cache lines in a micro-panel row */
  const int64_t whole = n / AFC_NR * AFC_NR;    /* columns in whole micro-panels */
  const int tail_nr = (int)(n - whole);         /* and in the packed last one */
  for (int64_t k0 = 0; k0 < k; k0 += kb) {
    const int64_t kc = k - k0 < kb ? k - k0 : kb;
    const float *bk = b + k0 * b_rs;
    const afc_post *last = k0 + kc >= k ? post : 0; /* the post-ops finish the last depth block */
    for (int64_t kk = 0; kk < kc; ++kk) offs[kk] = (int32_t)(kk * b_rs);
    float *tail = 0;
    if (tail_nr) {
      tail = afc_buffer();
      afc_pack_b_block(kc, tail_nr, bk + whole, b_rs, 1, tail);
    }
    for (int64_t j0 = 0; j0 < n; j0 += AFC_NR) {
      const int nr = (int)(n - j0 < AFC_NR ? n - j0 : AFC_NR);
      for (int64_t i0 = 0; i0 < m; i0 += AFC_MR) {
        const int mr = (int)(m - i0 < AFC_MR ? m - i0 : AFC_MR);
        const float *a_panel = ap + i0 * k + k0 * AFC_MR;
        const int64_t call = i0 / AFC_MR;
        const float *pf = a_panel;
        int64_t pfs = 0;
        if (j0 + AFC_NR < n && call < lines) { /* line `call` of the next micro-panel's rows */
          pf = bk + j0 + AFC_NR + 16 * call;
          pfs = b_rs;
        } else if (j0 + AFC_NR >= n && k0 + kc < k && call < lines) { /* the next depth block's first */
          pf = bk + kc * b_rs + 16 * call;
          pfs = b_rs;
        } else if (j0 == 0 && i0 + AFC_MR < m) { /* the first pass fetches each A panel's successor */
          pf = a_panel + AFC_MR * k;
          pfs = AFC_MR;
        }
        float *ct = c + i0 * ldc + j0;
        if (j0 < whole)
          afc_ukernel_ap(kc, a_panel, bk + j0, offs, ct, ldc, mr, nr, alpha, k0 > 0, pf, pfs, last, i0, j0);
        else
          afc_ukernel_ap(kc, a_panel, tail, 0, ct, ldc, mr, nr, alpha, k0 > 0, pf, pfs, last, i0, j0);
      }
    }
  }
}

/* A packed once (weights), B strided: B is packed per (KC x NC) block into the thread buffer
 * (L2); the Goto order then keeps one KC x NR B micro-panel in L1 while the MR x KC slices of a
 * block of MC rows of A stream past it. Streaming A rather than B moves a quarter of the bytes
 * per micro-kernel call (MR = NR / 4), which matters when the weights come from memory.
 * Post-ops with a residual run the other order, each A-panel across the block's B panels (these
 * from L2), and fetch the next tile's residual (afc_fetch_res): each residual and output row is
 * then walked in column order instead of one 128-byte piece per visit, which the hardware
 * prefetchers follow. ResNet-50's 64 -> 256 1x1 at 56x56 with its residual, Zen 4, one thread,
 * benchmarks/anchor_ab.py --cpu-time: 0.85-0.90 of the Goto order (AVX-512), 0.89-0.91 (AVX2);
 * without a residual the order measured even (AVX-512) or up to 1.7x slower (AVX2, K = 16). */
static inline __attribute__((always_inline)) void afc_gemm_ap_impl(int64_t m, int64_t n, int64_t k, float alpha,
                                                                   const float *ap, const float *b, int64_t b_rs,
                                                                   int64_t b_cs, float *c, int64_t ldc,
                                                                   const afc_post *post) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    for (int64_t i = 0; i < m; ++i) memset(c + i * ldc, 0, sizeof(float) * (size_t)n);
    if (post) afc_post_tile(post, 0, 0, (int)m, (int)n, c, ldc);
    return;
  }
  float *buf = afc_buffer();
  const int64_t kb = afc_kc(k);
  for (int64_t k0 = 0; k0 < k; k0 += kb) {
    const int64_t kc = k - k0 < kb ? k - k0 : kb;
    for (int64_t n0 = 0; n0 < n; n0 += AFC_NC) {
      const int64_t nc = n - n0 < AFC_NC ? n - n0 : AFC_NC;
      afc_pack_b_block(kc, nc, b + k0 * b_rs + n0 * b_cs, b_rs, b_cs, buf);
      /* The source rows of the next B block (the activation: from L3 or memory), one row per
       * micro-kernel call of the first row block: packing them cold cost 10-19% of a conv's
       * time on Zen 1 (AVX2; 64 x 3136 x 256 at 29.4 GF/s packing vs 34.7 not packing), as
       * the packing walks the rows at the activation's row stride. With this prefetch: +7-9%
       * on that shape, 0-3% on the others (ab of best-of-12 alternating rounds). Left out of
       * AVX-512 builds, which were tuned without it and have not been measured with it. */
      const float *next_b = 0;
      int64_t next_kc = 0, next_step = 0;
#if !defined(__AVX512F__)
      if (b_cs == 1) {
        int64_t next_nc = 0;
        if (n0 + AFC_NC < n) {
          next_b = b + k0 * b_rs + n0 + AFC_NC;
          next_kc = kc;
          next_nc = n - n0 - AFC_NC;
        } else if (k0 + kc < k) {
          next_b = b + (k0 + kc) * b_rs;
          next_kc = k - k0 - kc < kb ? k - k0 - kc : kb;
          next_nc = n;
        }
        next_step = ((next_nc < AFC_NC ? next_nc : AFC_NC) + kc - 1) / kc;
      }
#endif
      for (int64_t i1 = 0; i1 < m; i1 += AFC_MC) {
        const int64_t mc = m - i1 < AFC_MC ? m - i1 : AFC_MC;
        const int64_t calls = (mc + AFC_MR - 1) / AFC_MR;
        if (post && post->res) { /* A-panel outer: each tile row's residual in column order */
          const afc_post *last = k0 + kc >= k ? post : 0; /* the post-ops finish the last depth block */
          for (int64_t i0 = i1; i0 < i1 + mc; i0 += AFC_MR) {
            const int mr = (int)(m - i0 < AFC_MR ? m - i0 : AFC_MR);
            const float *a_panel = ap + i0 * k + k0 * AFC_MR;
            for (int64_t j0 = 0; j0 < nc; j0 += AFC_NR) {
              const int nr = (int)(nc - j0 < AFC_NR ? nc - j0 : AFC_NR);
              const int next_panel = j0 + AFC_NR >= nc && i0 + AFC_MR < m;
              if (last && (next_panel || j0 + AFC_NR < nc))
                afc_fetch_res(last, next_panel ? i0 + AFC_MR : i0, n0 + (next_panel ? 0 : j0 + AFC_NR), m);
              afc_ukernel_ap(kc, a_panel, buf + j0 * kc, 0, c + i0 * ldc + n0 + j0, ldc, mr, nr, alpha, k0 > 0,
                             next_panel ? a_panel + AFC_MR * k : a_panel, next_panel ? AFC_MR : 0, last, i0,
                             n0 + j0);
            }
          }
          continue;
        }
        for (int64_t j0 = 0; j0 < nc; j0 += AFC_NR) {
          const int nr = (int)(nc - j0 < AFC_NR ? nc - j0 : AFC_NR);
          for (int64_t i0 = i1; i0 < i1 + mc; i0 += AFC_MR) {
            const int mr = (int)(m - i0 < AFC_MR ? m - i0 : AFC_MR);
            const float *a_panel = ap + i0 * k + k0 * AFC_MR;
            /* the first pass over the block's A panels fetches each one's successor */
            const int fetch = j0 == 0 && n0 == 0 && i0 + AFC_MR < m;
            const float *pf = fetch ? a_panel + AFC_MR * k : a_panel;
            int64_t pfs = fetch ? AFC_MR : 0;
            const int64_t row = j0 / AFC_NR * calls + (i0 - i1) / AFC_MR;
            if (!fetch && next_b && i1 == 0 && row < next_kc) {
              pf = next_b + row * b_rs;
              pfs = next_step;
            }
            afc_ukernel_ap(kc, a_panel, buf + j0 * kc, 0, c + i0 * ldc + n0 + j0, ldc, mr, nr, alpha, k0 > 0, pf, pfs,
                           k0 + kc >= k ? post : 0, i0, n0 + j0);
          }
        }
      }
    }
  }
}

/* The most rows of A for which afc_gemm_ap(_post) reads B in place. The B micro-panel, its KC rows
 * crowded into few L1 sets, must outlast the A panels of all the rows streaming past it, and
 * packing matters less the more rows share each packed element: in C (Zen 4, AVX-512, one thread,
 * best of 5 alternating runs), packed -> in place, 128 rows 7-13% faster (afc_gemm_ap_inplace),
 * 144-192 within 3%, 256 rows and more slower: ResNet-50's stride-2 downsample as an im2col tile
 * (512 x 256 x 196) 2.00 -> 2.20 ms, 1024 x 512 x 196 1.94 -> 2.13, its classifier (1000 x 2048,
 * one column) 0.61 -> 0.65. */
#define AFC_INPLACE_MAX_ROWS 128

/* Whether afc_gemm_ap(_post) reads B in place (afc_gemm_ap_inplace) rather than packing it. */
static inline int afc_inplace_b(int64_t m, int64_t n, int64_t k, int64_t b_rs, int64_t b_cs) {
  return b_cs == 1 && m > 0 && m <= AFC_INPLACE_MAX_ROWS && n > 0 && k > 0 && b_rs <= INT32_MAX / AFC_INPLACE_KC;
}

static void afc_gemm_ap(int64_t m, int64_t n, int64_t k, float alpha, const float *ap, const float *b,
                        int64_t b_rs, int64_t b_cs, float *c, int64_t ldc) {
  if (afc_inplace_b(m, n, k, b_rs, b_cs))
    afc_gemm_ap_inplace(m, n, k, alpha, ap, b, b_rs, c, ldc, 0);
  else
    afc_gemm_ap_impl(m, n, k, alpha, ap, b, b_rs, b_cs, c, ldc, 0);
}

static void afc_gemm_ap_post(int64_t m, int64_t n, int64_t k, const float *ap, const float *b, int64_t b_rs, float *c,
                             int64_t ldc, const float *bias, const float *res, int64_t res_ld, int act, float lo,
                             float hi) {
  const afc_post post = {bias, res, res_ld, act, lo, hi};
  if (afc_inplace_b(m, n, k, b_rs, 1))
    afc_gemm_ap_inplace(m, n, k, 1.0f, ap, b, b_rs, c, ldc, &post);
  else
    afc_gemm_ap_impl(m, n, k, 1.0f, ap, b, b_rs, 1, c, ldc, &post);
}

/* One packed (mc x kc) block of A-panels (`buf`) against every panel of packed B at depths
 * [k0, k0 + kc), into C rows [0, mc) (`c`): each KC x NR slice of B is reused from L1 across the
 * block's rows. `first` says this is the first row block, whose calls prefetch the next B panel. */
static inline void afc_bp_block(int64_t mc, int64_t n, int64_t k, int64_t k0, int64_t kc, int first,
                                const float *buf, const float *bp, float *c, int64_t ldc, float alpha) {
  for (int64_t j0 = 0; j0 < n; j0 += AFC_NR) {
    const int nr = (int)(n - j0 < AFC_NR ? n - j0 : AFC_NR);
    const float *b_panel = bp + j0 * k + k0 * AFC_NR;
    /* The next B panel (a weight, from L3 or memory on the first row block), its `lines` cache
     * lines spread evenly over all the block's A-panel calls: each call prefetches its share of
     * `per` lines, advancing (per * 16) / kc floats per depth step (several prefetches of one line
     * are free). Fetching the whole panel over the first two calls, a line every 16 cycles, asked
     * for more lines in flight than one core can have from memory (about 14 GB/s); spread over a
     * 128-row block it is a line every ~130 cycles. Measured with weights from memory (96 MiB of
     * copies, 1 thread, process CPU time): 128x768x768 in 128x192 tiles 106 -> 111 GF/s,
     * 128x3072x768 in 128x256 tiles 105 -> 111, 128x768x3072 105 -> 110 (host FMA peak 117). */
    const float *next = j0 + AFC_NR < n ? b_panel + AFC_NR * k : k0 + kc < k ? bp + (k0 + kc) * AFC_NR : 0;
    const int fetch = next && first;
    const int64_t calls = (mc + AFC_MR - 1) / AFC_MR, lines = kc * AFC_NR / 16;
    const int64_t per = (lines + calls - 1) / calls;
    for (int64_t panel = 0; panel < calls; ++panel) {
      int64_t ii;
      int mr;
      afc_panel_span(mc, panel, 1, &ii, &mr);
      const int64_t at = panel * per;
      const int go = fetch && at < lines;
      afc_ukernel(kc, buf + panel * AFC_MR * kc, 0, b_panel, 0, c + ii * ldc + j0, ldc, mr, nr, alpha,
                  k0 > 0, go ? next + at * 16 : b_panel, go ? (per * 16 + kc - 1) / kc : 0);
    }
  }
}

/* A strided, B packed once (weights): A is packed per (MC x KC) block, then `afc_bp_block`.
 * Without `kept` every block goes through the thread buffer; with it, block (k0, i0) has its
 * own place, kept + k0 * mpad + i0 * kc (mpad: m in whole panels), and is packed only where
 * `pack` says (afc_gemm_bp_in). m, n, k > 0. */
static void afc_gemm_bp_blocks(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t a_rs,
                               int64_t a_cs, const float *bp, float *c, int64_t ldc, float *kept, int pack) {
  float *buf = kept ? kept : afc_buffer();
  const int64_t kb = afc_kc(k), mb = afc_mc(m), mpad = (m + AFC_MR - 1) / AFC_MR * AFC_MR;
  for (int64_t k0 = 0; k0 < k; k0 += kb) {
    const int64_t kc = k - k0 < kb ? k - k0 : kb;
    for (int64_t i0 = 0; i0 < m; i0 += mb) {
      const int64_t mc = m - i0 < mb ? m - i0 : mb;
      float *block = kept ? kept + k0 * mpad + i0 * kc : buf;
      if (pack || !kept) afc_pack_a_spans(mc, kc, a + i0 * a_rs + k0 * a_cs, a_rs, a_cs, block, 1);
      afc_bp_block(mc, n, k, k0, kc, i0 == 0, block, bp, c + i0 * ldc, ldc, alpha);
    }
  }
}

static void afc_gemm_bp_panels(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t a_rs,
                               int64_t a_cs, const float *bp, float *c, int64_t ldc) {
  afc_gemm_bp_blocks(m, n, k, alpha, a, a_rs, a_cs, bp, c, ldc, 0, 1);
}

/* A kernel call's epoch (afc_begin_call bumps it as a kernel starts, before its parallel
 * loop): a thread's packed copy of an input operand (afc_gemm_bp_in) is only reused within the
 * call that packed it, as the arena may hand the same address to other data in the next. */
static _Atomic uint64_t afc_call_epoch; /* atomic: kernels may be called from several threads */
static void afc_begin_call(void) { atomic_fetch_add_explicit(&afc_call_epoch, 1, memory_order_relaxed); }

/* What a thread's kept packing was made from: the operand's address, shape and strides, and the
 * kernel call. */
typedef struct {
  const float *at;
  int64_t rows, cols, rs, cs;
  uint64_t epoch;
} afc_kept;

/* 1 (and `kept` now names it) where the operand is not the one kept in this call: pack it. */
static int afc_kept_stale(afc_kept *kept, const float *at, int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  const uint64_t epoch = atomic_load_explicit(&afc_call_epoch, memory_order_relaxed);
  const afc_kept now = {at, rows, cols, rs, cs, epoch};
  if (kept->at == at && kept->rows == rows && kept->cols == cols && kept->rs == rs && kept->cs == cs &&
      kept->epoch == epoch)
    return 0;
  *kept = now;
  return 1;
}

/* A thread's buffer of `floats` for a kept packing, allocated on first use. */
static float *afc_kept_buffer(float **buf, int64_t floats) {
  if (!*buf) {
    *buf = (float *)aligned_alloc(64, sizeof(float) * (size_t)floats);
    if (!*buf) abort();
  }
  return *buf;
}

/* Floats of the largest operand a thread keeps packed (afc_gemm_bp_in): 4 MiB, ViT-B/16's
 * 197 x 3072 activation (2.3 MiB) included. */
#define AFC_INPUT_CACHE_FLOATS (1 << 20)

/* afc_gemm_bp for an A that stays the same for the whole kernel call (a kernel input, never a
 * workspace the call rewrites): the thread packs A's (MC x KC) blocks on its first tile of the
 * call, each into its own place in a buffer of the thread's, and its later tiles of the call (the
 * column tiles of the same rows) reuse them instead of packing A again per tile. Measured in C
 * (Intel Xeon AVX-512, one thread, BERT's and ViT-B/16's shapes in 192- or 256-column tiles), the
 * per-tile packing of A was 5-10% of the tile's time. Operands larger than
 * AFC_INPUT_CACHE_FLOATS take afc_gemm_bp. */
static void afc_gemm_bp_in(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t a_rs,
                           int64_t a_cs, const float *bp, float *c, int64_t ldc) {
  static _Thread_local float *buf;
  static _Thread_local afc_kept kept;
  const int64_t mpad = (m + AFC_MR - 1) / AFC_MR * AFC_MR;
  if (m <= AFC_GEMV_ROWS || n <= 0 || k <= 0 || mpad * k > AFC_INPUT_CACHE_FLOATS) {
    afc_gemm_bp(m, n, k, alpha, a, a_rs, a_cs, bp, c, ldc);
    return;
  }
  afc_kept_buffer(&buf, AFC_INPUT_CACHE_FLOATS);
  const int pack = afc_kept_stale(&kept, a, m, k, a_rs, a_cs);
  afc_gemm_bp_blocks(m, n, k, alpha, a, a_rs, a_cs, bp, c, ldc, buf, pack);
}

/* Floats of the B operand afc_gemm_ap_in keeps packed (256 KiB): 256 depths of a 224-pixel tile.
 * Its chunks stream all of it from L2 past each chunk's rows, which a 384 KiB B (512 depths x
 * 192 pixels) did 7-9% slower than afc_gemm_ap's blocks (Intel Xeon AVX-512, 2 MiB L2). */
#define AFC_AP_INPUT_FLOATS (1 << 16)
/* The depth of its K blocks: a chunk's A panels (24 rows) and one B panel, 28 KiB at 128, stay
 * in a 32 KiB L1 together. */
#ifndef AFC_AP_INPUT_KC
#define AFC_AP_INPUT_KC 128
#endif

/* afc_gemm_ap for a B that stays the same for the whole kernel call (a 1x1 conv's input pixels,
 * read in place), called once per chunk of a few row panels of A: the thread packs all of B's
 * depths on the chunk that first meets it (afc_pack_b's layout, whole-depth panels) and the later
 * chunks of the same B reuse the packing, so the caller can finish each chunk's epilogue while
 * its rows are still in L1 instead of writing a whole tile of every output channel and reading it
 * back. Within a chunk the B panels stream from L2 past the chunk's A panels, which stay in L1.
 * A B of more than AFC_AP_INPUT_FLOATS (more than an L2 block) takes afc_gemm_ap. (An epilogue
 * the library applies itself, afc_gemm_ap_post, needs no chunks: on Zen 4 one call over the
 * whole tile ran ResNet-50's 64 -> 256 1x1 at 56x56 with bias, residual and Relu 10% faster than
 * chunks of 24 rows through this path did with the same post-ops.) */
static void afc_gemm_ap_in(int64_t m, int64_t n, int64_t k, float alpha, const float *ap, const float *b,
                           int64_t b_rs, int64_t b_cs, float *c, int64_t ldc) {
  static _Thread_local float *buf;
  static _Thread_local afc_kept kept;
  if (m <= 0 || n <= 0) return;
  const int64_t npad = (n + AFC_NR - 1) / AFC_NR * AFC_NR;
  if (k <= 0 || npad * k > AFC_AP_INPUT_FLOATS) {
    afc_gemm_ap_impl(m, n, k, alpha, ap, b, b_rs, b_cs, c, ldc, 0);
    return;
  }
  afc_kept_buffer(&buf, AFC_AP_INPUT_FLOATS);
  if (afc_kept_stale(&kept, b, n, k, b_rs, b_cs)) afc_pack_b_block(k, n, b, b_rs, b_cs, buf);
  const int64_t kb = afc_depth_block(k, AFC_AP_INPUT_KC);
  for (int64_t k0 = 0; k0 < k; k0 += kb) {
    const int64_t kc = k - k0 < kb ? k - k0 : kb;
    for (int64_t j0 = 0; j0 < n; j0 += AFC_NR) {
      const int nr = (int)(n - j0 < AFC_NR ? n - j0 : AFC_NR);
      for (int64_t i0 = 0; i0 < m; i0 += AFC_MR) {
        const int mr = (int)(m - i0 < AFC_MR ? m - i0 : AFC_MR);
        const float *a_panel = ap + i0 * k + k0 * AFC_MR;
        /* the first pass over the chunk's A panels (weights, from L3) fetches each one's
         * successor, the next chunk's first panel included (panels are contiguous) */
        afc_ukernel_ap(kc, a_panel, buf + j0 * k + k0 * AFC_NR, 0, c + i0 * ldc + j0, ldc, mr, nr, alpha, k0 > 0,
                       a_panel + AFC_MR * k, j0 == 0 ? AFC_MR : 0, 0, i0, j0);
      }
    }
  }
}

/* The whole-panel path above, or afc_gemv_bp for at most AFC_GEMV_ROWS rows (afc.h). */
static void afc_gemm_bp(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t a_rs,
                        int64_t a_cs, const float *bp, float *c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    for (int64_t i = 0; i < m; ++i) memset(c + i * ldc, 0, sizeof(float) * (size_t)n);
    return;
  }
  if (m <= AFC_GEMV_ROWS) {
    afc_gemv_bp(m, n, k, alpha, a, a_rs, a_cs, bp, c, ldc);
    return;
  }
  afc_gemm_bp_panels(m, n, k, alpha, a, a_rs, a_cs, bp, c, ldc);
}
#if defined(__AVX512F__)
/* afc_conv_ap's store of a panel that straddles a row end, from the register tile's buffer: the
 * 16 lanes of each half fall in at most two output rows (wp >= ow >= 16, lower/conv.py
 * DIRECT_MIN_WIDTH), so each half is two masked stores (loads and adds too when accumulating a
 * later K block), the dropped columns masked off. A per-row scalar copy measured 5-10% of the
 * conv's time at 28-pixel rows, where nearly every 32-column panel straddles one. */
static inline void afc_conv_store(const float *tile, int mr, int nr, int64_t j0, int64_t wp, int64_t ow, float *c,
                                  int64_t ldc, int acc) {
#pragma GCC unroll 2
  for (int h = 0; h < AFC_NR / 16; ++h) {
    const int lanes = nr - 16 * h;
    if (lanes <= 0) break;
    const uint32_t valid = lanes >= 16 ? 0xFFFFu : (1u << lanes) - 1u;
    const int64_t q = j0 + 16 * h, r = q / wp, x = q % wp;
    const int64_t na = x < ow ? (ow - x < 16 ? ow - x : 16) : 0, nb = wp - x;
    const __mmask16 ma = (__mmask16)(((1u << na) - 1u) & valid);
    const __mmask16 mb = (__mmask16)(nb < 16 ? ~((1u << nb) - 1u) & valid : 0u);
    float *da = c + r * ow + x, *db = c + (r + 1) * ow + x - wp;
    for (int i = 0; i < mr; ++i) {
      const __m512 v = _mm512_load_ps(tile + i * AFC_NR + 16 * h);
      float *ra = da + i * ldc, *rb = db + i * ldc;
      if (ma) _mm512_mask_storeu_ps(ra, ma, acc ? _mm512_add_ps(v, _mm512_maskz_loadu_ps(ma, ra)) : v);
      if (mb) _mm512_mask_storeu_ps(rb, mb, acc ? _mm512_add_ps(v, _mm512_maskz_loadu_ps(mb, rb)) : v);
    }
  }
}
#endif

/* A packed once (a conv's weight, Cout x Cin*kh*kw), B the implicit im2col of a conv, read
 * straight from a zero-padded band of its input rows: no im2col copy and no B packing (afc.h gives
 * the contract). Output row r's pixels are the band's flat positions r*wp .. r*wp+ow-1 (a tap
 * (c, ky, kx) of every pixel of all the rows is one run from there, in the band's phase plane of
 * (ky*dh % sh, kx*dw % sw) for a strided conv), so a 32-column panel runs across rows; its wp - ow columns past each row's end are
 * computed and dropped. A panel wholly inside one output row is stored by the micro-kernel; one
 * that straddles a row end goes through a register-tile buffer and is stored in its row pieces.
 * The B micro-panel (one band run per depth step) stays in L1 while the weight's A-panels of the
 * K block stream past it from L2, the Goto order of afc_gemm_ap. */
static void afc_conv_ap(int64_t m, int64_t rows, int64_t ow, int64_t k, const float *ap, const float *band,
                        int64_t plane, int64_t phase, int64_t wp, int64_t sh, int64_t sw, int64_t kh, int64_t kw,
                        int64_t dh, int64_t dw, float *c, int64_t ldc) {
  if (m <= 0 || rows <= 0 || ow <= 0) return;
  if (k <= 0) {
    for (int64_t i = 0; i < m; ++i) memset(c + i * ldc, 0, sizeof(float) * (size_t)(rows * ow));
    return;
  }
  const int64_t n = (rows - 1) * wp + ow, taps = kh * kw, kb = afc_kc(k);
  int32_t offs[AFC_KC];
  for (int64_t k0 = 0; k0 < k; k0 += kb) {
    const int64_t kc = k - k0 < kb ? k - k0 : kb;
    for (int64_t kk = 0; kk < kc; ++kk) {
      const int64_t q = k0 + kk;
      const int64_t y = q / kw % kh * dh, x = q % kw * dw;
      offs[kk] = (int32_t)(q / taps * plane + (y % sh * sw + x % sw) * phase + y / sh * wp + x / sw);
    }
    for (int64_t j0 = 0; j0 < n; j0 += AFC_NR) {
      const int nr = (int)(n - j0 < AFC_NR ? n - j0 : AFC_NR);
      const int64_t r = j0 / wp, x = j0 % wp;
      const int whole = x + nr <= ow;
      for (int64_t i0 = 0; i0 < m; i0 += AFC_MR) {
        const int mr = (int)(m - i0 < AFC_MR ? m - i0 : AFC_MR);
        const float *a_panel = ap + i0 * k + k0 * AFC_MR;
        float *ci = c + i0 * ldc;
        if (whole) {
          afc_ukernel_r(AFC_MR, kc, a_panel, 0, band + j0, offs, ci + r * ow + x, ldc, mr, nr, 1.0f, k0 > 0,
                        a_panel, 0);
          continue;
        }
        float tile[AFC_MR * AFC_NR] __attribute__((aligned(64)));
        afc_ukernel_r(AFC_MR, kc, a_panel, 0, band + j0, offs, tile, AFC_NR, mr, nr, 1.0f, 0, a_panel, 0);
#if defined(__AVX512F__)
        afc_conv_store(tile, mr, nr, j0, wp, ow, ci, ldc, k0 > 0);
#else
        for (int j = 0; j < nr;) {
          const int64_t rr = (j0 + j) / wp, xx = (j0 + j) % wp;
          if (xx >= ow) { /* the dropped columns between two rows */
            j += (int)(wp - xx);
            continue;
          }
          const int len = (int)(ow - xx < nr - j ? ow - xx : nr - j);
          for (int i = 0; i < mr; ++i) {
            float *d = ci + i * ldc + rr * ow + xx;
            const float *t = tile + i * AFC_NR + j;
            if (k0 > 0) {
              for (int l = 0; l < len; ++l) d[l] += t[l];
            } else {
              memcpy(d, t, sizeof(float) * (size_t)len);
            }
          }
          j += len;
        }
#endif
      }
    }
  }
}
/* B packed once (a conv's weight as W^T, K x Cout B-panels), A the implicit im2col^T of a conv
 * with its pixels as rows (afc.h gives the contract), per K block of the taps' band offsets:
 * - up to AFC_CONV_BP_INPLACE_N output channels (at most four 32-column B panels), the
 *   micro-kernel broadcasts each tile row's taps straight from the band (`arow`: one pointer per
 *   pixel, any stride, a panel straddling a row end included): no A copy at all, and the vector
 *   loads are the packed weight's, aligned. Against gathering packed A-panels first, measured in C
 *   (one thread, Intel Xeon AVX-512, best of 15): ResNet-50's 64-channel 3x3 at 56x56 159 -> 172-180
 *   GFLOP/s, its 128-channel 3x3 at 28x28 164 -> 171-178, the stride-2 one into 28x28 147 -> 162-165
 *   (the peak is 213, the micro-kernel alone on L1-resident panels 183);
 * - with more channels, each (MC x KC) block of A-panels is gathered from the band once (a panel's
 *   pixels at one depth: on AVX-512 one masked load per run of the band they lie in, at stride 1
 *   or 2; else one 8-float copy where they are consecutive, or a load each) and serves all the B
 *   panels (`afc_bp_block`): at 256 channels the in-place reads of a block's band rows for each of
 *   eight B panels measured 3-8% slower (14x14 and 7x7 pixels).
 * Either replaces an im2col tile of pixels x K floats (at ResNet-50's 14x14 3x3, 104 x 2304:
 * 0.9 MiB, more than a Zen 4 core's L2) and its packing. */
static void afc_conv_bp(int64_t m, int64_t n, int64_t k, int64_t p0, int64_t ow, int64_t sh, int64_t sw,
                        const float *band, int64_t plane, int64_t wp, int64_t kh, int64_t kw, int64_t dh,
                        int64_t dw, const float *bp, float *c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    for (int64_t i = 0; i < m; ++i) memset(c + i * ldc, 0, sizeof(float) * (size_t)n);
    return;
  }
  const int64_t kb = afc_kc(k), mb = afc_mc(m), taps = kh * kw, r0 = p0 / ow;
  const int inplace = n <= AFC_CONV_BP_INPLACE_N;
  float *buf = inplace ? 0 : afc_buffer();
  int32_t offs[AFC_KC];
  for (int64_t k0 = 0; k0 < k; k0 += kb) {
    const int64_t kc = k - k0 < kb ? k - k0 : kb;
    for (int64_t kk = 0; kk < kc; ++kk) {
      const int64_t q = k0 + kk;
      offs[kk] = (int32_t)(q / taps * plane + q / kw % kh * dh * wp + q % kw * dw);
    }
    for (int64_t i0 = 0; i0 < m; i0 += mb) {
      const int64_t mc = m - i0 < mb ? m - i0 : mb;
      if (inplace) {
        for (int64_t j0 = 0; j0 < n; j0 += AFC_NR) {
          const int nr = (int)(n - j0 < AFC_NR ? n - j0 : AFC_NR);
          const float *b_panel = bp + j0 * k + k0 * AFC_NR;
          for (int64_t panel = 0; panel * AFC_MR < mc; ++panel) {
            int64_t ii;
            int rows;
            afc_panel_span(mc, panel, 1, &ii, &rows);
            const float *arow[AFC_MR];
            for (int i = 0; i < AFC_MR; ++i) { /* rows past the tile repeat its first pixel */
              const int64_t p = p0 + i0 + ii + (i < rows ? i : 0);
              arow[i] = band + (p / ow - r0) * sh * wp + p % ow * sw;
            }
            afc_ukernel(kc, 0, arow, b_panel, offs, c + (i0 + ii) * ldc + j0, ldc, rows, nr, 1.0f, k0 > 0,
                        0, 0);
          }
        }
        continue;
      }
      for (int64_t panel = 0; panel * AFC_MR < mc; ++panel) {
        int64_t ii;
        int rows;
        afc_panel_span(mc, panel, 1, &ii, &rows);
        int64_t poff[AFC_MR];
        for (int i = 0; i < AFC_MR; ++i) {
          const int64_t p = p0 + i0 + ii + (i < rows ? i : 0);
          poff[i] = (p / ow - r0) * sh * wp + p % ow * sw;
        }
        float *dst = buf + panel * AFC_MR * kc;
#if defined(__AVX512VL__) && AFC_MR == 8
        /* A panel's pixels lie in one run of the band (every sw-th float) or in two where an
         * output row ends in it (ow >= 7): per depth one masked load per run, merged in a register
         * (at stride 2 a 16-float load of which the even lanes are kept), where eight loads and
         * stores each had cost ResNet-50's 3x3s at 14x14 and 7x7 a few percent. Lanes past `rows`
         * are zeros. */
        int s1 = 1, s2;
        while (s1 < rows && poff[s1] - poff[0] == sw * s1) ++s1;
        for (s2 = s1; s2 < rows && poff[s2] - poff[s1] == sw * (s2 - s1);) ++s2;
        if (sw <= 2 && s2 == rows) {
          const unsigned run0 = (1u << s1) - 1u, run1 = ((1u << rows) - 1u) & ~run0;
          /* a1: where lane 0 of the second run would be read (lane i at a1 + sw * i) */
          const float *a0 = band + poff[0], *a1 = s1 < rows ? band + poff[s1] - sw * s1 : a0;
          if (sw == 1) {
            for (int64_t kk = 0; kk < kc; ++kk) {
              const __m256 v = _mm256_maskz_loadu_ps((__mmask8)run0, a0 + offs[kk]);
              _mm256_storeu_ps(dst + kk * AFC_MR, _mm256_mask_loadu_ps(v, (__mmask8)run1, a1 + offs[kk]));
            }
          } else {
            unsigned even0 = 0, even1 = 0; /* pixel i's float is lane 2i of the 16 loaded */
            for (int i = 0; i < AFC_MR; ++i) {
              even0 |= (run0 >> i & 1u) << 2 * i;
              even1 |= (run1 >> i & 1u) << 2 * i;
            }
            const __m512i evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 0, 0, 0, 0, 0, 0, 0);
            for (int64_t kk = 0; kk < kc; ++kk) {
              __m512 v = _mm512_maskz_loadu_ps((__mmask16)even0, a0 + offs[kk]);
              v = _mm512_mask_loadu_ps(v, (__mmask16)even1, a1 + offs[kk]);
              _mm256_storeu_ps(dst + kk * AFC_MR, _mm512_castps512_ps256(_mm512_permutexvar_ps(evens, v)));
            }
          }
          continue;
        }
#endif
        if (rows == AFC_MR && poff[AFC_MR - 1] - poff[0] == AFC_MR - 1) {
          const float *src = band + poff[0];
          for (int64_t kk = 0; kk < kc; ++kk) memcpy(dst + kk * AFC_MR, src + offs[kk], sizeof(float) * AFC_MR);
        } else {
          for (int64_t kk = 0; kk < kc; ++kk) {
            const float *src = band + offs[kk];
            for (int i = 0; i < AFC_MR; ++i) dst[kk * AFC_MR + i] = i < rows ? src[poff[i]] : 0.0f;
          }
        }
      }
      afc_bp_block(mc, n, k, k0, kc, i0 == 0, buf, bp, c + i0 * ldc, ldc, 1.0f);
    }
  }
}

/* Output rows (channels) afc_store_t writes per sweep over a tile's pixels: the 32-byte halves of
 * each output line, stored at consecutive 8-pixel steps, then lie 64 x 32 bytes apart (in L1), and
 * so do the tile's lines read for them; a sweep over all of a wide tile's channels (512 of
 * ResNet-50's 14x14 expansions) left each half-written line to L2 before its other half came. */
#define AFC_STORE_T_CHANNELS 64

/* out[j * ldo + i] = tile[i * ldt + j] for i < m, j < n: a conv's tile with its pixels as rows
 * stored into NCHW, then `post` (or nothing) on each stored value, with out's rows (j) as the
 * post-ops' rows: + bias[j], + res[j * res_ld + i], Relu or Clip. By 8 x 8 register transposes
 * (afv.h) where the ISA has them, the post-ops on the transposed registers (afc_post_v8): the
 * strided one-float loads of a plain loop (a gather per vector, or a float per cycle) cost a
 * tenth of the product's time on a 784-pixel tile of 64 channels, and the generated epilogue
 * after the store was a second pass over the tile in memory. */
static inline __attribute__((always_inline)) void afc_store_t_impl(int64_t m, int64_t n, const float *tile,
                                                                   int64_t ldt, float *out, int64_t ldo,
                                                                   const afc_post *post) {
  int64_t im = 0; /* pixels in whole blocks of 8 */
#if defined(__AVX2__)
  im = m / 8 * 8;
  const int64_t jn = n / 8 * 8;
  for (int64_t jb = 0; jb < jn; jb += AFC_STORE_T_CHANNELS)
    for (int64_t i0 = 0; i0 < im; i0 += 8)
      for (int64_t j0 = jb; j0 < jn && j0 < jb + AFC_STORE_T_CHANNELS; j0 += 8) {
        __m256 r[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(tile + (i0 + i) * ldt + j0);
        afv_transpose8x8(r);
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) {
          const float *res = post && post->res ? post->res + (j0 + j) * post->res_ld + i0 : 0;
          if (post) r[j] = afc_post_v8(post, j0 + j, res, r[j]);
          _mm256_storeu_ps(out + (j0 + j) * ldo + i0, r[j]);
        }
      }
  if (im) {
    for (int64_t j = jn; j < n; ++j)
      for (int64_t i = 0; i < im; ++i) out[j * ldo + i] = tile[i * ldt + j];
    if (post && jn < n) afc_post_tile(post, jn, 0, (int)(n - jn), (int)im, out + jn * ldo, ldo);
  }
#endif
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = im; i < m; ++i) out[j * ldo + i] = tile[i * ldt + j];
  if (post && im < m) afc_post_tile(post, 0, im, (int)n, (int)(m - im), out + im, ldo);
}

static void afc_store_t(int64_t m, int64_t n, const float *tile, int64_t ldt, float *out, int64_t ldo) {
  afc_store_t_impl(m, n, tile, ldt, out, ldo, 0);
}

static void afc_store_t_post(int64_t m, int64_t n, const float *tile, int64_t ldt, float *out, int64_t ldo,
                             const float *bias, const float *res, int64_t res_ld, int act, float lo, float hi) {
  const afc_post post = {bias, res, res_ld, act, lo, hi};
  afc_store_t_impl(m, n, tile, ldt, out, ldo, &post);
}
/* Depthwise 3x3 of stride 1, undilated, output rows as wide as the input's (pl plus the right
 * pad = 2): MobileNetV2's stride-1 depthwise convs. Vectors along a 7-, 14- or 28-wide row
 * reload every tap unaligned (nine loads an output vector, most split across cache lines) or pad
 * the row to a vector; here each padded input row is read once per column vector, its three
 * column shifts kept in registers with the two rows before it, so an output vector costs one
 * row's shifts and nine multiply-adds.
 *   AVX-512: a column vector at a time down the plane, each padded row's part in two registers
 *   (masked loads, the pads zero), its shifts lane rotations (valignd). Keeping a 7- or 14-wide
 *   row whole in one register instead measured 2-10% faster (Zen 4): not worth a second path.
 *   AVX2: the plane is first copied into a zero-padded plane per thread and the shifts are
 *   unaligned loads from it (rotations across 128-bit halves cost more there); rows of at most
 *   a vector read that plane flat, each tap one load, as the generated loop does. */
#define AFC_DW3_PAD_FLOATS 16384
/* afc_dw3x3 / afc_dw3x3_s2 a tap at a time (portable builds, planes too large for AVX2's copy). */
static void afc_dw3_scalar(int64_t p0, int64_t p1, int64_t cout, const float *x, int64_t xs, const float *w,
                           float *y, int64_t ys, int64_t h, int64_t wd, int64_t oh, int64_t ow, int64_t stride,
                           int64_t pt, int64_t pl) {
  for (int64_t p = p0; p < p1; ++p) {
    const float *xp = x + p * xs, *wp = w + p % cout * 9;
    for (int64_t oy = 0; oy < oh; ++oy)
      for (int64_t ox = 0; ox < ow; ++ox) {
        float acc = 0.0f;
        for (int64_t t = 0; t < 9; ++t) {
          const int64_t iy = stride * oy + t / 3 - pt, ix = stride * ox + t % 3 - pl;
          if (iy >= 0 && iy < h && ix >= 0 && ix < wd) acc += wp[t] * xp[iy * wd + ix];
        }
        y[p * ys + oy * ow + ox] = acc;
      }
  }
}
#if defined(__AVX512F__)
/* Lanes l of a 16-lane vector with lo <= l < hi. */
static inline __mmask16 afc_lanes(int64_t lo, int64_t hi) {
  lo = lo < 0 ? 0 : lo > 16 ? 16 : lo;
  hi = hi < lo ? lo : hi > 16 ? 16 : hi;
  return (__mmask16)(((1u << hi) - 1u) & ~((1u << lo) - 1u));
}
/* The three column shifts of one vector of padded row iy (`col` at the vector's first column):
 * that vector and the next one's first lanes, masked to the plane (zeros outside it). */
static inline __attribute__((always_inline)) void afc_dw3_row(const float *col, int64_t iy, int64_t h, int64_t wd,
                                                               int64_t pl, const __mmask16 *lm, __m512 s[3]) {
  __m512 r0 = _mm512_setzero_ps(), r1 = r0;
  if (iy >= 0 && iy < h) {
    r0 = _mm512_maskz_loadu_ps(lm[0], col + iy * wd - pl);
    r1 = _mm512_maskz_loadu_ps(lm[1], col + iy * wd - pl + 16);
  }
  const __m512i lo = _mm512_castps_si512(r0), hi = _mm512_castps_si512(r1);
  s[0] = r0;
  s[1] = _mm512_castsi512_ps(_mm512_alignr_epi32(hi, lo, 1));
  s[2] = _mm512_castsi512_ps(_mm512_alignr_epi32(hi, lo, 2));
}
/* The nine taps of an output vector from the column shifts of its three input rows. */
static inline __attribute__((always_inline)) __m512 afc_dw3_taps16(const __m512 *wv, const __m512 *a,
                                                                    const __m512 *b, const __m512 *c) {
  __m512 acc = _mm512_mul_ps(wv[0], a[0]);
  for (int kx = 1; kx < 3; ++kx) acc = _mm512_fmadd_ps(wv[kx], a[kx], acc);
  for (int kx = 0; kx < 3; ++kx) acc = _mm512_fmadd_ps(wv[3 + kx], b[kx], acc);
  for (int kx = 0; kx < 3; ++kx) acc = _mm512_fmadd_ps(wv[6 + kx], c[kx], acc);
  return acc;
}
/* One plane, a column vector at a time down it: an output row costs one input row's shifts. */
static void afc_dw3_plane(const float *xp, const float *wp, float *yp, int64_t h, int64_t wd, int64_t oh,
                          int64_t pt, int64_t pl) {
  __m512 wv[9];
  for (int t = 0; t < 9; ++t) wv[t] = _mm512_set1_ps(wp[t]);
  for (int64_t q = 0; 16 * q < wd; ++q) {
    const int64_t c0 = 16 * q - pl; /* input column of the vector's first padded column */
    const __mmask16 lm[2] = {afc_lanes(-c0, wd - c0), afc_lanes(-c0 - 16, wd - c0 - 16)};
    const __mmask16 sm = afc_lanes(0, wd - 16 * q);
    const float *col = xp + 16 * q;
    __m512 a[3], b[3], c[3];
    afc_dw3_row(col, -pt, h, wd, pl, lm, a);
    afc_dw3_row(col, 1 - pt, h, wd, pl, lm, b);
    for (int64_t oy = 0; oy < oh; ++oy) {
      afc_dw3_row(col, oy + 2 - pt, h, wd, pl, lm, c);
      _mm512_mask_storeu_ps(yp + oy * wd + 16 * q, sm, afc_dw3_taps16(wv, a, b, c));
      for (int kx = 0; kx < 3; ++kx) a[kx] = b[kx], b[kx] = c[kx];
    }
  }
}
#elif defined(__AVX2__) && defined(__FMA__)
/* A thread's zero-padded plane for afc_dw3x3 / afc_dw3x3_s2 on AVX2. Copies rewrite the same
 * interior cells for every plane of a geometry, so its border is zeroed only when the geometry
 * (`key`) changes: zeroing it per call cost as much as the convolution at 112 -> 56. */
typedef struct {
  int64_t key[8];
  float pad[AFC_DW3_PAD_FLOATS] __attribute__((aligned(32)));
} afc_dw3_pad;
static float *afc_dw3_padded(afc_dw3_pad *p, const int64_t key[8], int64_t floats) {
  if (memcmp(p->key, key, sizeof p->key) != 0) {
    memset(p->pad, 0, (size_t)floats * sizeof(float));
    memcpy(p->key, key, sizeof p->key);
  }
  return p->pad;
}
/* The nine taps of an output vector from the column shifts of its three input rows. */
static inline __attribute__((always_inline)) __m256 afc_dw3_taps8(const __m256 *wv, const __m256 *a, const __m256 *b,
                                                                   const __m256 *c) {
  __m256 acc = _mm256_mul_ps(wv[0], a[0]);
  for (int kx = 1; kx < 3; ++kx) acc = _mm256_fmadd_ps(wv[kx], a[kx], acc);
  for (int kx = 0; kx < 3; ++kx) acc = _mm256_fmadd_ps(wv[3 + kx], b[kx], acc);
  for (int kx = 0; kx < 3; ++kx) acc = _mm256_fmadd_ps(wv[6 + kx], c[kx], acc);
  return acc;
}
/* An output vector of `valid` lanes at `out`: stored whole unless that passes the plane's `end`
 * (column vectors run right to left, so the excess lands on cells rewritten later; AMD runs
 * vmaskmovps stores microcoded). */
static inline __attribute__((always_inline)) void afc_dw3_store8(float *out, __m256 acc, int64_t valid,
                                                                  const float *end) {
  if (valid == 8 || out + 8 <= end) {
    _mm256_storeu_ps(out, acc);
    return;
  }
  float tail[8];
  _mm256_storeu_ps(tail, acc);
  for (int64_t i = 0; i < valid; ++i) out[i] = tail[i];
}
static inline __attribute__((always_inline)) void afc_dw3_shifts(const float *row, __m256 s[3]) {
  for (int kx = 0; kx < 3; ++kx) s[kx] = _mm256_loadu_ps(row + kx);
}
#endif

/* afc_dw3x3 over planes `xs` floats apart in x and `ys` apart in y (afc_pw_dw3x3: a band of
 * rows of each plane). */
static void afc_dw3x3_planes(int64_t p0, int64_t p1, int64_t cout, const float *x, int64_t xs, const float *w,
                             float *y, int64_t ys, int64_t h, int64_t wd, int64_t oh, int64_t pt, int64_t pl) {
#if defined(__AVX512F__)
  for (int64_t p = p0; p < p1; ++p) afc_dw3_plane(x + p * xs, w + p % cout * 9, y + p * ys, h, wd, oh, pt, pl);
  return;
#elif defined(__AVX2__) && defined(__FMA__)
  /* padded row j holds input row j - pt at columns pl .. pl + wd - 1, zeros around it (the
   * border zeroed when the geometry changes, afc_dw3_padded), the interior rewritten per plane */
  static __thread afc_dw3_pad kept;
  const int64_t rows = oh + 2;
  if (wd <= 8 && rows * (wd + 2) + 16 <= AFC_DW3_PAD_FLOATS && (oh - 1) * (wd + 2) + wd <= 1024) {
    /* rows of at most a vector: the padded plane read flat (output (oy, ox) at oy * fw + ox, the
     * two padded columns between rows computed and dropped), every tap one unaligned load */
    const int64_t fw = wd + 2, span = (oh - 1) * fw + wd, nvec = (span + 7) / 8;
    const int64_t key[8] = {1, h, wd, oh, pt, pl, 0, 1};
    float *const pad = afc_dw3_padded(&kept, key, rows * fw + 16);
    const int64_t j0 = pt > 0 ? pt : 0, j1 = h + pt < rows ? h + pt : rows;
    float flat[1024 + 8];
    for (int64_t p = p0; p < p1; ++p) {
      const float *xp = x + p * xs, *wp = w + p % cout * 9;
      for (int64_t j = j0; j < j1; ++j)
        for (int64_t i = 0; i < wd; ++i) pad[j * fw + pl + i] = xp[(j - pt) * wd + i];
      __m256 wv[9];
      for (int t = 0; t < 9; ++t) wv[t] = _mm256_set1_ps(wp[t]);
      for (int64_t v = 0; v < nvec; ++v) {
        const float *base = pad + 8 * v;
        __m256 acc = _mm256_mul_ps(wv[0], _mm256_loadu_ps(base));
        for (int t = 1; t < 9; ++t) acc = _mm256_fmadd_ps(wv[t], _mm256_loadu_ps(base + t / 3 * fw + t % 3), acc);
        _mm256_storeu_ps(flat + 8 * v, acc);
      }
      float *yp = y + p * ys;
      for (int64_t oy = 0; oy < oh; ++oy)
        for (int64_t ox = 0; ox < wd; ++ox) yp[oy * wd + ox] = flat[oy * fw + ox];
    }
    return;
  }
  const int64_t nv = (wd + 7) / 8, pw = 8 * nv + 8;
  if (rows * pw <= AFC_DW3_PAD_FLOATS) {
    const int64_t key[8] = {1, h, wd, oh, pt, pl, 0, 2};
    float *const pad = afc_dw3_padded(&kept, key, rows * pw);
    const int64_t j0 = pt > 0 ? pt : 0, j1 = h + pt < rows ? h + pt : rows;
    for (int64_t p = p0; p < p1; ++p) {
      const float *xp = x + p * xs, *wp = w + p % cout * 9;
      float *yp = y + p * ys;
      for (int64_t j = j0; j < j1; ++j) {
        float *dst = pad + j * pw + pl;
        const float *src = xp + (j - pt) * wd;
        for (int64_t i = 0; i < wd; ++i) dst[i] = src[i];
      }
      __m256 wv[9];
      for (int t = 0; t < 9; ++t) wv[t] = _mm256_set1_ps(wp[t]);
      /* column vectors right to left: a row's partial last vector is stored whole, its excess
       * landing on the next row's first columns, which the vectors to its left rewrite later
       * (AMD runs vmaskmovps stores microcoded); a vector that would pass the plane's end stores
       * lane by lane */
      for (int64_t q = nv - 1; q >= 0; --q) {
        const int64_t valid = wd - 8 * q < 8 ? wd - 8 * q : 8;
        __m256 a[3], b[3], c[3];
        afc_dw3_shifts(pad + 8 * q, a);
        afc_dw3_shifts(pad + pw + 8 * q, b);
        for (int64_t oy = 0; oy < oh; ++oy) {
          afc_dw3_shifts(pad + (oy + 2) * pw + 8 * q, c);
          const __m256 acc = afc_dw3_taps8(wv, a, b, c);
          afc_dw3_store8(yp + oy * wd + 8 * q, acc, valid, yp + oh * wd);
          for (int kx = 0; kx < 3; ++kx) a[kx] = b[kx], b[kx] = c[kx];
        }
      }
    }
    return;
  }
#endif
  afc_dw3_scalar(p0, p1, cout, x, xs, w, y, ys, h, wd, oh, wd, 1, pt, pl);
}
static void afc_dw3x3(int64_t p0, int64_t p1, int64_t cout, const float *x, const float *w, float *y, int64_t h,
                      int64_t wd, int64_t oh, int64_t pt, int64_t pl) {
  afc_dw3x3_planes(p0, p1, cout, x, h * wd, w, y, oh * wd, h, wd, oh, pt, pl);
}
/* afc_dw3x3 at stride 2: output (oy, ox) reads padded rows 2 oy + ky and padded columns 2 ox + kx.
 * The column shifts of a padded row are its even columns (kx = 0), its odd ones (kx = 1) and its
 * even ones one further (kx = 2), so one row serves three taps here too, and the row of ky = 2 is
 * the next output row's ky = 0.
 *   AVX-512: 32 padded columns from two registers split in even and odd lanes (vpermt2ps), the
 *   third shift one lane rotation further with the next register's first lane.
 *   AVX2: the plane is copied into two zero-padded column phases per thread (even and odd
 *   padded columns), the shifts unaligned loads from them. */
#if defined(__AVX512F__)
static inline __attribute__((always_inline)) void afc_dw3s2_row(const float *col, int64_t iy, int64_t h,
                                                                 int64_t wd, int64_t pl, const __mmask16 *lm,
                                                                 __m512 s[3]) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const __m512i next = _mm512_setr_epi32(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16);
  __m512 r0 = _mm512_setzero_ps(), r1 = r0, r2 = r0;
  if (iy >= 0 && iy < h) {
    const float *row = col + iy * wd - pl;
    r0 = _mm512_maskz_loadu_ps(lm[0], row);
    r1 = _mm512_maskz_loadu_ps(lm[1], row + 16);
    r2 = _mm512_maskz_loadu_ps(lm[2], row + 32);
  }
  s[0] = _mm512_permutex2var_ps(r0, even, r1);
  s[1] = _mm512_permutex2var_ps(r0, odd, r1);
  s[2] = _mm512_permutex2var_ps(s[0], next, r2);
}
static void afc_dw3s2_plane(const float *xp, const float *wp, float *yp, int64_t h, int64_t wd, int64_t oh,
                            int64_t ow, int64_t pt, int64_t pl) {
  __m512 wv[9];
  for (int t = 0; t < 9; ++t) wv[t] = _mm512_set1_ps(wp[t]);
  for (int64_t q = 0; 16 * q < ow; ++q) {
    const int64_t c0 = 32 * q - pl; /* input column of the vector's first padded column */
    const __mmask16 lm[3] = {afc_lanes(-c0, wd - c0), afc_lanes(-c0 - 16, wd - c0 - 16),
                             afc_lanes(-c0 - 32, wd - c0 - 32) & (__mmask16)1};
    const __mmask16 sm = afc_lanes(0, ow - 16 * q);
    const float *col = xp + 32 * q;
    __m512 a[3], b[3], c[3];
    afc_dw3s2_row(col, -pt, h, wd, pl, lm, a);
    for (int64_t oy = 0; oy < oh; ++oy) {
      afc_dw3s2_row(col, 2 * oy + 1 - pt, h, wd, pl, lm, b);
      afc_dw3s2_row(col, 2 * oy + 2 - pt, h, wd, pl, lm, c);
      _mm512_mask_storeu_ps(yp + oy * ow + 16 * q, sm, afc_dw3_taps16(wv, a, b, c));
      for (int kx = 0; kx < 3; ++kx) a[kx] = c[kx];
    }
  }
}
#endif

static void afc_dw3x3_s2_planes(int64_t p0, int64_t p1, int64_t cout, const float *x, int64_t xs, const float *w,
                                float *y, int64_t ys, int64_t h, int64_t wd, int64_t oh, int64_t ow, int64_t pt,
                                int64_t pl) {
#if defined(__AVX512F__)
  for (int64_t p = p0; p < p1; ++p) afc_dw3s2_plane(x + p * xs, w + p % cout * 9, y + p * ys, h, wd, oh, ow, pt, pl);
  return;
#elif defined(__AVX2__) && defined(__FMA__)
  /* phase f, padded row j, column t holds padded column 2 t + f of padded row j (input row
   * j - pt, column 2 t + f - pl); the border zeroed when the geometry changes (afc_dw3_padded) */
  static __thread afc_dw3_pad kept;
  const int64_t nv = (ow + 7) / 8, pw = 8 * nv + 8, rows = 2 * oh + 1, phase = rows * pw;
  if (2 * phase <= AFC_DW3_PAD_FLOATS) {
    const int64_t key[8] = {2, h, wd, oh, ow, pt, pl, 3};
    float *const pad = afc_dw3_padded(&kept, key, 2 * phase);
    const int64_t j0 = pt > 0 ? pt : 0, j1 = h + pt < rows ? h + pt : rows;
    const int64_t i1 = wd < 2 * ow + 1 - pl ? wd : 2 * ow + 1 - pl; /* input columns read */
    for (int64_t p = p0; p < p1; ++p) {
      const float *xp = x + p * xs, *wp = w + p % cout * 9;
      float *yp = y + p * ys;
      /* input column i goes to padded column i + pl: 16 at a time split in their even and odd
       * elements (a float at a time cost 2 cycles, 0.7 ms of MobileNetV2's 112 -> 56) */
      float *const even = pad + (pl & 1) * phase + pl / 2, *const odd = pad + ((pl + 1) & 1) * phase + (pl + 1) / 2;
      for (int64_t j = j0; j < j1; ++j) {
        const float *src = xp + (j - pt) * wd;
        int64_t i = 0;
        for (; i + 16 <= i1; i += 16) {
          const __m256 v0 = _mm256_loadu_ps(src + i), v1 = _mm256_loadu_ps(src + i + 8);
          const __m256 e = _mm256_shuffle_ps(v0, v1, _MM_SHUFFLE(2, 0, 2, 0));
          const __m256 o = _mm256_shuffle_ps(v0, v1, _MM_SHUFFLE(3, 1, 3, 1));
          _mm256_storeu_ps(even + j * pw + i / 2, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), 0xD8)));
          _mm256_storeu_ps(odd + j * pw + i / 2, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), 0xD8)));
        }
        for (; i < i1; ++i) {
          const int64_t c = i + pl;
          pad[(c & 1) * phase + j * pw + (c >> 1)] = src[i];
        }
      }
      __m256 wv[9];
      for (int t = 0; t < 9; ++t) wv[t] = _mm256_set1_ps(wp[t]);
      for (int64_t q = nv - 1; q >= 0; --q) { /* right to left: see afc_dw3x3 */
        const int64_t valid = ow - 8 * q < 8 ? ow - 8 * q : 8;
        __m256 a[3], b[3], c[3];
#define AFC_DW3S2_ROW(j, s)                                      \
  do {                                                           \
    const float *e = pad + (j) * pw + 8 * q, *o = e + phase;     \
    (s)[0] = _mm256_loadu_ps(e);                                 \
    (s)[1] = _mm256_loadu_ps(o);                                 \
    (s)[2] = _mm256_loadu_ps(e + 1);                             \
  } while (0)
        AFC_DW3S2_ROW(0, a);
        for (int64_t oy = 0; oy < oh; ++oy) {
          AFC_DW3S2_ROW(2 * oy + 1, b);
          AFC_DW3S2_ROW(2 * oy + 2, c);
          const __m256 acc = afc_dw3_taps8(wv, a, b, c);
          afc_dw3_store8(yp + oy * ow + 8 * q, acc, valid, yp + oh * ow);
          for (int kx = 0; kx < 3; ++kx) a[kx] = c[kx];
        }
#undef AFC_DW3S2_ROW
      }
    }
    return;
  }
#endif
  afc_dw3_scalar(p0, p1, cout, x, xs, w, y, ys, h, wd, oh, ow, 2, pt, pl);
}
static void afc_dw3x3_s2(int64_t p0, int64_t p1, int64_t cout, const float *x, const float *w, float *y,
                         int64_t h, int64_t wd, int64_t oh, int64_t ow, int64_t pt, int64_t pl) {
  afc_dw3x3_s2_planes(p0, p1, cout, x, h * wd, w, y, oh * ow, h, wd, oh, ow, pt, pl);
}

/* The input rows [r[0], r[1]) of a plane of h rows that output rows [oy0, oy1) of a 3x3 window
 * at `stride`, `pt` rows of top padding, read (the conv chains' bands). */
static inline void afc_band_rows(int64_t stride, int64_t pt, int64_t h, int64_t oy0, int64_t oy1, int64_t r[2]) {
  r[0] = stride * oy0 - pt > 0 ? stride * oy0 - pt : 0;
  r[1] = stride * (oy1 - 1) - pt + 3 < h ? stride * (oy1 - 1) - pt + 3 : h;
}

/* One band of output rows [oy0, oy1) of a depthwise 3x3 (stride 1 or 2) whose input is a 1x1
 * conv's output, the expansion computed here for the input rows the band reads (afc.h). The
 * expansion goes into the thread's `buf`, one plane of (stride * (band - 1) + 3) rows per channel,
 * and the depthwise conv reads it from there: the expanded tensor (MobileNetV2's 96 x 112 x 112
 * is 4.8 MB) never leaves the cache. A band after the first of a run keeps the rows the previous
 * band expanded and this one reads again (3 - stride of them), moved to the planes' tops, and
 * expands only the rest. */
static void afc_pw_dw3x3(int64_t cexp, int64_t cin, const float *ap, const float *x, int64_t h, int64_t w,
                         const float *bias, int act, float lo, float hi, const float *w2, float *y, int64_t oh,
                         int64_t ow, int64_t stride, int64_t pt, int64_t pl, int64_t oy0, int64_t oy1,
                         int64_t band, int first, float *buf) {
  const int64_t ps = (stride * (band - 1) + 3) * w; /* buf's plane stride */
  int64_t r[2], q[2];
  afc_band_rows(stride, pt, h, oy0, oy1, r);
  const int64_t r0 = r[0], r1 = r[1];
  int64_t keep = 0;
  if (!first) { /* the previous band, [oy0 - band, oy0), expanded rows [q[0], q[1]) */
    afc_band_rows(stride, pt, h, oy0 - band, oy0, q);
    keep = q[1] > r0 ? q[1] - r0 : 0;
    if (keep && r0 > q[0])
      for (int64_t c = 0; c < cexp; ++c)
        memmove(buf + c * ps, buf + c * ps + (r0 - q[0]) * w, sizeof(float) * (size_t)(keep * w));
  }
  if (r1 > r0 + keep)
    afc_gemm_ap_post(cexp, (r1 - r0 - keep) * w, cin, ap, x + (r0 + keep) * w, h * w, buf + keep * w, ps, bias, 0,
                     0, act, lo, hi);
  const int64_t bt = pt + r0 - stride * oy0; /* the band's top padding */
  if (stride == 1)
    afc_dw3x3_planes(0, cexp, cexp, buf, ps, w2, y + oy0 * ow, oh * ow, r1 - r0, w, oy1 - oy0, bt, pl);
  else
    afc_dw3x3_s2_planes(0, cexp, cexp, buf, ps, w2, y + oy0 * ow, oh * ow, r1 - r0, w, oy1 - oy0, ow, bt, pl);
}

/* One band of output rows [oy0, oy1) of a 1x1 conv whose input is a depthwise 3x3 conv's output
 * (afc.h): the depthwise rows of the band into the thread's `buf` (c planes of oy1 - oy0 rows),
 * their post-ops on each plane while it is in L1, then the 1x1 conv of the band's pixels from
 * there. The depthwise output (MobileNetV2's first block: 32 x 112 x 112 floats) never leaves the
 * cache, and a band reads its input rows in place: no rows are computed twice. */
static void afc_dw3x3_pw(int64_t c, const float *x, int64_t h, int64_t w, const float *w1, const float *bias,
                         int act, float lo, float hi, int64_t stride, int64_t pt, int64_t pl, int64_t cout,
                         const float *ap, float *y, int64_t oh, int64_t ow, int64_t oy0, int64_t oy1, float *buf) {
  const int64_t rows = oy1 - oy0, n = rows * ow;
  int64_t r[2];
  afc_band_rows(stride, pt, h, oy0, oy1, r);
  const int64_t r0 = r[0], r1 = r[1];
  const int64_t bt = pt + r0 - stride * oy0; /* the band's top padding */
  const afc_post post = {bias, 0, 0, act, lo, hi};
  for (int64_t p = 0; p < c; ++p) {
    if (stride == 1)
      afc_dw3x3_planes(p, p + 1, c, x + r0 * w, h * w, w1, buf, n, r1 - r0, w, rows, bt, pl);
    else
      afc_dw3x3_s2_planes(p, p + 1, c, x + r0 * w, h * w, w1, buf, n, r1 - r0, w, rows, ow, bt, pl);
    if (bias || act != AFC_POST_NONE) afc_post_tile(&post, p, 0, 1, (int)n, buf + p * n, n);
  }
  afc_gemm_ap(cout, n, c, 1.0f, ap, buf, n, 1, y + oy0 * ow, oh * ow);
}

/* ---- Winograd F(2x2, 3x3): afc_wino3x3_pack, afc_wino3x3 (afc.h) ----
 * A 3x3 conv of stride 1 and padding 1 as 16 products of a quarter of the pixels: every 2x2
 * output tile is Y = A^T [U . V] A over its 4x4 input tile d, with V = B^T d B (per input
 * channel), U = G g G^T (per filter, packed once) and the products U . V, one per position of
 * the 4x4 transform, summing over the input channels: 36 multiply-adds of the direct conv per
 * output tile and channel pair against 16. The transforms' coefficients are 0, +-1 and 1/2, exact
 * in binary: the result differs from the direct sum by rounding only (the order of the sums).
 * Per block of `tr` tile rows: the input rows copied channels-last (each tile's 16 channels one
 * vector), the input transform into v[16][tiles][c], the 16 products with the tiles as rows
 * read in place (afc_conv_bp's micro-kernel mode) against U's B-panels into m[16][tiles][k],
 * the output transform into a pixels-as-rows tile and its store into NCHW with the post-ops
 * (afc_store_t_post). */
#define AFC_WINO_LANES 16

static void afc_wino3x3_pack(int64_t c, int64_t k, const float *w, float *up, int64_t ldu) {
  /* written in place in afc_pack_b's layout: U[xi] element (ci, o) in the panel of column o */
  const int64_t kp = (k + AFC_NR - 1) / AFC_NR * AFC_NR;
  for (int x = 0; x < 16; ++x) memset(up + x * ldu, 0, sizeof(float) * (size_t)(kp * c));
  for (int64_t o = 0; o < k; ++o)
    for (int64_t ci = 0; ci < c; ++ci) {
      const float *g = w + (o * c + ci) * 9;
      float t[4][3];
      for (int j = 0; j < 3; ++j) {
        t[0][j] = g[j];
        t[1][j] = 0.5f * (g[j] + g[3 + j] + g[6 + j]);
        t[2][j] = 0.5f * (g[j] - g[3 + j] + g[6 + j]);
        t[3][j] = g[6 + j];
      }
      float *at = up + o / AFC_NR * AFC_NR * c + ci * AFC_NR + o % AFC_NR;
      for (int i = 0; i < 4; ++i) {
        at[(i * 4) * ldu] = t[i][0];
        at[(i * 4 + 1) * ldu] = 0.5f * (t[i][0] + t[i][1] + t[i][2]);
        at[(i * 4 + 2) * ldu] = 0.5f * (t[i][0] - t[i][1] + t[i][2]);
        at[(i * 4 + 3) * ldu] = t[i][2];
      }
    }
}

/* One input row of c channels (plane stride hw) copied channels-last: dst[x * c + ch]. By 8 x 8
 * register transposes where AVX2 has them (a float's strided store cost about a cycle: 14% of a
 * 64-channel conv's time at 56x56 on Zen 4, one thread). */
static void afc_wino_row_hwc(const float *src, int64_t c, int64_t hw, int64_t w, float *dst) {
  for (int64_t ci = 0; ci < c; ci += 8) {
    int64_t x = 0;
#if defined(__AVX2__)
    for (; x + 8 <= w; x += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + (ci + i) * hw + x);
      afv_transpose8x8(r);
      for (int j = 0; j < 8; ++j) _mm256_storeu_ps(dst + (x + j) * c + ci, r[j]);
    }
#endif
    for (; x < w; ++x)
      for (int i = 0; i < 8; ++i) dst[x * c + ci + i] = src[(ci + i) * hw + x];
  }
}

static void afc_wino3x3(int64_t c, int64_t k, int64_t h, int64_t w, const float *in, int64_t ty0, int64_t ty1,
                        const float *up, int64_t ldu, float *out, int64_t ldo, const float *bias, const float *res,
                        int64_t res_ld, int act, float lo, float hi, int64_t tr, float *ws) {
  const int64_t tw = w / 2, wp = w + 2, nt_most = tr * tw;
  float *hwc = ws, *v = hwc + (2 * tr + 2) * wp * c, *m = v + 16 * nt_most * c, *tile = m + 16 * nt_most * k;
  int32_t offs[AFC_KC];
  for (int64_t b0 = ty0; b0 < ty1; b0 += tr) {
    const int64_t rows_t = ty1 - b0 < tr ? ty1 - b0 : tr, nt = rows_t * tw, y0 = 2 * b0 - 1;
    /* input rows y0 .. y0 + 2 rows_t + 1, channels last, a zero column each side */
    for (int64_t r = 0; r < 2 * rows_t + 2; ++r) {
      const int64_t y = y0 + r;
      float *dst = hwc + r * wp * c;
      if (y < 0 || y >= h) {
        memset(dst, 0, sizeof(float) * (size_t)(wp * c));
        continue;
      }
      memset(dst, 0, sizeof(float) * (size_t)c);
      memset(dst + (w + 1) * c, 0, sizeof(float) * (size_t)c);
      afc_wino_row_hwc(in + y * w, c, h * w, w, dst + c);
    }
    /* V[xi][t][c] = B^T d B */
    for (int64_t t = 0; t < nt; ++t) {
      const float *d0 = hwc + (2 * (t / tw) * wp + 2 * (t % tw)) * c;
      for (int64_t ci = 0; ci < c; ci += AFC_WINO_LANES) {
        float q[4][4][AFC_WINO_LANES];
        for (int j = 0; j < 4; ++j) {
          const float *a = d0 + j * c + ci, *b = a + wp * c, *e = b + wp * c, *f = e + wp * c;
#pragma omp simd
          for (int l = 0; l < AFC_WINO_LANES; ++l) {
            q[0][j][l] = a[l] - e[l];
            q[1][j][l] = b[l] + e[l];
            q[2][j][l] = e[l] - b[l];
            q[3][j][l] = b[l] - f[l];
          }
        }
        for (int i = 0; i < 4; ++i) {
          float *o = v + ((i * 4) * nt + t) * c + ci;
          const int64_t s = nt * c;
#pragma omp simd
          for (int l = 0; l < AFC_WINO_LANES; ++l) {
            o[l] = q[i][0][l] - q[i][2][l];
            o[s + l] = q[i][1][l] + q[i][2][l];
            o[2 * s + l] = q[i][2][l] - q[i][1][l];
            o[3 * s + l] = q[i][1][l] - q[i][3][l];
          }
        }
      }
    }
    /* M[xi] = V[xi] . U[xi]: the tiles as rows, read in place */
    const int64_t kb = afc_depth_block(c, AFC_INPLACE_KC);
    for (int x = 0; x < 16; ++x) {
      const float *vx = v + x * nt * c, *bx = up + x * ldu;
      float *mx = m + x * nt * k;
      for (int64_t k0 = 0; k0 < c; k0 += kb) {
        const int64_t kc = c - k0 < kb ? c - k0 : kb;
        for (int64_t kk = 0; kk < kc; ++kk) offs[kk] = (int32_t)(k0 + kk);
        for (int64_t j0 = 0; j0 < k; j0 += AFC_NR) {
          const int nr = (int)(k - j0 < AFC_NR ? k - j0 : AFC_NR);
          for (int64_t panel = 0; panel * AFC_MR < nt; ++panel) {
            int64_t ii;
            int rows;
            afc_panel_span(nt, panel, 1, &ii, &rows);
            const float *arow[AFC_MR];
            for (int i = 0; i < AFC_MR; ++i) arow[i] = vx + (ii + (i < rows ? i : 0)) * c;
            afc_ukernel(kc, 0, arow, bx + j0 * c + k0 * AFC_NR, offs, mx + ii * k + j0, k, rows, nr, 1.0f, k0 > 0,
                        0, 0);
          }
        }
      }
    }
    /* Y = A^T M A into tile[pixel][k], pixel (2 ty + a) * w + 2 tx + b of the block */
    for (int64_t t = 0; t < nt; ++t) {
      const int64_t ty = t / tw, tx = t % tw;
      for (int64_t j = 0; j < k; j += AFC_WINO_LANES) {
        const float *q = m + t * k + j;
        const int64_t s = nt * k;
        float *o0 = tile + ((2 * ty) * w + 2 * tx) * k + j, *o1 = o0 + w * k;
#pragma omp simd
        for (int l = 0; l < AFC_WINO_LANES; ++l) {
          float r0[4], r1[4];
          for (int jj = 0; jj < 4; ++jj) {
            const float m0 = q[jj * s + l], m1 = q[(4 + jj) * s + l], m2 = q[(8 + jj) * s + l],
                        m3 = q[(12 + jj) * s + l];
            r0[jj] = m0 + m1 + m2;
            r1[jj] = m1 - m2 - m3;
          }
          o0[l] = r0[0] + r0[1] + r0[2];
          o0[k + l] = r0[1] - r0[2] - r0[3];
          o1[l] = r1[0] + r1[1] + r1[2];
          o1[k + l] = r1[1] - r1[2] - r1[3];
        }
      }
    }
    const int64_t p = 2 * (b0 - ty0) * w;
    afc_store_t_post(2 * rows_t * w, k, tile, k, out + p, ldo, bias, res ? res + p : 0, res_ld, act, lo, hi);
  }
}
#endif /* AFC_IMPL */
