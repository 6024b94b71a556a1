/* afv.h - vector helpers shared by the contraction library (afc.c) and the attention tiles
 * (afa.c); both preludes start with it (contraction/__init__.py), and the guard keeps one copy
 * in a translation unit that carries both. */
#ifndef AFV_H
#define AFV_H
#if defined(__AVX2__)
#include <immintrin.h>

/* An 8 x 8 block of floats transposed in registers: on entry r[i] holds row i, on return r[j]
 * holds column j. Packing uses it where a panel's layout crosses the source's rows (a
 * row-major activation into A panels, K rows into K^T panels): one strided scalar store per
 * float cost about a cycle each. The halves are moved by insert/extract outside AVX-512 builds:
 * AMD's 128-bit-datapath AVX2 cores (Zen 1/Zen+) crack vperm2f128 into 8 uops at one per 3
 * cycles, while insert/extract are 1-2 uops everywhere. */
static inline __attribute__((always_inline)) void afv_transpose8x8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
#if defined(__AVX512F__)
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
#else
  r[0] = _mm256_insertf128_ps(u0, _mm256_castps256_ps128(u4), 1);
  r[1] = _mm256_insertf128_ps(u1, _mm256_castps256_ps128(u5), 1);
  r[2] = _mm256_insertf128_ps(u2, _mm256_castps256_ps128(u6), 1);
  r[3] = _mm256_insertf128_ps(u3, _mm256_castps256_ps128(u7), 1);
  r[4] = _mm256_insertf128_ps(u4, _mm256_extractf128_ps(u0, 1), 0);
  r[5] = _mm256_insertf128_ps(u5, _mm256_extractf128_ps(u1, 1), 0);
  r[6] = _mm256_insertf128_ps(u6, _mm256_extractf128_ps(u2, 1), 0);
  r[7] = _mm256_insertf128_ps(u7, _mm256_extractf128_ps(u3, 1), 0);
#endif
}
#endif
#endif
