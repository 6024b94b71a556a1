"""shape_inference: every tensor ends with a static shape — from ONNX, from onnxruntime, or an error."""

from __future__ import annotations

import numpy as np
import pytest
from canon_helpers import assert_same_outputs, build_model, random_feeds, tensor
from onnx import TensorProto, helper

from graph_autofusion.canonicalize import canonicalize
from graph_autofusion.canonicalize._graph import WorkGraph
from graph_autofusion.canonicalize.shape_inference import infer_node
from graph_autofusion.config import FusionConfig
from graph_autofusion.errors import InvalidModelError, UnsupportedModelError
from graph_autofusion.onnx_utils import static_shape


def test_every_intermediate_gets_a_static_value_info():
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Transpose", ["h"], ["t"], perm=[1, 0]),
        helper.make_node("ReduceSum", ["t", "axes"], ["s"], keepdims=0),
        helper.make_node("Unsqueeze", ["s", "axes"], ["y"]),
    ]
    inits = {"w": np.ones((4, 5), np.float32), "axes": np.array([1], np.int64)}
    model = build_model(nodes, [tensor("x", ["n", 4])], [tensor("y", None)], inits)
    result, counts = canonicalize(model, FusionConfig(input_shapes={"x": [3, 4]}))
    shapes = {v.name: static_shape(v.type) for v in result.graph.value_info}
    assert shapes == {"h": (3, 5), "t": (5, 3), "s": (5,)}
    assert static_shape(result.graph.output[0].type) == (5, 1)
    assert all(v.type.tensor_type.elem_type == TensorProto.FLOAT for v in result.graph.value_info)
    assert counts["shape_inference"] >= 1


def test_op_without_schema_gets_its_shape_from_onnxruntime():
    # com.microsoft.Gelu has no ONNX schema, so ONNX inference cannot type its output.
    nodes = [
        helper.make_node("Gelu", ["x"], ["g"], domain="com.microsoft"),
        helper.make_node("Relu", ["g"], ["y"]),
    ]
    model = build_model(nodes, [tensor("x", [2, 3])], [tensor("y", None)])
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    result, counts = canonicalize(model, FusionConfig())
    assert counts["shape_fallback"] >= 1
    assert {v.name: static_shape(v.type) for v in result.graph.value_info} == {"g": (2, 3)}
    assert static_shape(result.graph.output[0].type) == (2, 3)
    assert_same_outputs(model, result, random_feeds(model))


def test_data_dependent_shape_is_refused_naming_the_tensor():
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Cast", ["nz"], ["y"], to=1)]
    model = build_model(nodes, [tensor("x", [4])], [tensor("y", None)])
    with pytest.raises(UnsupportedModelError) as info:
        canonicalize(model, FusionConfig())
    assert info.value.code == "unknown_shape"
    assert "'nz'" in info.value.message


def test_shapes_that_contradict_the_declared_output_are_refused():
    model = build_model(
        [helper.make_node("Relu", ["x"], ["y"])], [tensor("x", [2, 3])], [tensor("y", [2, 4])]
    )
    with pytest.raises(InvalidModelError) as info:
        canonicalize(model, FusionConfig())
    assert info.value.code == "invalid_graph"


def test_infer_node_types_a_slice_from_constant_ends_and_skips_unknown_inputs():
    nodes = [
        helper.make_node("Slice", ["x", "starts", "ends"], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
        helper.make_node("Relu", ["unknown"], ["z"]),
    ]
    inits = {"starts": np.array([1], np.int64), "ends": np.array([3], np.int64)}
    work = WorkGraph(build_model(nodes, [tensor("x", [4, 2])], [tensor("y", None)], inits))
    assert infer_node(work, nodes[0]) == 1
    assert static_shape(work.types["s"]) == (2, 2)
    assert infer_node(work, nodes[0]) == 0  # already typed
    assert infer_node(work, nodes[1]) == 1 and static_shape(work.types["y"]) == (2, 2)
    assert infer_node(work, nodes[2]) == 0 and "z" not in work.types
