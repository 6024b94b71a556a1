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


def _in_a_fresh_process(code: str, **env: str) -> str:
    """Run `code` with benchmarks/ importable in a new interpreter: the ISA variables are read once
    per process (OpenVINO's oneDNN at its first kernel), so a cap set here would not hold."""
    import os
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(REPO / 'benchmarks')!r})\n{code}"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_the_avx2_cap_reaches_openvinos_kernels() -> None:
    """`--avx2` caps OpenVINO by oneDNN's variable, and the probe tells the two apart: on an
    AVX-512 host the uncapped probe names avx512 kernels, the capped one avx2 kernels only."""
    pytest.importorskip("openvino", reason="OpenVINO comes with the bench extra: pip install -e '.[bench]'")
    from graph_autofusion.backend.cpu.isa import host_isa

    probe = (
        "import runtime_speed as r\n{}"
        "times = r.openvino_isa_times(*r.isa_probe_model(), threads=1)\n"
        "print(','.join(sorted(isa for isa, ms in times.items() if isa != 'other' and ms > 0)))"
    )
    capped = _in_a_fresh_process(probe.format("r.cap_at_avx2()\n")).split()[-1].split(",")
    assert capped == ["avx2"]
    if host_isa().level >= 4:
        assert "avx512" in _in_a_fresh_process(probe.format("")).split()[-1].split(",")


def test_an_avx2_run_builds_our_kernels_for_x86_64_v3() -> None:
    out = _in_a_fresh_process(
        "import runtime_speed\n"
        "runtime_speed.main(['--models', 'mlp', '--reps', '3', '--small', '--avx2', '--json'])",
        AUTOFUSION_ISA="",
    )
    (row,) = json.loads(out)
    assert row["avx2_cap"] is True
    if row.get("openvino_ms") is not None:  # the share of OpenVINO's time the cap does not reach
        assert 0.0 <= row["openvino_uncapped_share"] <= 1.0
    built = row["host"].rsplit("(", 1)[-1]  # "kernels built for x86-64-v3)" or, on an AVX2 host, "... it)"
    assert built == "kernels built for x86-64-v3)" or "ISA x86-64-v3 (kernels built for it)" in row["host"]
    assert row["fused_ms"] > 0


def test_a_dynamo_style_run_measures_the_dynamo_exports_graph(capsys: pytest.CaptureFixture[str]) -> None:
    from graph_autofusion import zoo

    runtime_speed.main(["--models", "bert_base", "--reps", "3", "--small", "--style", "dynamo", "--json"])
    (row,) = json.loads(capsys.readouterr().out)
    small = runtime_speed.SMALL["bert_base"]
    assert row["style"] == "dynamo"
    assert row["onnx_nodes"] == len(zoo.build("bert_base", style="dynamo", **small).graph.node)
    assert row["onnx_nodes"] != len(zoo.build("bert_base", **small).graph.node)
