"""Every zoo model (small configurations, both exporter styles) fuses, passes the full ONNX
checker, and runs in onnxruntime with the original model's outputs (fp32: rtol = atol = 1e-5)."""

from __future__ import annotations

import json

import onnx
import pytest

import graph_autofusion as gaf

SMALL = gaf.zoo.TINY
CASES = [(name, style) for name in SMALL for style in ("torchscript", "dynamo")]


@pytest.mark.parametrize(("name", "style"), CASES)
def test_zoo_model_fuses_and_matches_onnxruntime(name: str, style: str) -> None:
    model = gaf.zoo.build(name, style=style, **SMALL[name])
    fused = gaf.fuse(model)
    onnx.checker.check_model(fused.model, full_check=True)
    report = fused.report()
    assert report["kernels"]["after"] < report["kernels"]["before"]
    assert fused.get_fusion_count() == sum(
        1 for n in fused.model.graph.node if n.domain == "ai.graph_autofusion"
    )
    assert report["estimates"]["bytes_moved"]["after"] < report["estimates"]["bytes_moved"]["before"]
    assert report["estimates"]["latency_us"]["after"] < report["estimates"]["latency_us"]["before"]
    assert (
        report["estimates"]["peak_memory_bytes"]["after"]
        <= report["estimates"]["peak_memory_bytes"]["before"]
    )
    result = fused.verify(runner="onnxruntime")
    assert result.passed, result.to_dict()
    json.dumps(report)  # serializable as is


def test_fused_graph_surface(tmp_path) -> None:
    fused = gaf.fuse(gaf.zoo.build("bert_base", **SMALL["bert_base"]))
    assert fused.get_operator_count() == fused.report()["operators"]["canonical"]
    assert fused.get_kernel_count() == fused.report()["kernels"]["after"]
    path = fused.save(tmp_path / "fused.onnx")
    again = onnx.load(path)
    assert again.functions and {f.domain for f in again.functions} == {"ai.graph_autofusion"}
    for fn in again.functions:
        meta = json.loads(fn.doc_string)
        assert meta["template"] in {"pointwise", "reduction", "anchor", "anchor_chain", "pool", "attention"}
    assert "kernels=" in repr(fused)


def test_repeated_layers_share_functions() -> None:
    fused = gaf.fuse(gaf.zoo.build("bert_base", **{**SMALL["bert_base"], "num_layers": 3}))
    calls = sum(1 for n in fused.model.graph.node if n.domain == "ai.graph_autofusion")
    assert len(fused.model.functions) < calls


def test_symbolic_dims_bound_from_input_shapes() -> None:
    model = gaf.zoo.build("bert_base", dynamic_batch=True, **SMALL["bert_base"])
    with pytest.raises(gaf.UnboundDimensionError) as err:
        gaf.fuse(model)
    assert "batch" in err.value.message
    fused = gaf.fuse(model, {"input_shapes": {"input_ids": [2, 16], "attention_mask": [2, 16]}})
    assert fused.verify(runner="onnxruntime").passed


def test_fuser_config_mirrors_classic_api() -> None:
    fuser = gaf.Fuser()
    fuser.config.enable_auto_fusion = False
    fuser.config.enable_pattern_matching = False
    fuser.config.enable_cost_model = False
    fuser.config.cost_model = "latency"
    fused = fuser.fuse(gaf.zoo.build("mlp"))
    assert fused.get_fusion_count() == 0
    with pytest.raises(ValueError):
        fuser.config.cost_model = "fastest"


def test_bad_config_is_a_fusion_error() -> None:
    with pytest.raises(gaf.InvalidConfigError) as err:
        gaf.fuse(gaf.zoo.build("mlp"), {"max_fusion_size": -1})
    assert err.value.code == "invalid_config"


def test_progress_reports_stages() -> None:
    seen: list[str] = []
    gaf.fuse(gaf.zoo.build("mlp"), progress=lambda stage, done, total: seen.append(stage))
    assert seen == ["loading", "canonicalizing", "planning", "exporting"]
