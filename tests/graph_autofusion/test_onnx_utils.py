"""onnx_utils: ordering, scoping and the light model the checker and shape inference run on."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graph_autofusion.errors import InvalidModelError
from graph_autofusion.onnx_utils import (
    LIGHT_MAX_BYTES,
    count_nodes,
    iter_tensors,
    light_model,
    outer_scope_inputs,
    static_shape,
    tensor_nbytes,
    topological_order,
    unique_name,
)


def if_node(outer: str) -> onnx.NodeProto:
    inner = helper.make_graph(
        [
            helper.make_node("Add", [outer, "local"], ["sum"]),
            helper.make_node("Relu", ["sum"], ["out"]),
        ],
        "branch",
        [],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.ones(2, np.float32), "local")],
    )
    return helper.make_node("If", ["cond"], ["y"], then_branch=inner, else_branch=inner)


def test_outer_scope_inputs_are_what_subgraphs_read_from_outside():
    assert outer_scope_inputs(if_node("h")) == {"h"}


def test_topological_order_keeps_the_given_order_where_free_and_sees_subgraph_reads():
    nodes = [
        if_node("h"),  # reads h only inside its branches
        helper.make_node("Relu", ["x"], ["h"]),
        helper.make_node("Neg", ["x"], ["unrelated"]),
        helper.make_node("Greater", ["x", "x"], ["cond"]),
    ]
    order = topological_order(nodes)
    assert order == [1, 2, 3, 0]


def test_a_cycle_names_a_node_on_it_not_one_downstream():
    nodes = [
        helper.make_node("Relu", ["b"], ["c"], name="after"),
        helper.make_node("Relu", ["c2"], ["a"], name="p"),
        helper.make_node("Relu", ["a"], ["b"], name="q"),
        helper.make_node("Relu", ["b"], ["c2"], name="r"),
    ]
    with pytest.raises(InvalidModelError) as info:
        topological_order(nodes)
    assert info.value.code == "graph_cycle"
    assert info.value.details["node"] in {"p", "q", "r"}


def test_light_model_hides_large_weights_behind_typed_inputs():
    big = np.zeros(LIGHT_MAX_BYTES // 4 + 1, np.float32)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "big"], ["t"]), helper.make_node("Add", ["t", "small"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [big.size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [big.size])],
        [numpy_helper.from_array(big, "big"), numpy_helper.from_array(np.ones(1, np.float32), "small")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    light, left_out = light_model(model)
    assert left_out == big.nbytes
    assert [t.name for t in light.graph.initializer] == ["small"]
    assert [i.name for i in light.graph.input] == ["x", "big"]
    assert static_shape(light.graph.input[1].type) == (big.size,)
    assert light.ByteSize() < 1024
    onnx.checker.check_model(light, full_check=True)
    assert len(model.graph.initializer) == 2  # the source is untouched


def test_iter_tensors_finds_attribute_and_subgraph_tensors():
    graph = helper.make_graph(
        [
            helper.make_node(
                "Constant", [], ["c"], value=numpy_helper.from_array(np.ones(3, np.float32), "cv")
            ),
            if_node("c"),
        ],
        "g",
        [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph)
    names = sorted(t.name for t in iter_tensors(model))
    assert names == ["cv", "local", "local"]
    assert count_nodes(model.graph) == 2 + 2 * 2


def test_tensor_nbytes_without_reading_the_data():
    assert tensor_nbytes(numpy_helper.from_array(np.zeros((3, 5), np.float16))) == 30
    assert tensor_nbytes(helper.make_tensor("t", TensorProto.INT64, [4], [1, 2, 3, 4])) == 32


def test_static_shape_and_unique_name():
    assert static_shape(helper.make_tensor_type_proto(TensorProto.FLOAT, [2, "n"])) is None
    assert static_shape(helper.make_tensor_type_proto(TensorProto.FLOAT, [2, 0])) == (2, 0)
    taken = {"w", "w_1"}
    assert unique_name("w", taken) == "w_2"
    assert "w_2" in taken
