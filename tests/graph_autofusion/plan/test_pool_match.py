"""A MatMul/Gemm anchor opening with a GlobalAveragePool of its left operand: the match's pool
prologue, its refusals with their reasons, and the planner forming it for CPU targets only."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from graphs import model, node

import graph_autofusion as gaf
from graph_autofusion.ir import Graph
from graph_autofusion.lower.values import Unsupported
from graph_autofusion.plan.anchor_match import match_anchor
from graph_autofusion.plan.reduction_match import group_spec
from graph_autofusion.plan.templates import classify


def _head(*, pooled_out: bool = False, pooled_b: bool = False, relu: bool = True) -> onnx.ModelProto:
    """`x -> Relu -> GlobalAveragePool -> Flatten -> Gemm(W, b, transB=1)`; `pooled_out`: the
    pooled value leaves too; `pooled_b`: the pooled rows are the Gemm's right operand; without
    `relu` the pool reads the model input (the Relu is an Identity)."""
    rng = np.random.default_rng(0)
    nodes = [
        node("Relu" if relu else "Identity", ["x"], ["r"], "act"),
        node("GlobalAveragePool", ["r"], ["p"], "pool"),
        node("Flatten", ["p"], ["f"], "flat", axis=1),
    ]
    if pooled_b:
        nodes.append(node("Gemm", ["a", "f"], ["y"], "fc"))
        inputs = [("x", [6, 16, 5, 5]), ("a", [4, 6])]
    else:
        nodes.append(node("Gemm", ["f", "w", "b"], ["y"], "fc", transB=1))
        inputs = [("x", [2, 16, 5, 5])]
    outputs = ["y", "p"] if pooled_out else ["y"]
    inits = [
        ("w", rng.standard_normal((10, 16)).astype(np.float32)),
        ("b", rng.standard_normal(10).astype(np.float32)),
        ("u", np.zeros(1, np.float32)),
    ]
    return model(nodes, inputs, outputs, inits)


def _graph(m: onnx.ModelProto) -> Graph:
    return Graph(onnx.shape_inference.infer_shapes(m))


def test_pool_view_and_gemm_form_one_anchor() -> None:
    g = _graph(_head())
    members = [1, 2, 3]
    match = match_anchor(group_spec(g, members))
    assert match.pool is not None and (match.pool.tensor, match.pool.value) == ("r", "p")
    assert match.pool.entries == 32 and match.pool.window == 25
    assert classify(g, members) == ("anchor", "")
    template, why = classify(g, members, row_stages=False)
    assert template is None and "do not normalise or pool rows" in why


@pytest.mark.parametrize(
    ("members", "kwargs", "why"),
    [
        ([0, 1, 2, 3], {}, "pools a value computed here"),
        ([1, 2, 3], {"pooled_out": True}, "output 'p' leaves the kernel"),
        ([1, 2, 3], {"pooled_b": True}, "does not reach Gemm 'fc' as its left operand"),
    ],
)
def test_refusals_say_why(members: list[int], kwargs: dict, why: str) -> None:
    g = _graph(_head(**kwargs))
    with pytest.raises(Unsupported, match=why):
        match_anchor(group_spec(g, members))


def test_planned_for_cpu_with_the_match_recorded_and_not_for_triton_targets() -> None:
    def pooled(fused: onnx.ModelProto) -> list[dict]:
        docs = [json.loads(f.doc_string) for f in fused.functions]
        return [d["match"]["pool"] for d in docs if d["template"] == "anchor" and "pool" in d["match"]]

    m = _head(relu=False)
    (recorded,) = pooled(gaf.fuse(m).model)
    assert recorded["window"] == 25 and recorded["node"].startswith("n")
    for target in ("cuda", "ascend910"):
        assert not pooled(gaf.fuse(m, {"hardware": target}).model)
