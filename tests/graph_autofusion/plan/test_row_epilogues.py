"""Row-reduction kernels and the ops after the reduction: what the row template may compute.

The row kernel computes one row at a time, so an op downstream of a reduction must work on one
value per row or on the row domain, with per-row values broadcast along their own row. The
cases come from the differential test (graph_autofusion.testing), each with its seed.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from graphs import Propose, model, node

import graph_autofusion as gaf
from graph_autofusion.ir import Graph
from graph_autofusion.plan.templates import classify


def _classify(graph: Graph) -> tuple[str | None, str]:
    return classify(graph, range(len(graph.nodes)))


# -- per-row values in a row reduction's epilogue ----------------------------------------------


def _transposed_mean_plus_input(keepdims: int) -> onnx.ModelProto:
    """mean over the rows of x^T, added back to x: m[18] + x[4,18] (m along the last axis), or,
    with keepdims, m[18,1] + t[18,4] (m along its rows)."""
    return model(
        [
            node("Transpose", ["x"], ["t"], "transpose", perm=[1, 0]),
            node("ReduceMean", ["t"], ["m"], "mean", axes=[1], keepdims=keepdims),
            node("Add", ["m", "t" if keepdims else "x"], ["o"], "add"),
        ],
        [("x", [4, 18])],
        ["o"],
    )


def test_a_per_row_value_broadcast_across_rows_is_refused() -> None:
    """m[18] + x[4,18] puts the 18 means along the last axis: no output row holds one row's mean.

    Found by the differential test (seed 163: Reshape > Transpose > ReduceMean > Sum): the row
    kernel wrote out[o*4 + j] = mean[o] + x[o*4 + j], a transposed answer.
    """
    g = Graph(onnx.shape_inference.infer_shapes(_transposed_mean_plus_input(keepdims=0)))
    kind, why = _classify(g)
    assert kind is None and "broadcasts a per-row value [18] across rows" in why, why
    kept = Graph(onnx.shape_inference.infer_shapes(_transposed_mean_plus_input(keepdims=1)))
    assert _classify(kept) == ("reduction", "")


@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduction_epilogue_broadcasts_match_onnxruntime(keepdims: int) -> None:
    fused = gaf.fuse(_transposed_mean_plus_input(keepdims))
    assert fused.verify(raise_on_failure=True).passed


def _mean_add_concat() -> onnx.ModelProto:
    """m[4,1] + c[4,2] has 2 elements per row where the row domain has 3; Concat fills to 12."""
    return model(
        [
            node("ReduceLogSumExp", ["x"], ["m"], "lse", axes=[1], keepdims=1),
            node("Add", ["c", "m"], ["a"], "add"),
            node("Concat", ["a", "d"], ["o"], "concat", axis=0),
        ],
        [("x", [4, 3])],
        ["o"],
        [("c", np.linspace(-1, 1, 8, dtype=np.float32).reshape(4, 2)), ("d", np.ones((2, 2), np.float32))],
    )


def test_an_op_after_a_reduction_off_the_row_domain_is_refused() -> None:
    """Found by the differential test (seed 43: ... ReduceLogSumExp > Elu > Add > Concat)."""
    g = Graph(onnx.shape_inference.infer_shapes(_mean_add_concat()))
    kind, why = _classify(g)
    # Refused by the element-count rule, or first by the rule against element-moving epilogues.
    assert kind is None and ("works on 8 elements, rows are 4x3" in why or "reorders" in why), why
    proposed = gaf.fuse(_mean_add_concat(), patterns=[Propose(["lse", "add", "concat"])])
    assert proposed.verify(raise_on_failure=True).passed
