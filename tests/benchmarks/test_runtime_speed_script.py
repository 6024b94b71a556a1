"""benchmarks/runtime_speed.py: the rounds keep every timed call of every contender, and the table
carries the ratios of the medians and of the fastest runs, each computed from its own columns."""

from __future__ import annotations

import itertools
import json
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import runtime_speed  # noqa: E402


def test_block_times_keep_each_contenders_calls_apart() -> None:
    def sleeper(seconds: float):  # type: ignore[no-untyped-def]
        return lambda: time.sleep(seconds)

    times = runtime_speed.block_times({"slow": sleeper(0.004), "fast": sleeper(0.001)}, reps=6, rounds=2)
    assert set(times) == {"slow", "fast"}
    for values in times.values():
        assert len(values) >= 6  # 3 a round, more while a block lasts under MIN_BLOCK_SECONDS
    assert min(times["slow"]) >= 4.0 and min(times["fast"]) >= 1.0
    assert min(times["slow"]) > min(times["fast"])
    medians = runtime_speed.block_medians({"slow": sleeper(0.004), "fast": sleeper(0.001)}, reps=6, rounds=2)
    assert medians["slow"] > medians["fast"] >= 1.0


def test_every_block_starts_after_a_quiet_pause() -> None:
    # the previous contender's idle threads stop spinning before the next block: 2 rounds x 2
    # contenders x 0.1 s of pauses, none of it in the timed calls
    began = time.perf_counter()
    times = runtime_speed.block_times({"a": lambda: None, "b": lambda: None}, reps=2, rounds=2, settle=0.1)
    assert time.perf_counter() - began >= 0.4
    assert max(max(v) for v in times.values()) < 50.0
    assert runtime_speed.SETTLE_SECONDS >= 0.1


def test_the_mlp_row_has_the_fastest_runs_ratios(capsys: pytest.CaptureFixture[str]) -> None:
    runtime_speed.main(["--models", "mlp", "--reps", "3", "--small", "--json"])
    (row,) = json.loads(capsys.readouterr().out)
    assert row["fused_fastest_ms"] <= row["fused_ms"]
    assert row["ort_enable_all_fastest_ms"] <= row["ort_enable_all_ms"]
    # the row's latencies are rounded to the microsecond, the ratio is not
    fused, peer = row["fused_fastest_ms"], row["ort_enable_all_fastest_ms"]
    rounding = (0.0005 / fused + 0.0005 / peer) * fused / peer
    assert row["fastest_fused_vs_ort_enable_all"] == pytest.approx(fused / peer, abs=rounding + 0.001)
    line = runtime_speed.format_row(row)
    cells = line.split()
    assert cells[0] == "mlp"
    # the columns after the five latencies: f/unf, f/ort, f/ov, min f/ort, min f/ov
    assert float(cells[7]) == pytest.approx(row["fused_vs_ort_enable_all"], abs=0.006)
    assert float(cells[9]) == pytest.approx(row["fastest_fused_vs_ort_enable_all"], abs=0.006)


def test_paced_blocks_wait_before_each_call() -> None:
    """`pace`: every call of a block (its untimed first one aside) comes after the pause, and the
    times are the calls' own, not the pause's."""
    calls: list[float] = []

    def run() -> None:
        calls.append(time.perf_counter())

    times = runtime_speed.block_times({"a": run, "b": run}, reps=6, rounds=2, settle=0.02, pace=0.02)
    assert len(calls) == 2 * 2 * (1 + 3)  # rounds x runners x (untimed first + timed calls)
    assert all(b - a >= 0.02 for a, b in itertools.pairwise(calls))
    assert {k: len(v) for k, v in times.items()} == {"a": 6, "b": 6}
    assert all(0 <= t < 20 for v in times.values() for t in v)
