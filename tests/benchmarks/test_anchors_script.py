"""benchmarks/anchors.py end to end on tiny shapes: it must call its kernels the way the runtime
does (it once called them with only their tensor pointers after kernels had gained a workspace and
packed weights, and crashed), agree with onnxruntime and print a table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import anchors  # noqa: E402

TINY = [
    anchors.Shape("tiny 1x1 8->16 6", "resnet", "conv", (8, 16, 6, 1, 1, 1)),
    anchors.Shape("tiny 3x3 4->8 5", "resnet", "conv", (4, 8, 5, 3, 1, 1)),
    anchors.Shape("tiny 13x24x40", "bert", "matmul", (13, 24, 40)),
    anchors.Shape("tiny 13x24x40 gelu", "bert", "matmul", (13, 24, 40), "gelu"),
    anchors.Shape("tiny 13x24x40 bias", "transformer", "matmul", (13, 24, 40), "bias"),
]


@pytest.fixture
def tiny_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(anchors, "SHAPES", TINY)


@pytest.mark.usefixtures("tiny_shapes")
def test_main_times_every_shape_through_the_runtime_and_matches_onnxruntime(
    capsys: pytest.CaptureFixture[str],
) -> None:
    anchors.main(["--threads", "1,2", "--reps", "3", "--json"])
    rows = json.loads(capsys.readouterr().out)
    assert [(r["shape"], r["threads"]) for r in rows] == [(s.name, t) for s in TINY for t in (1, 2)]
    for r in rows:
        assert r["max_abs_err"] < 1e-4, r
        assert r["ours_ms"] > 0 and r["ort_ms"] > 0 and r["gflops"] > 0 and r["peak_pct"] > 0
        assert r["method"]
        # BLAS reference only for the plain GEMMs: the 1x1 conv and the matmuls.
        assert (r["blas_ms"] is not None) == (r["shape"] != "tiny 3x3 4->8 5")


def test_the_transformer_family_has_each_models_projections() -> None:
    shapes = [s for s in anchors.SHAPES if s.family == "transformer"]
    assert {s.dims for s in shapes} == {
        (m, k, n) for m in (128, 197) for k, n in ((768, 768), (768, 2304), (768, 3072), (3072, 768))
    }
    assert {s.epilogue for s in shapes} == {"bias", "gelu"}


@pytest.mark.usefixtures("tiny_shapes")
def test_main_prints_the_table_for_one_family(capsys: pytest.CaptureFixture[str]) -> None:
    anchors.main(["--threads", "1", "--reps", "3", "--only", "bert"])
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[:2] == ["shape", "method"]
    assert [line.split()[1] for line in out[2:4]] == ["13x24x40", "13x24x40"]
    assert out[-1].startswith("threads=1: ours/ort geometric mean")
