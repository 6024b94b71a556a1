/* afc.h - the contraction library's ABI (graph_autofusion.backend.cpu.contraction).
 *
 * One narrow interface that generated anchor kernels (the C-text conv and chain anchors, and the
 * kernel IR's per-tile `Call` of a lowered MatMul/Gemm, lower/anchor.py)
 * use for fp32 GEMM tiles:
 *
 *     C[m x n] = alpha * A[m x k] x B[k x n]        (row-major C, leading dimension ldc; beta = 0)
 *
 * where ONE operand is constant (a weight) and packed once, at load time, into the micro-kernel's
 * panel layout, and the other is read in place (any row/column strides) and packed per call into
 * a per-thread buffer the library owns. Everything is single-threaded: the caller owns the
 * parallel loop (one call per output tile) and applies its epilogue on the tile right after.
 *
 * Packed layouts (both independent of the library's cache blocking, so a tile may start at any
 * panel and use any K range):
 *   A-panels of an m x k left operand: panel p holds rows [p*AFC_MR, p*AFC_MR + AFC_MR), k-major:
 *       ap[(p * k + kk) * AFC_MR + i] = A[p*AFC_MR + i][kk]    (zero past row m)
 *   B-panels of a k x n right operand: panel q holds columns [q*AFC_NR, q*AFC_NR + AFC_NR):
 *       bp[(q * k + kk) * AFC_NR + j] = B[kk][q*AFC_NR + j]    (zero past column n)
 * A tile whose first row m0 (A-panels) or first column n0 (B-panels) is a multiple of the panel
 * size starts at `ap + m0 * k` or `bp + n0 * k`.
 *
 * AFC_MR x AFC_NR is the register tile of the micro-kernel, fixed per ISA at compile time
 * (the source is compiled with the kernel's own -march flags):
 *   AVX-512 (x86-64-v4): 8 x 32  (16 zmm accumulators; A broadcast, B two vector loads per k)
 *   AVX2 + FMA (v3):     6 x 16  (12 ymm accumulators)
 *   portable C:          4 x 16  (whatever the compiler vectorizes)
 * A tile's last panel of at most NR/2 valid columns runs on one vector per row (half the FMAs);
 * in afc_gemm_bp and afc_conv_bp (rows: pixels or tokens) a panel of one row, at most MR/2 rows
 * or MR/2 + 1 rows runs only those rows' FMAs, and so does one of 4 or 5 rows on AVX2 and of 6 or
 * 7 on AVX-512; those paths balance a block's panels (afc_panel_span; 49 pixels: 4 x 6 + 5 x 5 on
 * AVX2, 7 x 7 on AVX-512); a last A-panel of 4 rows in the packed-A paths runs its rows on AVX2.
 * Generated code never hard-codes these figures: packed sizes are C expressions of AFC_MR and
 * AFC_NR, and column tiles are multiples of 32 (a whole number of panels on every ISA).
 *
 * Functions (all `static`: the library is compiled into each translation unit that uses it):
 *   int64_t afc_packed_a_floats(m, k)                 floats of the A-panels of an m x k operand
 *   int64_t afc_packed_b_floats(k, n)                 floats of the B-panels of a k x n operand
 *   void afc_pack_a(m, k, a, rs, cs, ap)              A[i][kk] = a[i*rs + kk*cs] -> A-panels
 *   void afc_pack_b(k, n, b, rs, cs, bp)              B[kk][j] = b[kk*rs + j*cs] -> B-panels
 *   void afc_gemm_ap(m, n, k, alpha, ap, b, b_rs, b_cs, c, ldc)   A packed, B strided
 *   void afc_gemm_bp(m, n, k, alpha, a, a_rs, a_cs, bp, c, ldc)   A strided, B packed
 *   void afc_gemv_bp(m, n, k, alpha, a, a_rs, a_cs, bp, c, ldc)   the same for m <= AFC_GEMV_ROWS
 *   void afc_gemm_bp_in(m, n, k, alpha, a, a_rs, a_cs, bp, c, ldc)
 *       afc_gemm_bp for an A that does not change during the kernel call (a kernel input): each
 *       thread packs it once per call and reuses the packing for its later tiles of the same A
 *   void afc_gemm_ap_in(m, n, k, alpha, ap, b, b_rs, b_cs, c, ldc)
 *       afc_gemm_ap for a B that does not change during the kernel call, called per chunk of a
 *       few A-panels (m rows starting at a whole panel): each thread packs B once per call (up to
 *       AFC_KC x AFC_NC floats; a larger B takes afc_gemm_ap) and reuses it for the later chunks
 *   void afc_gemm_ap_post(m, n, k, ap, b, b_rs, c, ldc, bias, res, res_ld, act, lo, hi)
 *       afc_gemm_ap (alpha 1, B's columns contiguous) with the post-ops of a
 *       conv's common epilogue applied to each tile of the last depth block, on its accumulators
 *       before the store (AVX-512, AVX2; on the stored tile in the portable build):
 *       C[i][j] + bias[i] (bias not NULL), then + res[i * res_ld + j] (res not NULL), then
 *       `act`: AFC_POST_RELU (v > 0 ? v : 0) or AFC_POST_CLIP (v < lo ? lo : v, then
 *       v > hi ? hi : v) or AFC_POST_NONE. `bias` and `res` are indexed from the call's first row and column.
 *   void afc_begin_call(void)                         a kernel call starts (before its parallel
 *       loop): packings kept by afc_gemm_bp_in / afc_gemm_ap_in for an earlier call are not reused
 *   void afc_conv_ap(m, rows, ow, k, ap, band, plane, phase, wp, sh, sw, kh, kw, dh, dw, c, ldc)
 *       a conv's tile of `rows` whole output rows of width `ow`, A packed (the weight, m x k with
 *       k = channels * kh * kw), B read from a zero-padded band of input rows (no im2col):
 *       channel ch's band at `band + ch * plane`, in sh x sw phase planes of `phase` floats (one
 *       plane for a stride-1 conv), plane (a, b) holding padded rows a, a + sh, ... and columns b,
 *       b + sw, ..., `wp` floats a row (wp >= ow + ((kw - 1) * dw) / sw, ow >= 16). Output (r, x)
 *       of tap (ch, ky, kx), with y = ky * dh and z = kx * dw, reads
 *       band[ch * plane + (y % sh * sw + z % sw) * phase + (r + y / sh) * wp + x + z / sw].
 *       C[i][r * ow + x] at c + i * ldc. Columns past a row's end are computed and dropped, so the
 *       band must be readable up to channels * plane + AFC_NR + wp floats, with finite values
 *       (zeros) there.
 *   void afc_conv_bp(m, n, k, p0, ow, sh, sw, band, plane, wp, kh, kw, dh, dw, bp, c, ldc)
 *       a conv's tile with its pixels as rows: C[i][j] (at c + i * ldc) for output pixels
 *       p0 .. p0 + m - 1 (row-major over output rows of width `ow`) and output channels j < n,
 *       B packed (the weight as W^T, k x n), A[i][(ch, ky, kx)] read from the zero-padded band of
 *       input rows from output row p0 / ow's first one on: band[ch * plane + (r * sh + ky * dh)
 *       * wp + x * sw + kx * dw] for pixel p0 + i at output row p0 / ow + r, column x. Any
 *       stride; nothing outside those addresses is read.
 *   void afc_store_t(m, n, tile, ldt, out, ldo)
 *       out[j * ldo + i] = tile[i * ldt + j] (i < m, j < n): a pixels-as-rows tile stored into
 *       NCHW, by register transposes.
 *   void afc_store_t_post(m, n, tile, ldt, out, ldo, bias, res, res_ld, act, lo, hi)
 *       afc_store_t with afc_gemm_ap_post's post-ops on each stored value, out's rows (j, the
 *       output channels) as their rows: + bias[j], then + res[j * res_ld + i], then `act`.
 *   void afc_dw3x3(p0, p1, cout, x, w, y, h, wd, oh, pt, pl)
 *       a depthwise 3x3 of stride 1, undilated, whose output rows are wd wide like its input's
 *       (pl plus the right pad = 2), over planes p0 .. p1 - 1 of h x wd floats at x + p * h * wd:
 *       y[p * oh * wd + oy * wd + ox] = sum over taps (ky, kx) of w[(p % cout) * 9 + ky * 3 + kx]
 *       * x[p * h * wd + iy * wd + ix], iy = oy + ky - pt, ix = ox + kx - pl, taps outside the
 *       plane skipped. Vectorized on AVX-512; on AVX2 where (oh + 2) * (8 * ceil(wd / 8) + 8)
 *       <= 16384 (its zero-padded plane per thread); other planes take a scalar loop.
 *   void afc_dw3x3_s2(p0, p1, cout, x, w, y, h, wd, oh, ow, pt, pl)
 *       the same at stride 2 (output rows ow wide): y[p * oh * ow + oy * ow + ox] reads input
 *       rows 2 oy + ky - pt and columns 2 ox + kx - pl. Vectorized on AVX-512; on AVX2 where 2 *
 *       (2 oh + 1) * (8 * ceil(ow / 8) + 8) <= 16384 (its padded column phases per thread).
 *   void afc_pw_dw3x3(cexp, cin, ap, x, h, w, bias, act, lo, hi, w2, y, oh, ow, stride, pt, pl,
 *                     oy0, oy1, band, first, buf)
 *       output rows [oy0, oy1) (at most `band` of them) of afc_dw3x3 (stride 1) or afc_dw3x3_s2
 *       (stride 2) over the cexp planes h x w of M = the 1x1 conv `ap` (the A-panels of its cexp x
 *       cin weight) of x[cin][h * w], with afc_gemm_ap_post's post-ops (bias, act, lo, hi; no
 *       residual): y[c * oh * ow + oy * ow + ox] for c < cexp. M's rows the band reads are
 *       expanded into `buf`, cexp * (stride * (band - 1) + 3) * w floats of the calling thread;
 *       with `first` 0 the call must follow, on the same thread and buffer, the one for the band
 *       [oy0 - band, oy0) of the same x, whose expanded rows it reuses.
 *   void afc_dw3x3_pw(c, x, h, w, w1, bias, act, lo, hi, stride, pt, pl, cout, ap, y, oh, ow, oy0, oy1, buf)
 *       output rows [oy0, oy1) of the 1x1 conv `ap` (the A-panels of its cout x c weight) of D =
 *       afc_dw3x3 (stride 1) or afc_dw3x3_s2 (stride 2) of x[c][h * w] by w1[c][9], with
 *       afc_gemm_ap_post's post-ops (bias, act, lo, hi; no residual) on D:
 *       y[o * oh * ow + oy * ow + ox] for o < cout. D's band is computed into `buf`, c * (oy1 - oy0)
 *       * ow floats of the calling thread.
 *   void afc_wino3x3_pack(c, k, w, up, ldu)
 *       a 3x3 conv's weight w[k][c][3][3] as Winograd F(2x2, 3x3)'s 16 transformed matrices
 *       U[xi][c][k] (G g G^T), each as B-panels (afc_pack_b's layout) at up + xi * ldu.
 *   void afc_wino3x3(c, k, h, w, in, ty0, ty1, up, ldu, out, ldo, bias, res, res_ld, act, lo,
 *                    hi, tr, ws)
 *       output rows [2 ty0, 2 ty1) and channels [0, k) of the 3x3 conv of stride 1 and padding 1
 *       of in[c][h][w] (h, w even; c, k multiples of 16) whose weight up (ldu floats per
 *       transform) afc_wino3x3_pack packed (a column block of it: up + j0 * c, j0 a multiple of
 *       32), by Winograd F(2x2, 3x3) in blocks of `tr` tile rows, stored at out[j * ldo + p]
 *       (p from output row 2 ty0 on) with afc_store_t_post's post-ops. `ws`: the calling
 *       thread's (2 tr + 2)(w + 2) c + 8 tr w (c + k) + 2 tr w k floats.
 * Sizes are int64_t, strides in elements. Buffers from the caller need no particular alignment;
 * packed buffers of 64-byte alignment are faster.
 */
#ifndef AFC_H
#define AFC_H
#include <stdint.h>

#if defined(__AVX512F__)
#define AFC_MR 8
#define AFC_NR 32
#define AFC_KERNEL "avx512_8x32"
#elif defined(__AVX2__) && defined(__FMA__)
#define AFC_MR 6
#define AFC_NR 16
#define AFC_KERNEL "avx2_6x16"
#else
#define AFC_MR 4
#define AFC_NR 16
#define AFC_KERNEL "portable_4x16"
#endif

/* Cache blocking of the drivers: the operand packed per call is packed in blocks (KC x NC for
 * afc_gemm_ap, MC x KC for afc_gemm_bp) that stay in L2; a KC-deep micro-panel of one of the two
 * operands stays in L1 while the other's micro-panels stream past it (afc_gemm_ap: one B
 * micro-panel, KC x NR, against the A panels of MC rows; afc_gemm_bp: one B micro-panel of the
 * packed weight against the MC x KC block of A). K is split into equal blocks of at most KC and,
 * in afc_gemm_bp, M into equal blocks of at most MC rows (whole panels). While a micro-panel
 * computes, the micro-kernel prefetches the weight panel the driver streams next (A panels on
 * afc_gemm_ap's first pass over a row block, the next B panel in afc_gemm_bp), one cache line per
 * depth step: the weights come from L3 or memory, and a panel used by few rows or columns (a
 * conv's 49 pixels) otherwise waits on them. */
#define AFC_KC 256
#define AFC_NC 384
#define AFC_MC 192

/* Rows at or below which afc_gemm_bp runs afc_gemv_bp (afc.c: every weight panel streamed once,
 * m rows of accumulators, no K blocks) instead of the whole-panel micro-kernel path. Measured one
 * thread, minimum of 3 x 200 calls, each path forced through the shim (afcx_gemv_bp vs
 * afcx_gemm_bp_panels), K x N = 784x512, 512x256, 768x768, 768x3072 (Zen 4, 2026-12-03):
 *   AVX-512: GEMV/panels 0.33-0.47 at m = 1, 0.52-0.70 at m = 4, 0.86-0.89 at m = 7 -> 7
 *            (every m below AFC_MR = 8);
 *   AVX2:    0.39-0.60 at m = 1, 0.78-0.86 at m = 5, 0.87-0.97 at m = 6 (within the host's noise;
 *            6 rows are a whole AFC_MR panel), 0.98-1.15 at m = 7 (14 accumulators spill) -> 5;
 *   portable: 0.34-0.39 at m = 1, 0.66-0.70 at m = 2, 1.00-1.08 at m = 3 (its loops are per
 *            row, so its cost grows with m while a 4-row panel costs the same) -> 2. */
#if defined(__AVX512F__)
#define AFC_GEMV_ROWS 7
#elif defined(__AVX2__) && defined(__FMA__)
#define AFC_GEMV_ROWS 5
#else
#define AFC_GEMV_ROWS 2
#endif

/* Output channels up to which afc_conv_bp reads its A operand (the pixels' taps) from the band in
 * place rather than gathering packed A-panels (afc.c says what each measured). */
#define AFC_CONV_BP_INPLACE_N 128

static int64_t afc_packed_a_floats(int64_t m, int64_t k);
static int64_t afc_packed_b_floats(int64_t k, int64_t n);
static void afc_pack_a(int64_t m, int64_t k, const float *a, int64_t rs, int64_t cs, float *ap);
static void afc_pack_b(int64_t k, int64_t n, const float *b, int64_t rs, int64_t cs, float *bp);
static void afc_gemm_ap(int64_t m, int64_t n, int64_t k, float alpha, const float *ap, const float *b,
                        int64_t b_rs, int64_t b_cs, float *c, int64_t ldc);
static void afc_gemm_bp(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t a_rs,
                        int64_t a_cs, const float *bp, float *c, int64_t ldc);
static void afc_gemv_bp(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t a_rs,
                        int64_t a_cs, const float *bp, float *c, int64_t ldc);
static void afc_gemm_bp_in(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t a_rs,
                           int64_t a_cs, const float *bp, float *c, int64_t ldc);
static void afc_gemm_ap_in(int64_t m, int64_t n, int64_t k, float alpha, const float *ap, const float *b,
                           int64_t b_rs, int64_t b_cs, float *c, int64_t ldc);
#define AFC_POST_NONE 0
#define AFC_POST_RELU 1
#define AFC_POST_CLIP 2
typedef struct {
  const float *bias;
  const float *res;
  int64_t res_ld;
  int act;
  float lo, hi;
} afc_post;
static void afc_gemm_ap_post(int64_t m, int64_t n, int64_t k, const float *ap, const float *b, int64_t b_rs, float *c,
                             int64_t ldc, const float *bias, const float *res, int64_t res_ld, int act, float lo,
                             float hi);
static void afc_begin_call(void);
static void afc_conv_ap(int64_t m, int64_t rows, int64_t ow, int64_t k, const float *ap, const float *band,
                        int64_t plane, int64_t phase, int64_t wp, int64_t sh, int64_t sw, int64_t kh, int64_t kw,
                        int64_t dh, int64_t dw, float *c, int64_t ldc);
static void afc_conv_bp(int64_t m, int64_t n, int64_t k, int64_t p0, int64_t ow, int64_t sh, int64_t sw,
                        const float *band, int64_t plane, int64_t wp, int64_t kh, int64_t kw, int64_t dh,
                        int64_t dw, const float *bp, float *c, int64_t ldc);
static void afc_store_t(int64_t m, int64_t n, const float *tile, int64_t ldt, float *out, int64_t ldo);
static void afc_wino3x3_pack(int64_t c, int64_t k, const float *w, float *up, int64_t ldu);
static void afc_wino3x3(int64_t c, int64_t k, int64_t h, int64_t w, const float *in, int64_t ty0, int64_t ty1,
                        const float *up, int64_t ldu, float *out, int64_t ldo, const float *bias, const float *res,
                        int64_t res_ld, int act, float lo, float hi, int64_t tr, float *ws);
static void afc_dw3x3_s2(int64_t p0, int64_t p1, int64_t cout, const float *x, const float *w, float *y,
                         int64_t h, int64_t wd, int64_t oh, int64_t ow, int64_t pt, int64_t pl);
static void afc_dw3x3(int64_t p0, int64_t p1, int64_t cout, const float *x, const float *w, float *y, int64_t h,
                      int64_t wd, int64_t oh, int64_t pt, int64_t pl);
#endif
