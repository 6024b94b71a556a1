"""Models exported by torch.onnx.export from real architectures (tests/data/torch_exports, made by
scripts/export_torch_fixtures.py) fuse and match onnxruntime — the engine is not tuned to the zoo."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

import graph_autofusion as gaf

EXPORTS = sorted((Path(__file__).resolve().parents[1] / "data" / "torch_exports").glob("*.onnx"))


def _bind(model: onnx.ModelProto) -> dict[str, list[int]]:
    return {
        vi.name: [d.dim_value if d.HasField("dim_value") else 2 for d in vi.type.tensor_type.shape.dim]
        for vi in model.graph.input
    }


def test_fixtures_present() -> None:
    assert len(EXPORTS) >= 12


@pytest.mark.parametrize("path", EXPORTS, ids=lambda p: p.stem)
def test_torch_export_fuses_and_matches(path: Path) -> None:
    model = onnx.load(path)
    fused = gaf.fuse(model, {"input_shapes": _bind(model)})
    onnx.checker.check_model(fused.model, full_check=True)
    report = fused.report()
    assert report["kernels"]["after"] < report["kernels"]["before"]
    result = fused.verify(runner="onnxruntime")
    assert result.passed, result.to_dict()
