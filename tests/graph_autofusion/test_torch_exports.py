"""Models exported by torch.onnx.export from real architectures (tests/data/torch_exports, made by
scripts/export_torch_fixtures.py) fuse and match onnxruntime — the engine is not tuned to the zoo."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

import graph_autofusion as gaf
from graph_autofusion.ops import OpKind

TRANSFORMERS = ("bert", "gpt2", "vit")
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


@pytest.mark.parametrize(
    "path", [p for p in EXPORTS if p.stem.split("_")[0] in TRANSFORMERS], ids=lambda p: p.stem
)
def test_transformer_exports_plan_their_lower_bound(path: Path) -> None:
    """One kernel per contraction or reduction, whatever exporter or attention path wrote the
    model; BERT's additive padding mask, shared by every layer, is the one kernel allowed beyond
    (it is too small a domain to recompute inside each layer's scores)."""
    model = onnx.load(path)
    fused = gaf.fuse(model, {"input_shapes": _bind(model)})
    bound = sum(1 for n in fused.plan.graph.nodes if n.kind in (OpKind.ANCHOR, OpKind.REDUCE))
    mask = any(i.name == "attention_mask" for i in model.graph.input)
    assert fused.get_kernel_count() <= bound + int(mask), fused.report()["templates"]
