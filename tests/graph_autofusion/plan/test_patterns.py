"""Built-in patterns apply on the shapes they name; user patterns (Python and JSON) apply too."""

from __future__ import annotations

import json

import numpy as np
from graphs import model, node

import graph_autofusion as gaf
from graph_autofusion import FusionConfig, Pattern


def add_relu_model():
    return model(
        [
            node("Add", ["x", "b"], ["s"], "add"),
            node("Relu", ["s"], ["r"], "relu"),
            node("Hardmax", ["r"], ["h"], "hm"),
            node("Mul", ["h", "x"], ["y"], "mul"),
        ],
        [("x", [4, 8])],
        ["y"],
        inits=[("b", np.ones(8, dtype=np.float32))],
    )


class AddRelu(Pattern):
    name = "add_relu"
    description = "bias add followed by relu"

    def match(self, graph):
        return [[a.name, r.name] for a, r in graph.chains(["Add", "Relu"])]


def test_python_pattern_applies() -> None:
    fuser = gaf.Fuser()
    fuser.config.enable_auto_fusion = False
    fuser.config.disabled_patterns = ["pointwise_chain"]
    fuser.register_pattern(AddRelu())
    fused = fuser.fuse(add_relu_model())
    report = fused.report()
    assert report["patterns"]["add_relu"] == {"matched": 1, "applied": 1, "refused": 0}
    (group,) = report["groups"]
    assert group["pattern"] == "add_relu" and group["members"] == ["add", "relu"]
    assert fused.verify(runner="onnxruntime").passed


def test_json_pattern_applies_through_config() -> None:
    spec = {"name": "add_relu_json", "sequence": [{"op": "Add", "shape": {"rank": 2}}, {"op": "Relu"}]}
    config = FusionConfig.model_validate(
        {"patterns": [spec], "enable_auto_fusion": False, "disabled_patterns": ["pointwise_chain"]}
    )
    fused = gaf.fuse(add_relu_model(), json.loads(config.model_dump_json()))
    assert fused.report()["patterns"]["add_relu_json"]["applied"] == 1
    assert fused.get_fusion_count() == 1


def test_json_pattern_constraints_filter_matches() -> None:
    spec = {"name": "rank3_only", "sequence": [{"op": "Add", "shape": {"rank": 3}}, {"op": "Relu"}]}
    fused = gaf.fuse(
        add_relu_model(),
        {"patterns": [spec], "enable_auto_fusion": False, "disabled_patterns": ["pointwise_chain"]},
    )
    assert fused.report()["patterns"]["rank3_only"]["matched"] == 0


def test_illegal_user_pattern_gets_a_reason_not_a_broken_graph() -> None:
    class Greedy(Pattern):
        name = "greedy"

        def match(self, graph):
            return [[n.name for n in graph]]  # includes the opaque Hardmax

    fused = gaf.fuse(add_relu_model(), {"enable_auto_fusion": False}, patterns=[Greedy()])
    refused = [r for r in fused.report()["refused"] if r["source"] == "pattern:greedy"]
    assert refused and refused[0]["code"] == "NF010"
    assert fused.verify(runner="onnxruntime").passed


def test_builtin_patterns_are_named_and_can_be_disabled() -> None:
    from graph_autofusion.plan import builtin_patterns

    names = [p.label() for p in builtin_patterns()]
    for wanted in (
        "pointwise_chain",
        "conv_epilogue",
        "matmul_epilogue",
        "matmul_chain",
        "reduction_fusion",
        "layer_norm",
        "softmax",
        "gelu",
    ):
        assert wanted in names
    assert all(p.description for p in builtin_patterns())


def test_transformer_patterns_apply_on_bert() -> None:
    m = gaf.zoo.build("bert_base", num_layers=1, hidden=64, heads=2, seq_len=16, vocab=100, opset=14)
    patterns = gaf.fuse(m).report()["patterns"]
    # the Softmax sits inside the attention kernel (formed for the cpu profile too)
    for name in ("layer_norm", "attention", "gelu", "matmul_epilogue"):
        assert patterns[name]["applied"] >= 1, (name, patterns[name])
    patterns = gaf.fuse(m, gaf.FusionConfig(disabled_patterns=["attention"])).report()["patterns"]
    assert patterns["softmax"]["applied"] >= 1, patterns["softmax"]


def test_conv_patterns_apply_on_resnet() -> None:
    m = gaf.zoo.build("resnet50", image_size=32, width=8)
    report = gaf.fuse(m).report()
    assert report["patterns"]["conv_epilogue"]["applied"] >= 10
    assert report["canonicalize"]["fold_batchnorm"] >= 10


def test_cheap_producers_are_recomputed_in_each_reader_and_still_match() -> None:
    # A small broadcast producer read by two softmax kernels runs inside each of them.
    m = model(
        [
            node("Mul", ["mask", "two"], ["p"], "producer"),
            node("Add", ["x1", "p"], ["a1"], "add1"),
            node("Softmax", ["a1"], ["y1"], "softmax1", axis=-1),
            node("Add", ["x2", "p"], ["a2"], "add2"),
            node("Softmax", ["a2"], ["y2"], "softmax2", axis=-1),
        ],
        [("mask", [1, 16]), ("x1", [2, 16]), ("x2", [2, 16])],
        ["y1", "y2"],
        inits=[("two", np.array(2.0, dtype=np.float32))],
    )
    fused = gaf.fuse(m)
    report = fused.report()
    assert report["patterns"]["recompute"]["applied"] == 1
    assert fused.get_kernel_count() == 2
    assert all("producer" in g["members"] for g in report["groups"])
    assert fused.verify().passed  # the generated kernels, not just onnxruntime
    assert fused.verify(runner="onnxruntime").passed


def test_broadcast_producers_are_not_recomputed_over_much_larger_domains() -> None:
    # BERT's attention mask ([B, S]) would be recomputed H·S times per softmax element.
    m = gaf.zoo.build("bert_base", num_layers=2, hidden=64, heads=2, seq_len=16, vocab=100)
    report = gaf.fuse(m).report()
    assert "recompute" not in report["patterns"]
    assert any(
        g["op_types"][:1] == ["Gather"] and "LayerNormalization" in g["op_types"] for g in report["groups"]
    )
