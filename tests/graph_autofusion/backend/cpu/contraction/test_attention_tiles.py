"""The attention tiles' row softmax (afa.c `afa_softmax_row`), called through the shim, for every
ISA this host can run: its inline exponential against float64 exp, and the row against a
float64 softmax.

Tolerance: the exponential is within 1 ulp of the correctly rounded exp (afa.c), so the check of
it allows exactly 1 ulp. A row's numerators are those exponentials; `1 / sum` adds the sum's
rounding (a sum of n terms in any order: about eps * sqrt(n) relative in practice, n eps at
worst) and one of its own, so the softmax check allows 4 eps * (2 + sqrt(n)) relative per
element, which a wrong max, a lost tail or a missed key exceeds by orders of magnitude.
"""

from __future__ import annotations

import numpy as np
import pytest

from graph_autofusion.backend.cpu.contraction.shim import Library

EPS = float(np.finfo(np.float32).eps)


def _softmax(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max())
    return e / e.sum()


def test_the_exponential_is_within_one_ulp_over_its_whole_range(lib: Library) -> None:
    rng = np.random.default_rng(0)
    # the row's max is 0, so each numerator is exp(x) itself; 1 000 values per call
    xs = np.concatenate([rng.uniform(-87.0, 0.0, 40_000), -np.geomspace(1e-30, 87.0, 10_000)])
    xs = xs.astype(np.float32)
    for start in range(0, xs.size, 1000):
        x = xs[start : start + 1000]
        row = np.concatenate([[np.float32(0.0)], x]).astype(np.float32)
        lib.softmax_row(row, row.size)
        want = np.exp(x.astype(np.float64)).astype(np.float32)
        ulps = np.abs(row[1:] - want) / np.spacing(want)
        assert ulps.max() <= 1.0, f"{ulps.max():.2f} ulp at x = {x[np.argmax(ulps)]!r}"


def test_values_more_than_87_below_the_max_weigh_nothing(lib: Library) -> None:
    row = np.array([0.0, -86.9, -87.5, -200.0, -np.inf, -1e30], np.float32)
    lib.softmax_row(row, row.size)
    assert row[0] == 1.0 and 0.0 < row[1] < 1e-37
    assert np.all(row[2:] == 0.0)


@pytest.mark.parametrize("end", [1, 2, 5, 7, 8, 15, 16, 17, 31, 32, 33, 64, 127, 197, 256])
def test_a_row_is_its_softmax_with_zeros_past_its_end(lib: Library, end: int) -> None:
    rng = np.random.default_rng(end)
    x = (rng.standard_normal(end) * 6.0).astype(np.float32)
    cols = end + 9  # keys of the block past this row's end (a causal row): zeroed
    row = np.full(cols + 3, np.nan, np.float32)  # three guard floats past `cols`: untouched
    row[:end] = x
    row[end:cols] = 1234.5
    norm = lib.softmax_row(row, end, cols)
    got = row[:end].astype(np.float64) * norm
    want = _softmax(x)
    tol = 4 * EPS * (2 + np.sqrt(end)) * want
    assert np.all(np.abs(got - want) <= tol), f"worst {np.max(np.abs(got - want) / want):.3g} relative"
    assert np.all(row[end:cols] == 0.0)
    assert np.all(np.isnan(row[cols:]))


def test_masked_keys_come_out_zero_and_a_row_of_them_keeps_a_finite_max(lib: Library) -> None:
    row = np.array([1.0, -np.inf, 3.0, -np.inf, 2.0], np.float32)
    norm = lib.softmax_row(row, row.size)
    want = _softmax(np.array([1.0, 3.0, 2.0], np.float32))
    np.testing.assert_allclose(row[[0, 2, 4]] * norm, want, rtol=8 * EPS)
    assert row[1] == 0.0 and row[3] == 0.0
    # every key masked: the max stays 0 rather than -inf, so no inf - inf: numerators 0
    masked = np.full(20, -np.inf, np.float32)
    lib.softmax_row(masked, masked.size)
    assert np.all(masked == 0.0)


@pytest.mark.parametrize("at", [0, 13, 40])
def test_a_nan_score_makes_the_row_nan(lib: Library, at: int) -> None:
    row = np.linspace(-3.0, 3.0, 41).astype(np.float32)
    row[at] = np.nan
    norm = lib.softmax_row(row, row.size)
    assert np.isnan(norm) and np.isnan(row[at])
