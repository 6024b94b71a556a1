"""canonicalize end to end: real exporter output and zoo models compute the same after it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from canon_helpers import ORT_IR_VERSION, assert_same_outputs, build_model, random_feeds, tensor
from onnx import TensorProto, helper

from graph_autofusion.canonicalize import PASS_NAMES, canonicalize
from graph_autofusion.config import FusionConfig
from graph_autofusion.loader import load_model
from graph_autofusion.onnx_utils import static_shape

EXPORTS = Path(__file__).resolve().parents[2] / "data" / "torch_exports"


def bind_all(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Shapes for every input: [2, 16] for token ids and masks, the declared dims (batch 2) otherwise."""
    shapes = {}
    for info in model.graph.input:
        declared = [d.dim_value for d in info.type.tensor_type.shape.dim]
        if info.type.tensor_type.elem_type == TensorProto.INT64:
            shapes[info.name] = [2, 16]
        else:
            shapes[info.name] = [2, *declared[1:]]
    return shapes


def with_static_inputs(model: onnx.ModelProto, shapes: dict[str, list[int]]) -> onnx.ModelProto:
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for info in fixed.graph.input:
        if info.name in shapes:
            for dim, value in zip(info.type.tensor_type.shape.dim, shapes[info.name], strict=True):
                dim.dim_value = value
    fixed.ir_version = min(fixed.ir_version, ORT_IR_VERSION)
    return fixed


def check_canonical(result: onnx.ModelProto) -> None:
    onnx.checker.check_model(result, full_check=True)
    graph = result.graph
    assert all(n.op_type != "Constant" for n in graph.node)
    assert all(n.name for n in graph.node) and len({n.name for n in graph.node}) == len(graph.node)
    typed = {v.name: v.type for v in list(graph.value_info) + list(graph.output)}
    for node in graph.node:
        for name in node.output:
            assert static_shape(typed[name]) is not None, name


@pytest.mark.parametrize("path", sorted(EXPORTS.glob("*.onnx")), ids=lambda p: p.stem)
def test_torch_exports_are_canonical_and_unchanged(path: Path):
    source = onnx.load(path)
    shapes = bind_all(source)
    config = FusionConfig(input_shapes=shapes)
    result, counts = canonicalize(load_model(path, config), config)
    assert set(counts) == set(PASS_NAMES)
    check_canonical(result)
    reference = with_static_inputs(source, shapes)
    assert_same_outputs(reference, result, random_feeds(reference), rtol=1e-4, atol=1e-5)
    if "dynamic" in path.stem or "torchscript" in path.stem:
        assert not any(n.op_type in ("Shape", "Constant") for n in result.graph.node)


SMALL_ZOO = {
    "bert_base": {"num_layers": 2, "hidden": 32, "heads": 4, "seq_len": 8, "vocab": 64, "max_positions": 16},
    "gpt2": {"num_layers": 2, "hidden": 32, "heads": 4, "seq_len": 8, "vocab": 64, "max_positions": 16},
    "resnet50": {"image_size": 32, "width": 8, "layers": (1, 1, 1, 1), "num_classes": 10},
    "mobilenet_v2": {"width_mult": 0.25, "image_size": 32, "num_classes": 10},
    "vit_b16": {"image_size": 32, "patch": 8, "num_layers": 2, "hidden": 32, "heads": 4, "num_classes": 10},
    "mlp": {"in_features": 16, "hidden": (8,), "num_classes": 4},
}


@pytest.mark.parametrize("style", ["torchscript", "dynamo"])
@pytest.mark.parametrize("name", sorted(SMALL_ZOO))
def test_small_zoo_models_are_unchanged(name: str, style: str):
    zoo = pytest.importorskip("graph_autofusion.zoo")
    source = zoo.build(name, style=style, dynamic_batch=True, **SMALL_ZOO[name])
    shapes = {
        i.name: [2, *[d.dim_value for d in i.type.tensor_type.shape.dim][1:]] for i in source.graph.input
    }
    if name in ("bert_base", "gpt2"):
        shapes = {key: [2, 8] for key in shapes}
    config = FusionConfig(input_shapes=shapes)
    result, counts = canonicalize(load_model(source.SerializeToString(), config), config)
    check_canonical(result)
    if name in ("resnet50", "mobilenet_v2"):
        assert counts["fold_batchnorm"] > 0
        assert all(n.op_type != "BatchNormalization" for n in result.graph.node)
    reference = with_static_inputs(source, shapes)
    assert_same_outputs(reference, result, random_feeds(reference), rtol=1e-4, atol=1e-4)


def test_input_model_is_not_modified_and_result_is_new():
    nodes = [helper.make_node("Identity", ["x"], ["i"]), helper.make_node("Relu", ["i"], ["y"])]
    model = build_model(nodes, [tensor("x", ["batch", 3])], [tensor("y", ["batch", 3])])
    before = model.SerializeToString()
    result, _ = canonicalize(model, FusionConfig(input_shapes={"x": [2, 3]}))
    assert model.SerializeToString() == before
    assert result is not model and [n.op_type for n in result.graph.node] == ["Relu"]


def test_if_subgraphs_stay_opaque_and_outer_references_survive():
    then_graph = helper.make_graph(
        [helper.make_node("Relu", ["h"], ["t"])], "then", [], [tensor("t", [2, 3])]
    )
    else_graph = helper.make_graph([helper.make_node("Neg", ["h"], ["e"])], "else", [], [tensor("e", [2, 3])])
    nodes = [
        helper.make_node("Identity", ["x"], ["h"]),  # read only inside the branches
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["cond"]),
        helper.make_node("If", ["cond"], ["y"], then_branch=then_graph, else_branch=else_graph),
    ]
    model = build_model(nodes, [tensor("x", [2, 3])], [tensor("y", [2, 3])], {"zero": np.float32(0)})
    config = FusionConfig()
    result, counts = canonicalize(load_model(model, config), config)
    assert counts["remove_identity"] == 1
    assert [n.op_type for n in result.graph.node] == ["ReduceSum", "Greater", "If"]
    check_canonical(result)
    feeds = random_feeds(model)
    assert_same_outputs(model, result, feeds)
    assert_same_outputs(model, result, {"x": -np.abs(feeds["x"])})


def overridable_weight_model(ir_version: int) -> onnx.ModelProto:
    nodes = [helper.make_node("Transpose", ["w"], ["wt"]), helper.make_node("MatMul", ["x", "wt"], ["y"])]
    model = build_model(
        nodes,
        [tensor("x", [2, 3]), tensor("w", [3, 3])],
        [tensor("y", [2, 3])],
        {"w": np.arange(9, dtype=np.float32).reshape(3, 3)},
        opset=8 if ir_version < 4 else 17,
    )
    model.ir_version = ir_version
    return model


def test_initializer_listed_as_input_is_overridable_and_not_folded():
    model = overridable_weight_model(ir_version=8)
    result, counts = canonicalize(model, FusionConfig())
    assert [n.op_type for n in result.graph.node] == ["Transpose", "MatMul"]
    assert [i.name for i in result.graph.input] == ["x", "w"]
    assert counts["constant_folding"] == 0


def test_before_ir4_initializers_in_inputs_are_constants():
    model = overridable_weight_model(ir_version=3)
    result, counts = canonicalize(model, FusionConfig())
    assert [n.op_type for n in result.graph.node] == ["MatMul"]
    assert [i.name for i in result.graph.input] == ["x"]
    assert result.ir_version == 8  # at least 4 for the weights; 8 because opset 8 is raised to 18
    assert counts["constant_folding"] == 1
    feeds = random_feeds(result)
    assert_same_outputs(model, result, {**feeds})


@pytest.mark.slow
def test_full_size_bert_canonicalizes_in_seconds():
    import time

    zoo = pytest.importorskip("graph_autofusion.zoo")
    source = zoo.build("bert_base", style="torchscript", dynamic_batch=True)
    config = FusionConfig(input_shapes={"input_ids": [1, 128], "attention_mask": [1, 128]})
    loaded = load_model(source, config)
    start = time.perf_counter()
    result, counts = canonicalize(loaded, config)
    elapsed = time.perf_counter() - start
    assert not any(n.op_type in ("Shape", "Constant", "Concat") for n in result.graph.node)
    assert counts["constant_folding"] > 0
    assert elapsed < 10, f"canonicalize took {elapsed:.1f} s"  # ~0.5 s measured; generous for busy CI


SHAPE_OPS = ("Shape", "Size", "ConstantOfShape", "Range")


def shape_chain_model(depth: int) -> onnx.ModelProto:
    """`depth` blocks of y = Slice(x, 0, Shape(x)) + 1: each Slice's ends are known only once the
    Shape before it folds, and ONNX inference reads Slice ends from initializers alone."""
    nodes, current = [], "x"
    for i in range(depth):
        nodes += [
            helper.make_node("Shape", [current], [f"shape{i}"]),
            helper.make_node("Slice", [current, "starts", f"shape{i}"], [f"slice{i}"]),
            helper.make_node("Add", [f"slice{i}", "one"], [f"y{i}"]),
        ]
        current = f"y{i}"
    nodes.append(helper.make_node("Relu", [current], ["y"]))
    inits = {"starts": np.zeros(2, np.int64), "one": np.float32(1)}
    return build_model(nodes, [tensor("x", ["n", 3])], [tensor("y", None)], inits)


@pytest.mark.parametrize("depth", [2, 24])
def test_deep_shape_chains_fold_in_as_many_inference_runs_as_shallow_ones(depth: int):
    model = shape_chain_model(depth)
    config = FusionConfig(input_shapes={"x": [2, 3]})
    result, counts = canonicalize(model, config)
    check_canonical(result)
    assert [n.op_type for n in result.graph.node] == ["Slice", "Add"] * depth + ["Relu"]
    assert counts["shape_fallback"] == 0
    assert counts["shape_inference"] == canonicalize(shape_chain_model(1), config)[1]["shape_inference"]
    feeds = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}
    assert_same_outputs(with_static_inputs(model, {"x": [2, 3]}), result, feeds)


def test_twelve_layer_gpt2_folds_every_shape_op_without_onnxruntime():
    # With a cap on fold/infer rounds, layers past the cap kept their Shape ops and every tensor
    # after them went to the onnxruntime fallback (seconds at full size).
    zoo = pytest.importorskip("graph_autofusion.zoo")
    source = zoo.build("gpt2", num_layers=12, hidden=32, heads=2, seq_len=8, vocab=50)
    config = FusionConfig()
    result, counts = canonicalize(load_model(source, config), config)
    check_canonical(result)
    assert not [n.op_type for n in result.graph.node if n.op_type in SHAPE_OPS]
    assert counts["shape_fallback"] == 0
    assert_same_outputs(with_static_inputs(source, {}), result, random_feeds(source), rtol=1e-4, atol=1e-4)
