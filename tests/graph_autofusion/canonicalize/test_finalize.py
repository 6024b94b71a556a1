"""finalize: topological order, unique non-empty node names, a model the full checker accepts."""

from __future__ import annotations

import numpy as np
import onnx
from canon_helpers import build_model, random_feeds, run_ort, tensor
from onnx import helper

from graph_autofusion.canonicalize import canonicalize
from graph_autofusion.config import FusionConfig


def test_unsorted_nodes_are_sorted_and_missing_or_duplicate_names_assigned():
    nodes = [
        helper.make_node("Sigmoid", ["b"], ["y"], name="act"),
        helper.make_node("Relu", ["a"], ["b"], name="act"),
        helper.make_node("Neg", ["x"], ["a"]),
    ]
    model = build_model(nodes, [tensor("x", [2])], [tensor("y", [2])])
    result, counts = canonicalize(model, FusionConfig())
    assert [n.op_type for n in result.graph.node] == ["Neg", "Relu", "Sigmoid"]
    names = [n.name for n in result.graph.node]
    assert names == ["Neg_0", "act", "Sigmoid_2"]  # the first holder of a duplicate keeps it
    assert counts["named_nodes"] == 2
    onnx.checker.check_model(result, full_check=True)
    x = random_feeds(model)["x"]
    (y,) = run_ort(result, {"x": x})
    np.testing.assert_allclose(y, 1 / (1 + np.exp(-np.maximum(-x, 0))), rtol=1e-6)


def test_generated_names_do_not_clash_with_given_ones():
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["y"], name="Relu_0")]
    model = build_model(nodes, [tensor("x", [2])], [tensor("y", [2])])
    result, _ = canonicalize(model, FusionConfig())
    names = [n.name for n in result.graph.node]
    assert len(set(names)) == 2 and "Relu_0" in names and all(names)
