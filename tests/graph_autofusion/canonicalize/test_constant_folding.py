"""constant_folding: exporter shape chains collapse, huge and random results are left alone."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from canon_helpers import assert_same_outputs, build_model, ops, random_feeds, tensor
from onnx import TensorProto, helper, numpy_helper

from graph_autofusion.canonicalize import canonicalize
from graph_autofusion.config import FusionConfig


def exporter_reshape_model() -> onnx.ModelProto:
    """What torch.onnx.export emits for `x.view(x.size(0), x.size(1), 2, 4)` on x[batch, seq, 8]."""
    axes = helper.make_node("Constant", [], ["axes"], value=numpy_helper.from_array(np.array([0], np.int64)))
    nodes = [
        axes,
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "i0"], ["d0"], axis=0),
        helper.make_node("Gather", ["shape", "i1"], ["d1"], axis=0),
        helper.make_node("Unsqueeze", ["d0", "axes"], ["u0"]),
        helper.make_node("Unsqueeze", ["d1", "axes"], ["u1"]),
        helper.make_node("Concat", ["u0", "u1", "tail"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    inits = {"i0": np.array(0, np.int64), "i1": np.array(1, np.int64), "tail": np.array([2, 4], np.int64)}
    return build_model(
        nodes, [tensor("x", ["batch", "seq", 8])], [tensor("y", ["batch", "seq", 2, 4])], inits
    )


def test_shape_gather_unsqueeze_concat_chain_folds_into_a_constant_reshape():
    model = exporter_reshape_model()
    config = FusionConfig(input_shapes={"x": [3, 5, 8]})
    result, counts = canonicalize(model, config)

    assert ops(result) == ["Reshape"]
    reshape = result.graph.node[0]
    target = {t.name: numpy_helper.to_array(t) for t in result.graph.initializer}[reshape.input[1]]
    assert target.tolist() == [3, 5, 2, 4]
    assert counts["constant_folding"] == 7  # Constant, Shape, 2 Gather, 2 Unsqueeze, Concat
    assert [d.dim_value for d in result.graph.output[0].type.tensor_type.shape.dim] == [3, 5, 2, 4]
    fixed = build_model(
        exporter_reshape_model().graph.node,
        [tensor("x", [3, 5, 8])],
        [tensor("y", [3, 5, 2, 4])],
        {"i0": np.array(0, np.int64), "i1": np.array(1, np.int64), "tail": np.array([2, 4], np.int64)},
    )
    assert_same_outputs(fixed, result, random_feeds(fixed))


def test_constant_nodes_become_initializers_and_all_constant_nodes_are_evaluated():
    nodes = [
        helper.make_node("Constant", [], ["c"], value_floats=[1.0, 2.0, 3.0]),
        helper.make_node("Constant", [], ["n"], value_int=3),
        helper.make_node("Mul", ["c", "two"], ["c2"]),
        helper.make_node("Range", ["zero", "n", "one"], ["r"]),
        helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["c2", "rf"], ["bias"]),
        helper.make_node("Add", ["x", "bias"], ["y"]),
    ]
    inits = {"two": np.float32(2.0), "zero": np.int64(0), "one": np.int64(1)}
    model = build_model(nodes, [tensor("x", [2, 3])], [tensor("y", [2, 3])], inits)
    result, counts = canonicalize(model, FusionConfig())

    assert ops(result) == ["Add"]
    bias = numpy_helper.to_array(next(t for t in result.graph.initializer if t.name == "bias"))
    np.testing.assert_array_equal(bias, [2.0, 5.0, 8.0])
    assert bias.dtype == np.float32
    assert counts["constant_folding"] == 6
    assert_same_outputs(model, result, random_feeds(model))


def test_size_and_expand_of_static_tensors_fold():
    nodes = [
        helper.make_node("Size", ["x"], ["size"]),
        helper.make_node("Cast", ["size"], ["sizef"], to=TensorProto.FLOAT),
        helper.make_node(
            "ConstantOfShape", ["shape"], ["ones"], value=numpy_helper.from_array(np.ones(1, np.float32))
        ),
        helper.make_node("Expand", ["ones", "shape"], ["expanded"]),
        helper.make_node("Mul", ["expanded", "sizef"], ["scale"]),
        helper.make_node("Mul", ["x", "scale"], ["y"]),
    ]
    model = build_model(
        nodes, [tensor("x", [2, 3])], [tensor("y", [2, 3])], {"shape": np.array([2, 3], np.int64)}
    )
    result, _ = canonicalize(model, FusionConfig())
    assert ops(result) == ["Mul"]
    assert_same_outputs(model, result, random_feeds(model))


def test_huge_result_larger_than_its_inputs_is_not_folded():
    big = helper.make_node(
        "ConstantOfShape", ["shape"], ["zeros"], value=numpy_helper.from_array(np.zeros(1, np.float32))
    )
    nodes = [big, helper.make_node("Add", ["x", "zeros"], ["y"])]
    model = build_model(
        nodes,
        [tensor("x", [2049, 2049])],
        [tensor("y", [2049, 2049])],
        {"shape": np.array([2049, 2049], np.int64)},
    )
    result, counts = canonicalize(model, FusionConfig())
    assert ops(result) == ["ConstantOfShape", "Add"]
    assert counts["constant_folding_skipped"] == 1
    assert all(len(t.raw_data) < 1024 for t in result.graph.initializer)


def test_random_ops_are_never_folded():
    nodes = [
        helper.make_node("RandomNormal", [], ["noise"], shape=[2, 3], seed=1.0),
        helper.make_node("Add", ["x", "noise"], ["y"]),
    ]
    model = build_model(nodes, [tensor("x", [2, 3])], [tensor("y", [2, 3])])
    result, counts = canonicalize(model, FusionConfig())
    assert ops(result) == ["RandomNormal", "Add"]
    assert counts["constant_folding"] == 0


@pytest.mark.parametrize("opset", [11, 13])
def test_folding_follows_the_models_opset(opset: int):
    """Unsqueeze takes `axes` as an attribute before opset 13 and as an input from 13 on."""
    if opset < 13:
        unsqueeze = helper.make_node("Unsqueeze", ["d"], ["u"], axes=[0])
        inits = {"d": np.array(4, np.int64)}
    else:
        unsqueeze = helper.make_node("Unsqueeze", ["d", "axes"], ["u"])
        inits = {"d": np.array(4, np.int64), "axes": np.array([0], np.int64)}
    nodes = [unsqueeze, helper.make_node("Reshape", ["x", "u"], ["y"])]
    model = build_model(nodes, [tensor("x", [2, 2])], [tensor("y", [4])], inits, opset=opset)
    result, _ = canonicalize(model, FusionConfig())
    assert ops(result) == ["Reshape"]
    assert_same_outputs(model, result, random_feeds(model))
