"""A MatMul/Gemm anchor closing with a LayerNormalization over whole rows: the match's row-norm
stage, its refusals with their reasons, its JSON record, and where the planner forms it (CPU
targets) and where not (the Triton targets, whose anchors do not normalise rows)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from graphs import model, node

import graph_autofusion as gaf
from graph_autofusion.ir import Graph
from graph_autofusion.lower.values import Unsupported
from graph_autofusion.plan.anchor_match import ROW_NORM_MAX_COLUMNS, match_anchor
from graph_autofusion.plan.reduction_match import group_spec
from graph_autofusion.plan.templates import classify


def _post_ln(
    m: int = 6, k: int = 8, n: int = 20, *, residual_out: bool = False, after: str = "", ballast: bool = False
) -> onnx.ModelProto:
    """BERT's `LayerNorm(dense(x) + bias + residual)`; `residual_out`: the sum also leaves (the
    pre-LN residual stream); `after`: an op reading the normalised value; `ballast`: a large
    unrelated op first, which sets the peak activation memory (as the attention scores do in a
    transformer), so that the planner's peak-memory check does not decide the test."""
    nodes = [node("Relu", ["u"], ["v"], "ballast")] if ballast else []
    nodes += [
        node("MatMul", ["x", "w"], ["y"], "dense"),
        node("Add", ["y", "b"], ["z"], "bias"),
        node("Add", ["z", "res"], ["s"], "residual"),
        node("LayerNormalization", ["s", "g", "beta"], ["o"], "ln", axis=-1, epsilon=1e-6),
    ]
    outputs = ["o"]
    if after == "Relu":
        nodes.append(node("Relu", ["o"], ["r"], "after"))
        outputs = ["r"]
    elif after == "Reshape":
        nodes.append(node("Reshape", ["o", "flat"], ["r"], "after"))
        outputs = ["r"]
    if residual_out:
        outputs.append("s")
    inputs = [("x", [2, m, k]), ("res", [2, m, n])]
    if ballast:
        outputs.append("v")
        inputs.append(("u", [4096]))
    rng = np.random.default_rng(0)
    inits = [
        ("w", rng.standard_normal((k, n)).astype(np.float32)),
        ("b", rng.standard_normal(n).astype(np.float32)),
        ("g", rng.standard_normal(n).astype(np.float32)),
        ("beta", rng.standard_normal(n).astype(np.float32)),
        ("flat", np.array([-1, n], np.int64)),
    ]
    return model(nodes, inputs, outputs, inits)


def _graph(m: onnx.ModelProto) -> Graph:
    return Graph(onnx.shape_inference.infer_shapes(m))


def _all(g: Graph) -> list[int]:
    return list(range(len(g.nodes)))


def test_the_norm_is_the_last_stage_of_the_match() -> None:
    g = _graph(_post_ln(residual_out=True))
    match = match_anchor(group_spec(g, _all(g)))
    assert [n.name for n in match.epilogue] == ["bias", "residual"]
    norm = match.norm
    assert norm is not None
    assert (norm.node, norm.value, norm.scale, norm.bias, norm.output) == ("ln", "s", "g", "beta", "o")
    assert norm.columns == 20 and norm.epsilon == pytest.approx(1e-6)
    assert classify(g, _all(g)) == ("anchor", "")


def test_views_after_the_norm_name_the_output() -> None:
    g = _graph(_post_ln(after="Reshape"))
    norm = match_anchor(group_spec(g, _all(g))).norm
    assert norm is not None and norm.output == "r" and norm.through == ("after",)


def test_refusals_say_why() -> None:
    g = _graph(_post_ln(after="Relu"))
    with pytest.raises(Unsupported, match="Relu 'after' after LayerNormalization 'ln'"):
        match_anchor(group_spec(g, _all(g)))
    wide = ROW_NORM_MAX_COLUMNS + 32
    g = _graph(_post_ln(m=2, k=4, n=wide))
    template, why = classify(g, _all(g))
    assert template is None and f"rows of {wide} columns" in why
    g = _graph(_post_ln())
    template, why = classify(g, _all(g), row_stages=False)
    assert template is None and "do not normalise or pool rows" in why


def test_a_norm_over_another_axis_is_refused() -> None:
    m = model(
        [
            node("MatMul", ["x", "w"], ["y"], "dense"),
            node("LayerNormalization", ["y", "g"], ["o"], "ln", axis=1),
        ],
        [("x", [2, 6, 8])],
        ["o"],
        [("w", np.ones((8, 5), np.float32)), ("g", np.ones((6, 5), np.float32))],
    )
    g = _graph(m)
    with pytest.raises(Unsupported, match="normalises axis 1"):
        match_anchor(group_spec(g, _all(g)))


def _norm_anchors(fused: onnx.ModelProto) -> list[tuple[onnx.FunctionProto, dict]]:
    found = []
    for f in fused.functions:
        doc = json.loads(f.doc_string)
        if doc["template"] == "anchor" and "norm" in doc["match"]:
            found.append((f, doc["match"]))
    return found


def test_planned_for_cpu_with_the_match_recorded_and_not_for_triton_targets() -> None:
    m = _post_ln(residual_out=True, ballast=True)
    fused = gaf.fuse(m).model
    ((fn, recorded),) = _norm_anchors(fused)
    norm = recorded["norm"]
    assert norm["columns"] == 20 and norm["node"].startswith("n") and len(recorded["epilogue"]) == 2
    assert set(fn.output) == {norm["output"], norm["value"]}  # the residual sum leaves too
    for target in ("cuda", "ascend910"):
        assert not _norm_anchors(gaf.fuse(m, {"hardware": target}).model)


def test_a_chain_closes_with_a_norm_on_cpu_targets_only() -> None:
    rng = np.random.default_rng(1)
    m = model(
        [
            node("MatMul", ["x", "w1"], ["h"], "fc1"),
            node("Relu", ["h"], ["a"], "act"),
            node("MatMul", ["a", "w2"], ["y"], "fc2"),
            node("Add", ["y", "res"], ["s"], "residual"),
            node("LayerNormalization", ["s", "g"], ["o"], "ln", axis=-1),
        ],
        [("x", [10, 8]), ("res", [10, 20])],
        ["o", "s"],
        [
            (k, rng.standard_normal(s).astype(np.float32))
            for k, s in (("w1", (8, 32)), ("w2", (32, 20)), ("g", (20,)))
        ],
    )
    g = _graph(m)
    assert classify(g, _all(g)) == ("anchor_chain", "")
    template, why = classify(g, _all(g), row_stages=False)
    assert template is None and "do not normalise or pool rows" in why
