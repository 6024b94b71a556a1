"""bind_shapes: symbolic input dims get values from config.input_shapes, or a precise error."""

from __future__ import annotations

import numpy as np
import pytest
from canon_helpers import build_model, tensor
from onnx import TensorProto, helper

from graph_autofusion.canonicalize import canonicalize
from graph_autofusion.config import FusionConfig
from graph_autofusion.errors import InvalidConfigError, UnboundDimensionError, UnsupportedModelError


def bert_like_inputs() -> object:
    nodes = [
        helper.make_node("Cast", ["input_ids"], ["ids_f"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["ids_f", "mask_f"], ["y"]),
    ]
    inputs = [
        tensor("input_ids", ["batch", "sequence"], TensorProto.INT64),
        tensor("attention_mask", ["batch", "sequence"], TensorProto.INT64),
    ]
    return build_model(nodes, inputs, [tensor("y", ["batch", "sequence"])])


def dims(info) -> list[int]:
    return [d.dim_value for d in info.type.tensor_type.shape.dim]


def test_symbolic_dims_are_bound_and_flow_to_every_tensor():
    config = FusionConfig(input_shapes={"input_ids": [1, 128], "attention_mask": [1, 128]})
    result, counts = canonicalize(bert_like_inputs(), config)
    assert counts["bind_shapes"] == 4
    assert [dims(i) for i in result.graph.input] == [[1, 128], [1, 128]]
    assert dims(result.graph.output[0]) == [1, 128]
    assert all(dims(v) == [1, 128] for v in result.graph.value_info)


def test_a_dim_param_bound_on_one_input_binds_the_same_name_elsewhere():
    result, counts = canonicalize(bert_like_inputs(), FusionConfig(input_shapes={"input_ids": [2, 16]}))
    assert counts["bind_shapes"] == 4
    assert dims(result.graph.input[1]) == [2, 16]


def test_unbound_dimension_names_the_input_and_the_dim_param():
    model = build_model(
        [helper.make_node("Relu", ["x"], ["y"])], [tensor("x", ["batch", 8])], [tensor("y", ["batch", 8])]
    )
    with pytest.raises(UnboundDimensionError) as info:
        canonicalize(model, FusionConfig())
    assert info.value.code == "unbound_dimension"
    assert "input 'x' dimension 0 ('batch') is symbolic" in info.value.message
    assert "input_shapes={'x': [<batch>, 8]}" in info.value.message


def test_unknown_rank_is_unbound():
    model = build_model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", None)], [tensor("y", None)])
    with pytest.raises(UnboundDimensionError, match="unknown rank"):
        canonicalize(model, FusionConfig())
    result, _ = canonicalize(model, FusionConfig(input_shapes={"x": [3, 2]}))
    assert dims(result.graph.output[0]) == [3, 2]


@pytest.mark.parametrize(
    ("shapes", "fragment"),
    [
        ({"input_idz": [1, 128]}, "not an input of the model"),
        ({"input_ids": [1, 128, 1]}, "has rank 3, but the input has rank 2"),
        ({"input_ids": [1, 128], "attention_mask": [2, 128]}, "the model declares them the same size"),
    ],
)
def test_bad_input_shapes_are_config_errors(shapes: dict[str, list[int]], fragment: str):
    with pytest.raises(InvalidConfigError) as info:
        canonicalize(bert_like_inputs(), FusionConfig(input_shapes=shapes))
    assert info.value.code == "invalid_input_shapes"
    assert fragment in info.value.message


def test_a_value_conflicting_with_a_static_dim_is_a_config_error():
    model = build_model(
        [helper.make_node("Relu", ["x"], ["y"])], [tensor("x", ["batch", 8])], [tensor("y", None)]
    )
    with pytest.raises(InvalidConfigError, match="fixes it at 8") as info:
        canonicalize(model, FusionConfig(input_shapes={"x": [1, 9]}))
    assert info.value.code == "invalid_input_shapes"


def test_non_tensor_inputs_are_unsupported():
    sequence = helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, [2])
    nodes = [helper.make_node("SequenceAt", ["seq", "zero"], ["y"])]
    model = build_model(nodes, [sequence], [tensor("y", [2])], {"zero": np.int64(0)})
    with pytest.raises(UnsupportedModelError) as info:
        canonicalize(model, FusionConfig())
    assert info.value.code == "unsupported_input"
