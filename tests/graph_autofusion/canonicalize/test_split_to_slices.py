"""Pass split_to_slices: a Split of a materialized tensor becomes Slices; others stay."""

from __future__ import annotations

import numpy as np
import onnx
from canon_helpers import assert_same_outputs, build_model, random_feeds, tensor

from graph_autofusion import FusionConfig, zoo
from graph_autofusion.canonicalize import canonicalize


def _ops(model) -> list[str]:
    return [n.op_type for n in model.graph.node]


def test_split_of_a_matmul_output_becomes_slices() -> None:
    m = zoo.build("gpt2", num_layers=1, hidden=32, heads=2, seq_len=8, vocab=50)
    out, counts = canonicalize(m, FusionConfig())
    assert counts["split_to_slices"] == 1
    assert "Split" not in _ops(out) and _ops(out).count("Slice") >= 3
    assert_same_outputs(m, out, random_feeds(m))


def test_split_of_a_computed_value_stays() -> None:
    # Slicing a Relu output would force the Relu out to memory instead of computing it inline.
    m = build_model(
        [
            onnx.helper.make_node("Relu", ["x"], ["r"], name="relu"),
            onnx.helper.make_node("Split", ["r", "sizes"], ["a", "b"], name="split", axis=1),
        ],
        [tensor("x", [2, 6])],
        [tensor("a", [2, 3]), tensor("b", [2, 3])],
        {"sizes": np.array([3, 3], dtype=np.int64)},
    )
    out, counts = canonicalize(m, FusionConfig())
    assert counts["split_to_slices"] == 0
    assert _ops(out) == ["Relu", "Split"]


def test_split_of_a_graph_input_with_uneven_sizes() -> None:
    m = build_model(
        [onnx.helper.make_node("Split", ["x", "sizes"], ["a", "b"], name="split", axis=1)],
        [tensor("x", [2, 5])],
        [tensor("a", [2, 2]), tensor("b", [2, 3])],
        {"sizes": np.array([2, 3], dtype=np.int64)},
    )
    out, counts = canonicalize(m, FusionConfig())
    assert counts["split_to_slices"] == 1 and _ops(out) == ["Slice", "Slice"]
    assert_same_outputs(m, out, random_feeds(m))
