"""Models for the live tests, built with onnx (present wherever the service is)."""

from __future__ import annotations

from typing import Any


def zoo_mlp() -> Any:
    """The zoo's MLP when the zoo offers it, otherwise an equivalent MatMul-Add-Relu chain."""
    try:
        from graph_autofusion import zoo

        return zoo.build("mlp")
    except (ImportError, AttributeError, KeyError, ValueError):
        return tiny_mlp()


def tiny_mlp(hidden: int = 16, scale: float = 1.0) -> Any:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array((rng.standard_normal((8, hidden)) * scale).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(np.zeros(hidden, np.float32), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((hidden, 4)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"], name="mm1"),
        helper.make_node("Add", ["h0", "b1"], ["h1"], name="add1"),
        helper.make_node("Relu", ["h1"], ["h2"], name="relu1"),
        helper.make_node("MatMul", ["h2", "w2"], ["y"], name="mm2"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        initializer=[w1, b1, w2],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _single_relu_model(nodes: list[Any], dims: list[Any]) -> Any:
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def symbolic_batch() -> Any:
    """Valid ONNX whose batch dimension is symbolic: accepted, then fails with ``unbound_dimension``."""
    from onnx import helper

    return _single_relu_model([helper.make_node("Relu", ["x"], ["y"])], ["N", 4])


def cyclic() -> Any:
    """Two nodes feeding each other: rejected at submission with ``graph_cycle``."""
    from onnx import helper

    nodes = [helper.make_node("Relu", ["z"], ["y"]), helper.make_node("Relu", ["y"], ["z"])]
    return _single_relu_model(nodes, [4])
