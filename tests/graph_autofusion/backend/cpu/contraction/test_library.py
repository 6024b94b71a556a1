"""The contraction library itself (afc.h / afc.c), called through its ctypes shim, for every ISA this
host can run: packed layouts as afc.h documents them, and GEMM tiles on odd shapes against numpy.

Tolerance is scale-aware: a K-term fp32 dot product in any summation order is within about
eps * sqrt(K) * (|A| |B|)[i, j] of the exact value in practice (the worst case grows with K, the
typical error with sqrt(K)); we allow 8x that, with |A| |B| computed per element, so a
cancellation in the result never makes the check looser or tighter than the inputs warrant.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
from collections.abc import Iterator

import numpy as np
import pytest

from graph_autofusion.backend.cpu.contraction import PANEL_QUANTUM
from graph_autofusion.backend.cpu.contraction.shim import Library, team_wake_ns

EPS = float(np.finfo(np.float32).eps)
# ISA spelling -> the micro-kernel afc.h says it compiles to.
KERNELS = {"v4": ("avx512_8x32", 8, 32), "v3": ("avx2_6x16", 6, 16), "generic": ("portable_4x16", 4, 16)}


def _expected_kernel(lib: Library) -> tuple[str, int, int]:
    isa = lib.isa
    return KERNELS["v4" if isa.level >= 4 else "v3" if isa.level == 3 else "generic"]


def _check(got: np.ndarray, a: np.ndarray, b: np.ndarray, alpha: float = 1.0) -> None:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = alpha * (a64 @ b64)
    k = max(a.shape[1], 1)
    tol = 8 * EPS * np.sqrt(k) * abs(alpha) * (np.abs(a64) @ np.abs(b64)) + 1e-30
    err = np.abs(got.astype(np.float64) - want)
    assert np.all(np.isfinite(got))
    assert np.all(err <= tol), f"max err {err.max():.3g}, worst ratio {(err / tol).max():.3g}"


def test_each_isa_builds_its_documented_micro_kernel(lib: Library) -> None:
    assert (lib.kernel, lib.mr, lib.nr) == _expected_kernel(lib)
    assert PANEL_QUANTUM % lib.nr == 0  # generators' column tiles are whole panels


# Depths below, at and past the 8-deep blocks that whole panels of a row-major A are packed in
# (transposed in registers), and a column-major A (packed element by element).
@pytest.mark.parametrize(("k", "order"), [(7, "C"), (8, "C"), (21, "C"), (21, "F")])
def test_packed_layouts_are_the_documented_ones(lib: Library, k: int, order: str) -> None:
    rng = np.random.default_rng(k)
    m, n = lib.mr * 2 + 3, lib.nr + 5
    a = np.asarray(rng.standard_normal((m, k)).astype(np.float32), order=order)
    b = rng.standard_normal((k, n)).astype(np.float32)
    ap, bp = lib.pack_a(a), lib.pack_b(b)
    mr, nr = lib.mr, lib.nr
    assert ap.size == -(-m // mr) * mr * k and bp.size == -(-n // nr) * nr * k
    for i in range(-(-m // mr) * mr):
        for kk in range(k):
            p, r = divmod(i, mr)
            assert ap[(p * k + kk) * mr + r] == (a[i, kk] if i < m else 0.0)
    for j in range(-(-n // nr) * nr):
        for kk in range(k):
            q, c = divmod(j, nr)
            assert bp[(q * k + kk) * nr + c] == (b[kk, j] if j < n else 0.0)


SHAPES = [
    (1, 1, 1),
    (1, 33, 1),  # K = 1
    (5, 1, 9),  # one output column
    (7, 17, 3),
    (9, 47, 257),  # K one past the K block
    (15, 65, 513),
    (17, 31, 64),
    (64, 70, 300),  # 64 rows: AVX2's last panel of 4 runs a 4-row kernel
    (200, 400, 300),  # M past the row blocks (MC) of both drivers, N past the B block of afc_gemm_ap
]


@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
def test_gemm_with_packed_a_matches_numpy(lib: Library, m: int, n: int, k: int) -> None:
    rng = np.random.default_rng(m * 1000 + n + k)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    _check(lib.gemm_ap(lib.pack_a(a), b, m), a, b)


@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
def test_gemm_with_packed_b_matches_numpy(lib: Library, m: int, n: int, k: int) -> None:
    rng = np.random.default_rng(m * 1000 + n + k + 1)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    _check(lib.gemm_bp(a, lib.pack_b(b), n), a, b)


def test_strided_operands_and_alpha(lib: Library) -> None:
    rng = np.random.default_rng(3)
    m, n, k = 13, 70, 300
    a = np.asfortranarray(rng.standard_normal((m, k)).astype(np.float32))  # column-major views
    b = np.asfortranarray(rng.standard_normal((k, n)).astype(np.float32))
    _check(lib.gemm_bp(a, lib.pack_b(b), n, alpha=0.5), a, b, 0.5)
    _check(lib.gemm_ap(lib.pack_a(a), b, m, alpha=-2.0), a, b, -2.0)
    wide = rng.standard_normal((k, 2 * n)).astype(np.float32)[:, ::2]  # column stride 2
    _check(lib.gemm_ap(lib.pack_a(a), wide, m), a, wide)


def test_transposed_left_operand_over_several_depth_blocks(lib: Library) -> None:
    # A conv's pixels as rows: A[pixel][channel] read from an NCHW plane (row stride 1), 49 rows
    # (whole panels and a tail), K past two depth blocks.
    rng = np.random.default_rng(5)
    m, n, k = 49, 96, 600
    a = rng.standard_normal((k, m)).astype(np.float32).T
    b = rng.standard_normal((k, n)).astype(np.float32)
    _check(lib.gemm_bp(a, lib.pack_b(b), n), a, b)


def test_values_of_very_different_scales(lib: Library) -> None:
    rng = np.random.default_rng(4)
    m, n, k = 11, 40, 130
    a = (rng.standard_normal((m, k)) * np.logspace(-3, 3, k)).astype(np.float32)
    b = (rng.standard_normal((k, n)) * 1e4).astype(np.float32)
    _check(lib.gemm_bp(a, lib.pack_b(b), n), a, b)
    _check(lib.gemm_ap(lib.pack_a(a), b, m), a, b)


def test_empty_depth_writes_zeros(lib: Library) -> None:
    a = np.zeros((3, 0), np.float32)
    b = np.zeros((0, 5), np.float32)
    assert np.array_equal(lib.gemm_bp(a, lib.pack_b(b), 5), np.zeros((3, 5), np.float32))
    assert np.array_equal(lib.gemm_ap(lib.pack_a(a), b, 3), np.zeros((3, 5), np.float32))


# The GEMV path of afc_gemm_bp (few rows): each forced, every row count it serves, odd N (a tail
# panel of 1 column, of half a panel, of a panel and one), odd K (the chains' remainder loop).
GEMV_SHAPES = [(1, 37), (33, 5), (70, 130), (513, 784)]


@pytest.mark.parametrize(("n", "k"), GEMV_SHAPES)
def test_gemv_path_matches_numpy_for_every_row_count(lib: Library, n: int, k: int) -> None:
    rng = np.random.default_rng(n * 7 + k)
    b = rng.standard_normal((k, n)).astype(np.float32)
    bp = lib.pack_b(b)
    for m in range(1, 8):
        a = rng.standard_normal((m, k)).astype(np.float32)
        _check(lib.gemm_bp(a, bp, n, path="gemv"), a, b)
        _check(lib.gemm_bp(a, bp, n, path="panels"), a, b)


def test_gemv_path_with_strided_rows_and_alpha(lib: Library) -> None:
    rng = np.random.default_rng(9)
    m, n, k = 3, 45, 77
    a = rng.standard_normal((k, m)).astype(np.float32).T  # column-major rows: a_cs != 1
    b = rng.standard_normal((k, n)).astype(np.float32)
    _check(lib.gemm_bp(a, lib.pack_b(b), n, alpha=-1.5, path="gemv"), a, b, -1.5)
    wide = rng.standard_normal((m, 2 * k)).astype(np.float32)[:, ::2]  # column stride 2
    _check(lib.gemm_bp(wide, lib.pack_b(b), n, alpha=0.25, path="gemv"), wide, b, 0.25)


@pytest.mark.parametrize("n", [32, 13])  # whole panels; a tail of at most NR/2 columns
def test_panel_path_computes_every_tail_of_rows(lib: Library, n: int) -> None:
    # the last row panel of 1, up to MR/2 or MR/2 + 1 rows runs a kernel of fewer rows, and the
    # block's panels are balanced (afc.c afc_panel_span: AVX2 to 5 or 6 rows, 49 as 4 x 6 + 5 x 5;
    # AVX-512 to 7 or 8 unless m % 8 is 4, 49 as 7 x 7); over two M blocks (afc_mc) as well, and
    # through a second K block of 150 (a depth tail past the transposing packer's steps of 8); A
    # row-major (a matmul's tokens) and transposed (a conv's pixels, read by masked loads on AVX-512)
    rng = np.random.default_rng(n)
    k = 300
    b = rng.standard_normal((k, n)).astype(np.float32)
    bp = lib.pack_b(b)
    for m in [*range(lib.mr, 3 * lib.mr + 1), 32, 49, 100, 128, 197]:
        a = rng.standard_normal((m, k)).astype(np.float32)
        _check(lib.gemm_bp(a, bp, n, path="panels"), a, b)
        at = np.asfortranarray(a)
        _check(lib.gemm_bp(at, bp, n, path="panels"), at, b)


def test_gemm_bp_takes_the_gemv_path_up_to_its_documented_rows(lib: Library) -> None:
    # afc.h: AVX-512 up to 7 rows, AVX2 5, portable 2. Which path ran shows in the bits: the two
    # sum K in different orders, so over a long K their results differ in the last places.
    assert lib.gemv_rows == {8: 7, 6: 5, 4: 2}[lib.mr]
    rng = np.random.default_rng(11)
    n, k = 64, 2001
    b = rng.standard_normal((k, n)).astype(np.float32)
    bp = lib.pack_b(b)
    for m in range(1, lib.mr + 2):
        a = rng.standard_normal((m, k)).astype(np.float32)
        auto, panels = lib.gemm_bp(a, bp, n), lib.gemm_bp(a, bp, n, path="panels")
        if m > 7:  # the GEMV path serves at most 7 rows on any ISA
            assert np.array_equal(auto, panels)
            continue
        gemv = lib.gemm_bp(a, bp, n, path="gemv")
        assert not np.array_equal(gemv, panels)
        want = gemv if m <= lib.gemv_rows else panels
        assert np.array_equal(auto, want), m


def test_the_wake_probe_reports_a_late_join_in_ns(lib: Library) -> None:
    # The measurement behind threads.PASSIVE_WAKE_NS: never negative; a team of one never gets
    # help, which the probe reports as a join later than the whole work (W = 2 T2 - work >= work).
    assert team_wake_ns(lib, threads=2, probes=3, gap_ns=1000, work_ns=20_000) >= 0
    assert team_wake_ns(lib, threads=1, probes=3, gap_ns=1000, work_ns=20_000) >= 20_000


# afc_conv_ap: rows narrower and wider than a panel (every panel straddling a row end, or some),
# K in one block and in several (accumulated across the straddling stores), dilation, a kernel
# wider than tall, strides (the band in phase planes), output channels not a whole number of panels.
@pytest.mark.parametrize(
    ("channels", "m", "rows", "ow", "kernel", "strides", "dilations"),
    [
        (3, 5, 4, 16, (3, 3), (1, 1), (1, 1)),
        (40, 19, 3, 50, (3, 3), (1, 1), (1, 1)),
        (12, 8, 2, 37, (2, 5), (1, 1), (2, 3)),
        (7, 9, 1, 70, (1, 1), (1, 1), (1, 1)),
        (3, 16, 3, 40, (7, 7), (2, 2), (1, 1)),
        (30, 12, 2, 20, (3, 3), (2, 3), (1, 2)),
    ],
)
def test_conv_reads_the_band_as_its_implicit_im2col(
    lib: Library,
    channels: int,
    m: int,
    rows: int,
    ow: int,
    kernel: tuple[int, int],
    strides: tuple[int, int],
    dilations: tuple[int, int],
) -> None:
    rng = np.random.default_rng(rows * ow)
    (kh, kw), (sh, sw), (dh, dw) = kernel, strides, dilations
    padded = rng.standard_normal(
        (channels, (rows - 1) * sh + (kh - 1) * dh + 1, (ow - 1) * sw + (kw - 1) * dw + 1)
    )
    padded = padded.astype(np.float32)
    # phase planes: plane (a, b) row i, column j = padded[a + i * sh, b + j * sw] (zero past it)
    prows, wp = rows + (kh - 1) * dh // sh, -(-padded.shape[2] // sw)
    band = np.zeros((channels, sh * sw, prows, wp), np.float32)
    for a in range(sh):
        for b in range(sw):
            part = padded[:, a::sh, b::sw][:, :prows]
            band[:, a * sw + b, : part.shape[1], : part.shape[2]] = part
    w = rng.standard_normal((m, channels * kh * kw)).astype(np.float32)
    # the im2col the library must not build: col[(c, ky, kx), (r, x)] = padded[c, r*sh + ky*dh, x*sw + kx*dw]
    taps = [
        padded[:, y * dh : y * dh + (rows - 1) * sh + 1 : sh, z * dw : z * dw + (ow - 1) * sw + 1 : sw]
        for y in range(kh)
        for z in range(kw)
    ]
    col = np.stack(taps, axis=1).reshape(channels * kh * kw, rows * ow)
    _check(lib.conv_ap(lib.pack_a(w), band, m, ow, kernel, strides, dilations), w, col)


# afc_conv_bp: pixel tiles starting mid-row and whole rows, rows narrower than a panel, stride 2
# and dilation, K in one block and several, output channels not a whole number of panels; up to
# AFC_CONV_BP_INPLACE_N channels the taps are read in place, above it gathered into A-panels.
@pytest.mark.parametrize(
    ("channels", "n", "pixels", "kernel", "strides", "dilations"),
    [
        (4, 24, (0, 49, 7), (3, 3), (1, 1), (1, 1)),
        (30, 40, (5, 101, 14), (3, 3), (1, 1), (1, 1)),
        (3, 70, (11, 60, 9), (7, 7), (2, 2), (1, 1)),
        (6, 9, (3, 20, 6), (3, 2), (2, 1), (2, 3)),
        (8, 128, (0, 230, 56), (3, 3), (1, 1), (1, 1)),
        (40, 136, (6, 61, 10), (3, 3), (1, 1), (1, 1)),
        (5, 260, (2, 30, 6), (3, 3), (2, 2), (1, 1)),
        # 45 and 40 pixels: tails of MR/2 + 1 rows (AVX-512: 5 x 8 + 5; AVX2: 6 x 6 + 4)
        (8, 40, (3, 48, 9), (3, 3), (1, 1), (1, 1)),
        (8, 40, (2, 42, 8), (3, 3), (1, 1), (1, 1)),
    ],
)
def test_conv_rows_gather_the_band_as_the_implicit_im2col(
    lib: Library,
    channels: int,
    n: int,
    pixels: tuple[int, int, int],
    kernel: tuple[int, int],
    strides: tuple[int, int],
    dilations: tuple[int, int],
) -> None:
    (p0, p1, ow), (kh, kw), (sh, sw), (dh, dw) = pixels, kernel, strides, dilations
    rows = (p1 - 1) // ow - p0 // ow + 1
    rng = np.random.default_rng(p1)
    shape = (channels, (rows - 1) * sh + (kh - 1) * dh + 1, (ow - 1) * sw + (kw - 1) * dw + 1)
    band = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((channels * kh * kw, n)).astype(np.float32)  # W^T
    r, x = np.divmod(np.arange(p0, p1), ow)
    r -= p0 // ow
    # colt[pixel, (c, ky, kx)] = band[c, r * sh + ky * dh, x * sw + kx * dw]
    taps = [band[:, r * sh + y * dh, x * sw + z * dw] for y in range(kh) for z in range(kw)]
    colt = np.stack(taps, axis=1).reshape(channels * kh * kw, p1 - p0).T
    got = lib.conv_bp(band, lib.pack_b(w), n, pixels, kernel, strides, dilations)
    _check(got, np.ascontiguousarray(colt), w)


@pytest.mark.parametrize(("m", "n"), [(1, 1), (8, 8), (23, 17), (64, 40), (5, 130)])
def test_store_t_writes_the_tile_transposed_into_its_rows(lib: Library, m: int, n: int) -> None:
    rng = np.random.default_rng(m * n)
    ldt, ldo = n + 3, m + 5
    tile = rng.standard_normal((m, ldt)).astype(np.float32)
    out = np.full((n, ldo), np.nan, np.float32)
    lib.lib.afcx_store_t(m, n, tile.ctypes.data, ldt, out.ctypes.data, ldo)
    np.testing.assert_array_equal(out[:, :m], tile[:, :n].T)
    assert np.isnan(out[:, m:]).all()  # nothing past a row's m pixels is written


def test_an_input_is_packed_once_per_kernel_call(lib: Library) -> None:
    rng = np.random.default_rng(11)
    m, k, n = 3 * lib.mr + 5, 300, 2 * lib.nr + 7  # two K blocks, a partial row panel
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    bp = lib.pack_b(w)
    lib.lib.afcx_begin_call()
    _check(lib.gemm_bp(a, bp, n, path="input"), a, w)
    # within one call the operand is the same: its packing of the first tile serves the next
    before = a.copy()
    a[:] = rng.standard_normal(a.shape)
    _check(lib.gemm_bp(a, bp, n, path="input"), before, w)
    # the next call packs it again
    lib.lib.afcx_begin_call()
    _check(lib.gemm_bp(a, bp, n, path="input"), a, w)
    # another operand (here a view of other rows) is packed anew within the call
    _check(lib.gemm_bp(a[2:], bp, n, path="input"), a[2:], w)


def test_an_input_too_large_to_keep_is_packed_per_tile(lib: Library) -> None:
    rng = np.random.default_rng(12)
    m, k, n = 2 * lib.mr, (1 << 20) // (2 * lib.mr) + 64, 3  # past the kept packing's 2^20 floats
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    lib.lib.afcx_begin_call()
    _check(lib.gemm_bp(a, lib.pack_b(w), n, path="input"), a, w)


# Rows per afc_gemm_ap_in chunk in these tests: lower/conv.py's EPILOGUE_CHUNK_ROWS, a whole
# number of A-panels on every ISA.
CHUNK_ROWS = 24


@pytest.mark.parametrize(
    ("m", "n", "k"),
    [
        (3 * CHUNK_ROWS + 5, 70, 64),  # a last chunk of 5 rows, a last column panel of 6 or 7
        (2 * CHUNK_ROWS, 224, 256),  # two depth blocks of 128
        (CHUNK_ROWS + 1, 33, 201),  # uneven depth blocks, a one-row chunk
        (7, 3, 1),  # one depth
    ],
)
def test_a_kept_input_serves_every_row_chunk(lib: Library, m: int, n: int, k: int) -> None:
    rng = np.random.default_rng(m * 7 + n + k)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    lib.lib.afcx_begin_call()
    _check(lib.gemm_ap(lib.pack_a(a), b, m, input_rows=CHUNK_ROWS), a, b)


# afc.h's AFC_POST_* codes
POST_NONE, POST_RELU, POST_CLIP = 0, 1, 2


def _post(c: np.ndarray, bias: np.ndarray | None, res: np.ndarray | None, act: int, lo: float, hi: float):
    """The post-ops in float32, in the order and with the comparisons of ops/elementwise.py."""
    v = c.copy()
    if bias is not None:
        v = v + bias[:, None]
    if res is not None:
        v = v + res
    if act == POST_RELU:
        v = np.where(v > 0, v, np.float32(0))
    elif act == POST_CLIP:
        v = np.where(v < lo, np.float32(lo), v)
        v = np.where(v > hi, np.float32(hi), v)
    return v.astype(np.float32)


@pytest.mark.parametrize(
    ("m", "n", "k", "bias", "res", "act"),
    [
        (3 * CHUNK_ROWS + 5, 70, 64, True, True, POST_RELU),  # ResNet's bias + residual + Relu
        (2 * CHUNK_ROWS, 224, 256, True, False, POST_CLIP),
        (CHUNK_ROWS + 1, 33, 201, False, True, POST_NONE),  # a one-row panel, residual alone
        (CHUNK_ROWS, 230, 1100, True, True, POST_CLIP),  # several depth blocks: post on the last
        (7, 3, 1, True, False, POST_RELU),
        (201, 420, 72, True, True, POST_RELU),  # past one row block (MC) and one column block (NC)
        (64, 70, 64, True, True, POST_RELU),  # AVX2's last panel of 4 rows: post-ops in registers
        (64, 224, 256, True, False, POST_CLIP),
        (96, 70, 600, True, True, POST_CLIP),  # B in place over several depth blocks: post on the last
    ],
)
def test_post_ops_are_the_epilogue_of_the_same_product(
    lib: Library, m: int, n: int, k: int, bias: bool, res: bool, act: int
) -> None:
    """afc_gemm_ap_post equals afc_gemm_ap's product with the post-ops applied after it, bit
    for bit (the same product; the ops in the same order), NaN included: Relu maps it to 0, Clip
    keeps it, as the generated epilogue does (afc_gemm_ap_post reads B in place where
    afc_gemm_ap does: up to AFC_INPLACE_MAX_ROWS rows)."""
    rng = np.random.default_rng(m + n + k)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    ap = lib.pack_a(a)
    bias_v = rng.standard_normal(m).astype(np.float32) if bias else None
    res_v = rng.standard_normal((m, n)).astype(np.float32) if res else None
    if res_v is not None:
        res_v[m // 2, n // 2] = np.nan
    plain = lib.gemm_ap(ap, b, m)
    got = lib.gemm_ap_post(ap, b, m, (bias_v, res_v, act, -0.5, 0.75))
    np.testing.assert_array_equal(got, _post(plain, bias_v, res_v, act, -0.5, 0.75))
    if res_v is not None:
        assert (got[m // 2, n // 2] == 0) if act == POST_RELU else np.isnan(got[m // 2, n // 2])


@pytest.mark.parametrize(
    ("m", "n", "bias", "res", "act"),
    [
        (100, 256, True, False, POST_RELU),  # ResNet-50's 3x3 at 14x14: bias + Relu
        (49, 960, True, False, POST_CLIP),  # MobileNetV2's 7x7 expansion: ReLU6
        (23, 17, True, True, POST_RELU),  # tails of pixels and of channels, every post-op
        (5, 130, False, True, POST_NONE),  # fewer pixels than a transpose: the residual alone
        (64, 40, True, True, POST_CLIP),
    ],
)
def test_store_t_applies_the_post_ops_to_the_transposed_tile(
    lib: Library, m: int, n: int, bias: bool, res: bool, act: int
) -> None:
    """afc_store_t_post stores what afc_store_t does with the post-ops applied after it, bit for
    bit, each output row (an output channel) taking its own bias, NaN included (Relu maps it to
    0, Clip keeps it, as the generated epilogue does); nothing past a row's m pixels is written."""
    rng = np.random.default_rng(m + n)
    ldt, ldo = n + 3, m + 5
    tile = rng.standard_normal((m, ldt)).astype(np.float32)
    tile[m // 2, n // 2] = np.nan
    bias_v = rng.standard_normal(n).astype(np.float32) if bias else None
    res_v = rng.standard_normal((n, ldo)).astype(np.float32) if res else None
    out = np.full((n, ldo), np.nan, np.float32)
    lib.lib.afcx_store_t_post(
        m, n, tile.ctypes.data, ldt, out.ctypes.data, ldo,
        bias_v.ctypes.data if bias_v is not None else None,
        res_v.ctypes.data if res_v is not None else None, ldo, act, -0.5, 0.75,
    )  # fmt: skip
    expected = _post(tile[:, :n].T, bias_v, res_v[:, :m] if res_v is not None else None, act, -0.5, 0.75)
    np.testing.assert_array_equal(out[:, :m], expected)
    assert (out[n // 2, m // 2] == 0) if act == POST_RELU else np.isnan(out[n // 2, m // 2])
    assert np.isnan(out[:, m:]).all()


PROT_NONE = 0  # <sys/mman.h>; the mmap module names only the other protections


@contextlib.contextmanager
def _ending_at_a_guard_page(floats: int) -> Iterator[np.ndarray]:
    """`floats` float32s whose last one ends where a page the process may not touch begins: a
    read past them is a segmentation fault, not a silently ignored value."""
    page = mmap.PAGESIZE
    data = -(-4 * floats // page) * page
    region = mmap.mmap(-1, data + page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(base + data, page, PROT_NONE) == 0, ctypes.get_errno()
    try:
        yield np.frombuffer(region, np.float32, floats, data - 4 * floats)
    finally:
        libc.mprotect(base + data, page, mmap.PROT_READ | mmap.PROT_WRITE)


@pytest.mark.parametrize(
    ("m", "n", "k", "rs"),
    [
        (64, 384, 256, 3136),  # ResNet-50's 256 -> 64 1x1 at 56x56: a pixel tile of a 3136-pixel plane
        (24, 70, 144, 97),  # a last micro-panel of 6 (AVX-512) or 6 (AVX2) columns, two depth blocks
        (9, 33, 300, 33),  # rows back to back, a one-column last micro-panel, three depth blocks on AVX2
        (128, 47, 64, 50),  # the most rows read in place (AFC_INPLACE_MAX_ROWS)
        (48, 45, 600, 3136),  # several in-place depth blocks on every ISA, a last micro-panel packed
        (5, 31, 1, 31),  # one depth, no whole micro-panel on AVX-512
    ],
)
def test_a_right_operand_read_in_place_ends_at_its_last_column(
    lib: Library, m: int, n: int, k: int, rs: int
) -> None:
    """afc_gemm_ap reads a B of unit column stride where it lies (a 1x1 conv's pixel tile: k rows
    of n pixels at the plane's row stride `rs`), its last micro-panel of fewer than NR columns
    packed: the product is numpy's, as the packing driver's is, and nothing past B's last column
    is read (B here ends at a page the process may not read)."""
    rng = np.random.default_rng(m + n + k + rs)
    a = rng.standard_normal((m, k)).astype(np.float32)
    plane = rng.standard_normal((k, rs)).astype(np.float32)
    with _ending_at_a_guard_page((k - 1) * rs + n) as flat:
        flat[:] = plane.reshape(-1)[: flat.size]
        b = np.lib.stride_tricks.as_strided(flat, (k, n), (4 * rs, 4))
        _check(lib.gemm_ap(lib.pack_a(a), b, m), a, plane[:, :n])
        bias = rng.standard_normal(m).astype(np.float32)
        got = lib.gemm_ap_post(lib.pack_a(a), b, m, (bias, None, POST_RELU, 0.0, 0.0))
    _check(lib.gemm_ap(lib.pack_a(a), plane[:, :n], m, packed=True), a, plane[:, :n])
    want = lib.gemm_ap(lib.pack_a(a), plane[:, :n], m)
    np.testing.assert_array_equal(got, _post(want, bias, None, POST_RELU, 0.0, 0.0))


def test_a_right_input_is_packed_once_per_kernel_call(lib: Library) -> None:
    rng = np.random.default_rng(13)
    m, k, n = 2 * CHUNK_ROWS, 96, lib.nr + 5
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    ap = lib.pack_a(a)
    lib.lib.afcx_begin_call()
    _check(lib.gemm_ap(ap, b, m, input_rows=CHUNK_ROWS), a, b)
    # within the call the operand is the same: the packing of its first chunk serves later ones
    before = b.copy()
    b[:] = rng.standard_normal(b.shape)
    _check(lib.gemm_ap(ap, b, m, input_rows=CHUNK_ROWS), a, before)
    # the next call packs it again, and so does another operand within a call
    lib.lib.afcx_begin_call()
    _check(lib.gemm_ap(ap, b, m, input_rows=CHUNK_ROWS), a, b)
    _check(lib.gemm_ap(ap, b[:, 1:], m, input_rows=CHUNK_ROWS), a, b[:, 1:])


def test_a_right_input_too_large_to_keep_takes_the_blocked_path(lib: Library) -> None:
    rng = np.random.default_rng(14)
    m, k, n = CHUNK_ROWS + 3, 300, 8 * 32  # 300 x 256 floats: past the kept 2^16
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    lib.lib.afcx_begin_call()
    _check(lib.gemm_ap(lib.pack_a(a), b, m, input_rows=CHUNK_ROWS), a, b)


def _depthwise_reference(
    x: np.ndarray, w: np.ndarray, out: tuple[int, int], pads: tuple[int, int], stride: int = 1
) -> np.ndarray:
    """A depthwise 3x3 of `x[planes, h, wd]` (plane p by channel p % channels) as y[planes, oh,
    ow]: a zero-padded copy and one strided window per tap, in float64."""
    planes, h, wd = x.shape
    (oh, ow), (pt, pl) = out, pads
    padded = np.zeros((planes, stride * oh + 2, stride * ow + 2 + wd))
    rows = min(h, padded.shape[1] - pt)
    padded[:, pt : pt + rows, pl : pl + wd] = x[:, :rows]
    taps = w[np.arange(planes) % w.shape[0]].astype(np.float64)
    y = np.zeros((planes, oh, ow))
    for ky in range(3):
        for kx in range(3):
            window = padded[:, ky : ky + stride * oh : stride, kx : kx + stride * ow : stride]
            y += taps[:, ky, kx, None, None] * window
    return y


# afc_dw3x3: 7x7 planes of two images' channels, unequal pads (the left one 0, 1 or 2), rows of
# one and two AVX-512 registers with their left pad (28, 16, 31 wide) and wider (32, 47, 56: a
# column vector at a time), AVX2's flat rows (at most 8 wide) and its padded plane, one-row and
# one-pixel planes, a plane too tall for AVX2's padded copy (the scalar loop there).
STRIDE1 = [
    (12, 6, (7, 7), 7, (1, 1)),
    (5, 5, (7, 7), 7, (0, 2)),
    (4, 2, (28, 28), 28, (1, 1)),
    (3, 3, (10, 16), 10, (1, 0)),
    (2, 2, (5, 31), 6, (1, 1)),
    (2, 2, (4, 32), 4, (1, 1)),
    (3, 3, (5, 47), 6, (1, 2)),
    (2, 1, (56, 56), 56, (1, 1)),
    (3, 3, (8, 8), 9, (0, 1)),
    (3, 3, (1, 9), 1, (1, 1)),
    (2, 2, (1, 1), 1, (1, 1)),
    (2, 2, (1100, 8), 1100, (1, 1)),
]
# afc_dw3x3_s2: MobileNetV2's 14 -> 7, 28 -> 14, 56 -> 28 and 112 -> 56 (pads 1 and the TF-style
# 0 / 1), odd input sizes, outputs of one and of several AVX-512 vectors, a one-row plane, and a
# plane too large for AVX2's padded column phases (the scalar loop there).
STRIDE2 = [
    (12, 6, (14, 14), (7, 7), (1, 1)),
    (4, 4, (28, 28), (14, 14), (0, 0)),
    (3, 3, (56, 56), (28, 28), (1, 1)),
    (2, 2, (112, 112), (56, 56), (1, 1)),
    (3, 3, (15, 37), (8, 19), (1, 1)),
    (3, 3, (9, 70), (4, 34), (0, 0)),
    (3, 3, (1, 9), (1, 5), (1, 1)),
    (2, 2, (400, 40), (200, 20), (1, 1)),
]


@pytest.mark.parametrize(
    ("planes", "channels", "size", "out", "pads", "stride"),
    [(n, c, size, (oh, size[1]), pads, 1) for n, c, size, oh, pads in STRIDE1]
    + [(*case, 2) for case in STRIDE2],
)
def test_depthwise_3x3_planes_match_the_padded_convolution(
    lib: Library,
    planes: int,
    channels: int,
    size: tuple[int, int],
    out: tuple[int, int],
    pads: tuple[int, int],
    stride: int,
) -> None:
    """Planes [1, p1) of a run against the reference, the planes around them untouched, then
    again with another top pad (the same plane sizes: a thread's kept padded plane must follow)
    and once more as at first."""
    rng = np.random.default_rng(planes * size[0] + size[1])
    x = rng.standard_normal((planes, *size)).astype(np.float32)
    w = rng.standard_normal((channels, 3, 3)).astype(np.float32)
    p1 = max(2, planes - 1)
    for top in (pads[0], pads[0] + 1, pads[0]):
        got = lib.dw3x3(x, w, out, (top, pads[1]), stride=stride, planes=(1, p1))
        expected = _depthwise_reference(x, w, out, (top, pads[1]), stride)
        assert np.isnan(got[0]).all() and np.isnan(got[p1:]).all()  # only planes [p0, p1)
        scale = np.abs(expected).max()
        np.testing.assert_allclose(got[1:p1], expected[1:p1], rtol=0, atol=1e-5 * scale)


# afc_pw_dw3x3: (cin, cexp, h, w, stride, runs of output rows, band rows): one run in one band,
# runs of several bands with a shorter last one, bands of one row (the kept rows move by one),
# AVX2's flat rows (w <= 8), odd sizes at stride 2 (the last band reads the bottom row), a run
# that starts inside the image (its first band expands the rows above it too).
PW_DW = [
    (3, 5, 7, 7, 1, [range(0, 7)], 8),
    (4, 9, 13, 11, 1, [range(0, 6), range(6, 13)], 3),
    (5, 16, 10, 37, 1, [range(0, 10)], 1),
    (2, 7, 6, 5, 1, [range(0, 2), range(2, 6)], 2),
    (6, 10, 15, 33, 2, [range(0, 4), range(4, 8)], 3),
    (3, 8, 16, 18, 2, [range(0, 8)], 1),
    (4, 12, 9, 70, 2, [range(2, 5)], 2),
]


@pytest.mark.parametrize(("cin", "cexp", "h", "w", "stride", "runs", "band"), PW_DW)
@pytest.mark.parametrize("act", [POST_NONE, POST_CLIP])
def test_a_pointwise_conv_into_a_depthwise_conv_band_by_band(
    lib: Library, cin: int, cexp: int, h: int, w: int, stride: int, runs: list[range], band: int, act: int
) -> None:
    """Each run's bands, the later ones reusing the rows the band before expanded, give the 1x1
    conv with its post-ops (bias, Clip; none without a bias) followed by the padded depthwise
    conv; rows outside the runs are not written."""
    rng = np.random.default_rng(cin * h + w)
    x = rng.standard_normal((cin, h, w)).astype(np.float32)
    w1 = rng.standard_normal((cexp, cin)).astype(np.float32)
    w2 = rng.standard_normal((cexp, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(cexp).astype(np.float32) if act != POST_NONE else None
    got = lib.pw_dw3x3(x, w1, (bias, act, -0.5, 1.5), w2, stride, runs, band)
    mid = np.einsum("ck,khw->chw", w1.astype(np.float64), x.astype(np.float64))
    if bias is not None:
        mid = np.clip(mid + bias[:, None, None], -0.5, 1.5)
    out = ((h - 1) // stride + 1, (w - 1) // stride + 1)
    expected = _depthwise_reference(mid, w2, out, (1, 1), stride)
    rows = sorted({r for run in runs for r in run})
    others = [r for r in range(out[0]) if r not in rows]
    assert np.isnan(got[:, others]).all()
    scale = np.abs(expected).max()
    np.testing.assert_allclose(got[:, rows], expected[:, rows], rtol=0, atol=1e-5 * scale)


# afc_dw3x3_pw: (c, cout, h, w, stride, bands of output rows): one band, bands of one and several
# rows with a shorter last one, AVX2's flat rows (w <= 8), odd sizes at stride 2, bands not from
# the top
DW_PW = [
    (5, 3, 7, 7, 1, [(0, 7)]),
    (9, 4, 13, 11, 1, [(0, 1), (1, 5), (5, 13)]),
    (7, 2, 6, 5, 1, [(0, 3), (3, 6)]),
    (10, 6, 15, 33, 2, [(0, 3), (3, 6), (6, 8)]),
    (12, 4, 9, 70, 2, [(2, 5)]),
]


@pytest.mark.parametrize(("c", "cout", "h", "w", "stride", "bands"), DW_PW)
@pytest.mark.parametrize("act", [POST_NONE, POST_CLIP])
def test_a_depthwise_conv_into_a_pointwise_conv_band_by_band(
    lib: Library, c: int, cout: int, h: int, w: int, stride: int, bands: list[tuple[int, int]], act: int
) -> None:
    """Each band gives the padded depthwise conv with its post-ops (bias, Clip; none without a
    bias) followed by the 1x1 conv; rows outside the bands are not written."""
    rng = np.random.default_rng(c * h + w)
    x = rng.standard_normal((c, h, w)).astype(np.float32)
    w1 = rng.standard_normal((c, 3, 3)).astype(np.float32)
    w2 = rng.standard_normal((cout, c)).astype(np.float32)
    bias = rng.standard_normal(c).astype(np.float32) if act != POST_NONE else None
    got = lib.dw3x3_pw(x, w1, (bias, act, -0.5, 1.5), w2, stride, bands)
    out = ((h - 1) // stride + 1, (w - 1) // stride + 1)
    mid = _depthwise_reference(x, w1, out, (1, 1), stride)
    if bias is not None:
        mid = np.clip(mid + bias[:, None, None], -0.5, 1.5)
    expected = np.einsum("oc,chw->ohw", w2.astype(np.float64), mid)
    rows = sorted({r for a, b in bands for r in range(a, b)})
    others = [r for r in range(out[0]) if r not in rows]
    assert np.isnan(got[:, others]).all()
    scale = np.abs(expected).max()
    np.testing.assert_allclose(got[:, rows], expected[:, rows], rtol=0, atol=1e-5 * scale)
