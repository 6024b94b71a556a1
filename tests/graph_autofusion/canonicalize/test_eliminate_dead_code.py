"""eliminate_dead_code: branches no output depends on go, with the weights only they used."""

from __future__ import annotations

import numpy as np
from canon_helpers import assert_same_outputs, build_model, ops, random_feeds, tensor
from onnx import helper

from graph_autofusion.canonicalize import canonicalize
from graph_autofusion.config import FusionConfig


def test_dead_branch_and_its_weights_are_removed_inputs_are_kept():
    nodes = [
        helper.make_node("MatMul", ["x", "w_live"], ["h"]),
        helper.make_node("Relu", ["h"], ["y"]),
        helper.make_node("MatMul", ["h", "w_dead"], ["dead1"]),
        helper.make_node("Tanh", ["dead1"], ["dead2"]),
        helper.make_node("Sigmoid", ["unused_input"], ["dead3"]),
    ]
    inits = {
        "w_live": np.ones((3, 3), np.float32),
        "w_dead": np.ones((3, 5), np.float32),
        "never_read": np.zeros(7, np.float32),
    }
    model = build_model(
        nodes, [tensor("x", [2, 3]), tensor("unused_input", [2])], [tensor("y", [2, 3])], inits
    )
    result, counts = canonicalize(model, FusionConfig())
    assert ops(result) == ["MatMul", "Relu"]
    assert counts["eliminate_dead_code"] == 3
    assert counts["unused_initializers"] == 2
    assert [t.name for t in result.graph.initializer] == ["w_live"]
    assert [i.name for i in result.graph.input] == ["x", "unused_input"]
    assert {v.name for v in result.graph.value_info} == {"h"}
    assert_same_outputs(model, result, random_feeds(model))
