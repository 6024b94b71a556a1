"""The row-reduction match: the planner accepts a reduction group exactly when it lowers.

The seeds are random graphs (graph_autofusion.testing.random_graphs) whose reduction groups the
planner once accepted and the lowering then declined, so they ran as host ops.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from graphs import Propose, model, node

import graph_autofusion as gaf
from graph_autofusion.backend.cpu.extract import extract
from graph_autofusion.ir import Graph
from graph_autofusion.lower.reduction import lower_reduction
from graph_autofusion.lower.values import Unsupported
from graph_autofusion.plan.reduction_match import group_spec, match_reduction
from graph_autofusion.plan.templates import classify
from graph_autofusion.testing.random_graphs import generate

# Split outputs leaving off the row domain; reductions over the same rows from differently
# shaped inputs (Flatten > Softmax beside Reshape > ReduceLogSumExp, reduced size-1 axes).
SEEDS = [440, 646, 671, 887, 1113, 1333, 1564, 1768, 1810, 1891, 1959, 2715, 2920, 3126, 3413, 3568]


@pytest.mark.parametrize("seed", SEEDS)
def test_every_reduction_group_the_planner_accepts_lowers(seed: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fused = gaf.fuse(generate(seed).model)
    specs = [s for s in extract(fused.model).specs.values() if s.template == "reduction"]
    for spec in specs:
        lower_reduction(spec)  # raises Unsupported if the planner accepted what cannot lower


def _graph(m: onnx.ModelProto) -> Graph:
    return Graph(onnx.shape_inference.infer_shapes(m))


def _split_then_reduce() -> onnx.ModelProto:
    """y0 = x[:, :2] leaves the kernel; y1 = x[:, 2:] is summed per row. y0 is on neither the
    full domain (4x6) nor the per-row one (4): the row kernel cannot write it."""
    return model(
        [
            node("Split", ["x", "sizes"], ["y0", "y1"], "split", axis=1),
            node("ReduceSum", ["y1", "axes"], ["s"], "sum", keepdims=1),
        ],
        [("x", [4, 8])],
        ["y0", "s"],
        [("sizes", np.array([2, 6], np.int64)), ("axes", np.array([1], np.int64))],
    )


def test_a_split_output_off_the_row_domain_is_refused() -> None:
    kind, why = classify(_graph(_split_then_reduce()), [0, 1])
    assert kind is None and "Split 'split' works on 8 elements, rows are 4x6" in why, why


def _same_rows_two_shapes() -> onnx.ModelProto:
    """Softmax over x[4,24] rows and ReduceLogSumExp over the same rows seen as [4,6,4]."""
    return model(
        [
            node("Softmax", ["x"], ["p"], "softmax", axis=-1),
            node("Reshape", ["x", "shape"], ["r"], "reshape"),
            node("ReduceLogSumExp", ["r"], ["l"], "lse", axes=[1, 2], keepdims=0),
        ],
        [("x", [4, 24])],
        ["p", "l"],
        [("shape", np.array([4, 6, 4], np.int64))],
    )


def test_reductions_over_the_same_rows_of_different_shapes_share_a_kernel() -> None:
    g = _graph(_same_rows_two_shapes())
    assert classify(g, range(len(g.nodes))) == ("reduction", "")
    match = match_reduction(group_spec(g, range(len(g.nodes))))
    assert (match.full, match.axes, match.outer, match.inner) == ((4, 24), (1,), 4, 24)
    fused = gaf.fuse(_same_rows_two_shapes(), patterns=[Propose(["softmax", "reshape", "lse"])])
    assert fused.get_kernel_count() == 1, fused.report()["groups"]
    assert fused.verify(raise_on_failure=True).passed


def test_reductions_over_different_rows_do_not_match() -> None:
    m = model(
        [
            node("ReduceSum", ["x", "a1"], ["s"], "sum", keepdims=1),
            node("ReduceMax", ["s"], ["t"], "max", axes=[0], keepdims=1),
        ],
        [("x", [4, 8])],
        ["t"],
        [("a1", np.array([1], np.int64))],
    )
    g = _graph(m)
    with pytest.raises(Unsupported, match="reductions over different domains"):
        match_reduction(group_spec(g, range(len(g.nodes))))
