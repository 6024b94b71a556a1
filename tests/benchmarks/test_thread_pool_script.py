"""benchmarks/thread_pool.py end to end on the small MLP: each mode's children must really run
their kernels on what they were asked for (the script checks the model's `thread_pool` stat and
stops otherwise), and the table must carry both modes with a ratio to onnxruntime."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import thread_pool  # noqa: E402


def test_both_modes_are_measured_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    thread_pool.main(["--models", "mlp", "--pairs", "1", "--reps", "3", "--small"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("host: ")
    rows = {line.split()[1]: line.split() for line in lines if line.startswith("mlp ")}
    assert set(rows) == set(thread_pool.MODES)
    for cells in rows.values():
        fused, peer, ratio = (float(c) for c in cells[2:5])
        assert fused > 0 and peer > 0 and ratio == pytest.approx(fused / peer, rel=0.06, abs=0.01)


def test_the_paced_mode_runs_end_to_end(capsys: pytest.CaptureFixture[str]) -> None:
    thread_pool.main(["--models", "mlp", "--pairs", "1", "--reps", "3", "--small", "--pace-ms", "2"])
    lines = capsys.readouterr().out.splitlines()
    assert "each call 2 ms after the last" in lines[1]
    assert {line.split()[1] for line in lines if line.startswith("mlp ")} == set(thread_pool.MODES)
