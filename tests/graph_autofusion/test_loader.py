"""load_model: every refusal has its stable code; good models come back sorted and checked."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import set_external_data

from graph_autofusion.config import FusionConfig
from graph_autofusion.errors import (
    FusionError,
    InvalidModelError,
    ModelTooLargeError,
    UnsupportedModelError,
)
from graph_autofusion.loader import load_model

CONFIG = FusionConfig()


def small_model(opset: int = 17, nodes: list[onnx.NodeProto] | None = None) -> onnx.ModelProto:
    nodes = nodes or [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Relu", ["h"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(4, 4), "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def refusal(source: object, config: FusionConfig = CONFIG) -> FusionError:
    with pytest.raises(FusionError) as info:
        load_model(source, config)
    assert info.value.message.strip()
    return info.value


def test_bytes_path_and_proto_load_alike(tmp_path: Path):
    model = small_model()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    assert load_model(model, CONFIG) is model  # nothing to fix: not copied
    for source in (model.SerializeToString(), path, str(path)):
        loaded = load_model(source, CONFIG)
        assert [n.name for n in loaded.graph.node] == ["mm", "relu"]


@pytest.mark.parametrize("data", [b"", b"hello world, not a model", b"\x08\x07", b"\xff\xff\xff\xff"])
def test_non_onnx_bytes_are_not_onnx(data: bytes):
    error = refusal(data)
    assert isinstance(error, InvalidModelError)
    assert error.code == "not_onnx"


def test_truncated_model_is_not_onnx():
    data = small_model().SerializeToString()
    assert refusal(data[: len(data) // 2]).code == "not_onnx"


def test_missing_file_and_directory_are_file_not_found(tmp_path: Path):
    assert refusal(tmp_path / "nope.onnx").code == "file_not_found"
    assert refusal(tmp_path).code == "file_not_found"


def test_checker_failure_is_invalid_graph_with_the_checkers_message():
    model = small_model(nodes=[helper.make_node("Relu", ["x", "x"], ["y"])])
    error = refusal(model)
    assert error.code == "invalid_graph"
    assert "Relu" in error.message


def test_weights_shorter_than_their_shape_are_invalid_graph():
    model = small_model()
    model.graph.initializer[0].raw_data = b"\0" * 8
    assert refusal(model.SerializeToString()).code == "invalid_graph"


def test_cycle_is_refused_naming_a_node_on_it():
    nodes = [
        helper.make_node("Relu", ["b"], ["c"], name="downstream"),  # depends on the cycle, not on it
        helper.make_node("Add", ["x", "b"], ["a"], name="loop_a"),
        helper.make_node("Relu", ["a"], ["b"], name="loop_b"),
        helper.make_node("Identity", ["c"], ["y"], name="out"),
    ]
    error = refusal(small_model(nodes=nodes).SerializeToString())
    assert error.code == "graph_cycle"
    assert error.details["node"] in ("loop_a", "loop_b")
    assert "'loop_a'" in error.message and "'loop_b'" in error.message


def test_unsorted_graph_is_sorted_and_the_callers_model_untouched():
    model = small_model()
    model.graph.node.reverse()
    loaded = load_model(model, CONFIG)
    assert [n.name for n in loaded.graph.node] == ["mm", "relu"]
    assert [n.name for n in model.graph.node] == ["relu", "mm"]


@pytest.mark.parametrize("opset", [6, 99])
def test_default_opset_out_of_range_is_unsupported(opset: int):
    error = refusal(small_model(opset=opset).SerializeToString())
    assert isinstance(error, UnsupportedModelError)
    assert error.code == "unsupported_opset"
    assert str(opset) in error.message


def test_unknown_domain_is_unsupported_but_known_ones_load():
    model = small_model()
    model.opset_import.append(helper.make_opsetid("com.example.secret", 1))
    assert refusal(model).code == "unsupported_opset"
    model = small_model()
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    load_model(model, CONFIG)


def test_size_is_checked_before_parsing(tmp_path: Path):
    config = FusionConfig(max_model_bytes=64)
    garbage = b"\xff" * 65  # would be not_onnx if it were parsed
    error = refusal(garbage, config)
    assert isinstance(error, ModelTooLargeError)
    assert error.code == "model_too_large"
    path = tmp_path / "big.bin"
    path.write_bytes(garbage)
    assert refusal(path, config).code == "model_too_large"
    assert refusal(small_model(), config).code == "model_too_large"


def test_too_many_nodes():
    error = refusal(small_model(), FusionConfig(max_nodes=1))
    assert isinstance(error, ModelTooLargeError)
    assert error.code == "too_many_nodes"


def externalize(model: onnx.ModelProto, location: str) -> onnx.ModelProto:
    tensor = model.graph.initializer[0]
    set_external_data(tensor, location=location)
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    return model


def test_external_data_from_bytes_is_unsupported():
    model = externalize(small_model(), "weights.bin")
    assert refusal(model.SerializeToString()).code == "external_data"
    assert refusal(model).code == "external_data"


def test_external_data_inside_the_folder_is_loaded(tmp_path: Path):
    weights = np.arange(16, dtype=np.float32)
    (tmp_path / "weights.bin").write_bytes(weights.tobytes())
    model = externalize(small_model(), "weights.bin")
    onnx.save(model, tmp_path / "m.onnx")
    loaded = load_model(tmp_path / "m.onnx", CONFIG)
    np.testing.assert_array_equal(numpy_helper.to_array(loaded.graph.initializer[0]).ravel(), weights)
    assert (
        refusal(
            tmp_path / "m.onnx", FusionConfig(max_model_bytes=(tmp_path / "m.onnx").stat().st_size + 8)
        ).code
        == "model_too_large"
    )


@pytest.mark.parametrize("kind", ["parent", "absolute", "symlink"])
def test_external_data_outside_the_folder_is_refused(tmp_path: Path, kind: str):
    inside, outside = tmp_path / "model", tmp_path / "secret.bin"
    inside.mkdir()
    outside.write_bytes(np.arange(16, dtype=np.float32).tobytes())
    location = {"parent": "../secret.bin", "absolute": str(outside), "symlink": "link.bin"}[kind]
    if kind == "symlink":
        os.symlink(outside, inside / "link.bin")
    onnx.save(externalize(small_model(), location), inside / "m.onnx")
    error = refusal(inside / "m.onnx")
    assert isinstance(error, UnsupportedModelError)
    assert error.code == "external_data_path"


def test_missing_external_file_is_file_not_found(tmp_path: Path):
    onnx.save(externalize(small_model(), "gone.bin"), tmp_path / "m.onnx")
    assert refusal(tmp_path / "m.onnx").code == "file_not_found"


def test_subgraphs_load():
    branch = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["t"])], "b", [], [helper.make_tensor_value_info("t", 1, [2, 4])]
    )
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
        helper.make_node("Cast", ["s"], ["cond"], to=TensorProto.BOOL),
        helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=branch),
    ]
    model = small_model(nodes=nodes)
    model.graph.ClearField("initializer")
    assert [n.op_type for n in load_model(model, CONFIG).graph.node] == ["ReduceSum", "Cast", "If"]


def test_typed_weights_with_the_wrong_count_are_invalid_graph():
    model = small_model()
    weight = model.graph.initializer[0]
    weight.ClearField("raw_data")
    weight.float_data.extend([1.0] * 15)  # shape [4, 4] needs 16
    error = refusal(model)
    assert error.code == "invalid_graph"
    assert "holds 15 values" in error.message
