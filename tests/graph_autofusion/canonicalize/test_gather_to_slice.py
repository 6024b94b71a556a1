"""Pass gather_to_slice: a Gather of a constant run of indices from a computed tensor is a Slice."""

from __future__ import annotations

import numpy as np
import pytest
from canon_helpers import assert_same_outputs, build_model, ops, random_feeds, tensor
from onnx import TensorProto, helper

from graph_autofusion import FusionConfig
from graph_autofusion.canonicalize import canonicalize


@pytest.mark.parametrize(
    ("index", "expected", "shape"),
    [
        (np.array(0, np.int64), ["Relu", "Slice", "Squeeze"], [2, 4]),  # x[:, 0]
        (np.array(-1, np.int64), ["Relu", "Slice", "Squeeze"], [2, 4]),  # x[:, -1]
        (np.array([1, 2], np.int64), ["Relu", "Slice"], [2, 2, 4]),  # x[:, 1:3]
        (np.array([2, 0], np.int64), ["Relu", "Gather"], [2, 2, 4]),  # not a run
    ],
)
def test_constant_index_runs_become_windows(index, expected, shape) -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Gather", ["r", "i"], ["y"], axis=1),
    ]
    model = build_model(nodes, [tensor("x", [2, 3, 4])], [tensor("y", shape)], {"i": index})
    out, _ = canonicalize(model, FusionConfig())
    assert ops(out) == expected
    assert_same_outputs(model, out, random_feeds(model))


def test_an_embedding_lookup_stays() -> None:
    nodes = [helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)]
    inits = {"table": np.arange(12, dtype=np.float32).reshape(4, 3)}
    model = build_model(nodes, [tensor("ids", [2], TensorProto.INT64)], [tensor("y", [2, 3])], inits)
    out, counts = canonicalize(model, FusionConfig())
    assert counts["gather_to_slice"] == 0 and ops(out) == ["Gather"]
