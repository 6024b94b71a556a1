"""`max_activation_bytes`: refused from static shapes, precisely, before anything is allocated."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import graph_autofusion as gaf
from graph_autofusion.errors import ModelTooLargeError


def relu_chain(rows: str | int = "n", cols: int = 1000) -> onnx.ModelProto:
    """x → Relu → Neg → y: activations peak at two live tensors of rows×cols float32."""
    graph = h.make_graph(
        [h.make_node("Relu", ["x"], ["r"]), h.make_node("Neg", ["r"], ["y"])],
        "chain",
        [h.make_tensor_value_info("x", T.FLOAT, [rows, cols])],
        [h.make_tensor_value_info("y", T.FLOAT, [rows, cols])],
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def test_limit_is_exact_at_the_peak() -> None:
    peak = 2 * 100 * 1000 * 4  # x and r live together while Relu runs, then r and y
    shapes = {"x": [100, 1000]}
    fused = gaf.fuse(relu_chain(), {"input_shapes": shapes, "max_activation_bytes": peak})
    assert fused.report()["estimates"]["peak_memory_bytes"]["before"] == peak
    with pytest.raises(ModelTooLargeError) as info:
        gaf.fuse(relu_chain(), {"input_shapes": shapes, "max_activation_bytes": peak - 1})
    err = info.value
    assert err.code == "model_too_large"
    assert err.details["activation_bytes"] == peak and err.details["limit"] == peak - 1
    assert err.details["tensor_shape"] == [100, 1000] and err.details["tensor_bytes"] == 400_000
    assert "config.max_activation_bytes" in err.message and "[100, 1000] float32" in err.message


def test_huge_bound_inputs_are_refused_before_canonicalization(monkeypatch) -> None:
    """400 GB of input: refused before canonicalization (which may run the model in onnxruntime
    to measure shapes) — a refusal in well under a second, not an out-of-memory kill."""

    def must_not_run(*args, **kwargs):
        raise AssertionError("canonicalize ran on a model whose inputs are over the limit")

    monkeypatch.setattr("graph_autofusion.api.canonicalize", must_not_run)
    with pytest.raises(ModelTooLargeError) as info:
        gaf.fuse(relu_chain(), {"input_shapes": {"x": [100_000_000, 1000]}})
    assert info.value.details["activation_bytes"] == 400_000_000_000
    assert (
        "inputs alone need 372.53 GiB" in info.value.message and "'x' [100000000, 1000]" in info.value.message
    )


def test_symbolic_dims_bound_through_a_shared_name_count() -> None:
    graph = h.make_graph(
        [h.make_node("Add", ["a", "b"], ["y"])],
        "add",
        [
            h.make_tensor_value_info("a", T.FLOAT, ["n", 1000]),
            h.make_tensor_value_info("b", T.FLOAT, ["n", 1000]),
        ],
        [h.make_tensor_value_info("y", T.FLOAT, ["n", 1000])],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    with pytest.raises(ModelTooLargeError) as info:  # a is bound, b shares its dim "n"
        gaf.fuse(model, {"input_shapes": {"a": [1000, 1000]}, "max_activation_bytes": 6_000_000})
    assert info.value.details["activation_bytes"] == 8_000_000  # both inputs: refused up front


def test_static_model_over_the_default_limit_is_refused() -> None:
    with pytest.raises(ModelTooLargeError, match="'x' \\[3000000, 1000\\]"):
        gaf.fuse(relu_chain(rows=3_000_000))  # 12 GB per tensor, over the 8 GiB default


def test_limit_must_be_positive() -> None:
    with pytest.raises(gaf.FusionError) as info:
        gaf.fuse(relu_chain(rows=4), {"max_activation_bytes": 0})
    assert info.value.code == "invalid_config"
