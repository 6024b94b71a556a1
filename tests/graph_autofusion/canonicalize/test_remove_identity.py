"""remove_identity: Identity and inference Dropout disappear; graph output names never change."""

from __future__ import annotations

import numpy as np
from canon_helpers import assert_same_outputs, build_model, ops, random_feeds, tensor
from onnx import TensorProto, helper

from graph_autofusion.canonicalize import canonicalize
from graph_autofusion.config import FusionConfig


def test_identity_and_dropout_are_removed_and_output_names_kept():
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Identity", ["r"], ["i"]),
        helper.make_node("Dropout", ["i"], ["d"]),
        helper.make_node("Dropout", ["d", "ratio"], ["d2", "unused_mask"]),
        helper.make_node("Sigmoid", ["d2"], ["s"]),
        helper.make_node("Identity", ["s"], ["y"]),  # renames Sigmoid's output to keep 'y'
    ]
    model = build_model(
        nodes, [tensor("x", [2, 3])], [tensor("y", [2, 3])], {"ratio": np.float32(0.1)}, opset=12
    )
    result, counts = canonicalize(model, FusionConfig())

    assert ops(result) == ["Relu", "Sigmoid"]
    assert counts["remove_identity"] == 4
    assert result.graph.node[-1].output[0] == "y"
    assert [o.name for o in result.graph.output] == ["y"]
    assert_same_outputs(model, result, random_feeds(model))


def test_dropout_whose_mask_is_read_stays():
    nodes = [
        helper.make_node("Dropout", ["x"], ["d", "mask"]),
        helper.make_node("Cast", ["mask"], ["m"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["d", "m"], ["y"]),
    ]
    model = build_model(nodes, [tensor("x", [2, 3])], [tensor("y", [2, 3])])
    result, counts = canonicalize(model, FusionConfig())
    assert "Dropout" in ops(result)
    assert counts["remove_identity"] == 0
    assert_same_outputs(model, result, random_feeds(model))


def test_dropout_in_training_mode_stays():
    nodes = [helper.make_node("Dropout", ["x", "", "training"], ["y"], seed=0)]
    model = build_model(
        nodes, [tensor("x", [2, 3]), tensor("training", [], TensorProto.BOOL)], [tensor("y", [2, 3])]
    )
    result, _ = canonicalize(model, FusionConfig())
    assert ops(result) == ["Dropout"]


def test_identity_between_graph_input_and_output_stays():
    nodes = [
        helper.make_node("Identity", ["x"], ["y"]),
        helper.make_node("Relu", ["x"], ["z"]),
    ]
    model = build_model(nodes, [tensor("x", [2])], [tensor("y", [2]), tensor("z", [2])])
    result, counts = canonicalize(model, FusionConfig())
    assert ops(result) == ["Identity", "Relu"]
    assert counts["remove_identity"] == 0
    assert_same_outputs(model, result, random_feeds(model))


def test_identity_of_a_weight_is_rewired_not_copied():
    nodes = [
        helper.make_node("Identity", ["w"], ["w_alias"]),
        helper.make_node("MatMul", ["x", "w_alias"], ["y"]),
    ]
    weight = np.arange(12, dtype=np.float32).reshape(3, 4)
    model = build_model(nodes, [tensor("x", [2, 3])], [tensor("y", [2, 4])], {"w": weight})
    result, _ = canonicalize(model, FusionConfig())
    assert ops(result) == ["MatMul"]
    assert [t.name for t in result.graph.initializer] == ["w"]
    assert list(result.graph.node[0].input) == ["x", "w"]


def test_identity_chains_and_two_outputs_from_one_tensor():
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Identity", ["r"], ["a"]),
        helper.make_node("Identity", ["a"], ["y1"]),  # chain into an output: Relu now writes 'y1'
        helper.make_node("Identity", ["a"], ["y2"]),  # same tensor, second output: this copy stays
        helper.make_node("Neg", ["a"], ["z"]),
    ]
    outputs = [tensor("y1", [2]), tensor("y2", [2]), tensor("z", [2])]
    model = build_model(nodes, [tensor("x", [2])], outputs)
    result, counts = canonicalize(model, FusionConfig())
    assert counts["remove_identity"] == 2
    assert [(n.op_type, list(n.input), list(n.output)) for n in result.graph.node] == [
        ("Relu", ["x"], ["y1"]),
        ("Identity", ["y1"], ["y2"]),
        ("Neg", ["y1"], ["z"]),
    ]
    assert_same_outputs(model, result, random_feeds(model))


def test_old_opset_dropout_with_ratio_attribute_is_removed():
    nodes = [
        helper.make_node("Dropout", ["x"], ["d"], ratio=0.3),
        helper.make_node("Relu", ["d"], ["y"]),
    ]
    model = build_model(nodes, [tensor("x", [2, 3])], [tensor("y", [2, 3])], opset=10)
    result, counts = canonicalize(model, FusionConfig())
    assert ops(result) == ["Relu"]
    assert counts["remove_identity"] == 1
    assert_same_outputs(model, result, random_feeds(model))
