"""Pass scale_after_matmul: a constant scalar factor on a MatMul operand moves to the result."""

from __future__ import annotations

import numpy as np
from canon_helpers import assert_same_outputs, build_model, fuse_and_check, ops, random_feeds, tensor
from onnx import helper, numpy_helper

from graph_autofusion import FusionConfig
from graph_autofusion.canonicalize import canonicalize

SHAPE = [2, 2, 8, 8]  # (batch, heads, sequence, head dim)


def _scores(q_scale: str | None, k_scale: str | None) -> object:
    """softmax(q'·k'ᵀ) with q' = q ⊙ s (Mul) or q / s (Div), k' likewise before its Transpose."""
    inits = {"s": np.array(0.5, dtype=np.float32), "t": np.array([0.25], dtype=np.float32)}
    nodes, q, k = [], "q", "k"
    if q_scale:
        nodes.append(helper.make_node(q_scale, ["q", "s"], ["q2"]))
        q = "q2"
    nodes.append(helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]))
    k = "kt"
    if k_scale:
        # The SDPA export's operand order: the constant first.
        nodes.append(helper.make_node(k_scale, ["t", "kt"] if k_scale == "Mul" else ["kt", "t"], ["kt2"]))
        k = "kt2"
    nodes += [
        helper.make_node("MatMul", [q, k], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["y"], axis=-1),
    ]
    return build_model(
        nodes, [tensor("q", SHAPE), tensor("k", SHAPE)], [tensor("y", [*SHAPE[:3], SHAPE[2]])], inits
    )


def _factor(model) -> tuple[str, float]:
    scale = next(n for n in model.graph.node if n.op_type in ("Mul", "Div"))
    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return scale.op_type, float(init[scale.input[1]])


def test_a_scaled_query_becomes_a_scaled_product(tmp_path) -> None:
    model = _scores("Mul", None)
    out, counts = canonicalize(model, FusionConfig())
    assert counts["scale_after_matmul"] == 1
    assert ops(out) == ["Transpose", "MatMul", "Mul", "Softmax"]
    assert _factor(out) == ("Mul", 0.5)
    assert_same_outputs(model, out, random_feeds(model))
    assert fuse_and_check(model, tmp_path) == (2, 2)  # Q·Kᵀ with its scale, then the Softmax


def test_a_divided_query_stays_a_division() -> None:
    model = _scores("Div", None)
    out, _ = canonicalize(model, FusionConfig())
    assert ops(out) == ["Transpose", "MatMul", "Div", "Softmax"] and _factor(out) == ("Div", 0.5)
    assert_same_outputs(model, out, random_feeds(model))


def test_both_operands_scaled_give_one_factor(tmp_path) -> None:
    model = _scores("Mul", "Mul")
    out, counts = canonicalize(model, FusionConfig())
    assert counts["scale_after_matmul"] == 2
    assert ops(out) == ["Transpose", "MatMul", "Mul", "Softmax"] and _factor(out) == ("Mul", 0.125)
    assert_same_outputs(model, out, random_feeds(model))
    assert fuse_and_check(model, tmp_path) == (2, 2)


def test_mixed_factors_multiply() -> None:
    model = _scores("Mul", "Div")
    out, _ = canonicalize(model, FusionConfig())
    assert _factor(out) == ("Mul", 2.0)
    assert_same_outputs(model, out, random_feeds(model))


def test_a_scaled_operand_read_elsewhere_stays() -> None:
    model = _scores("Mul", None)
    model.graph.output.append(tensor("q2", SHAPE))
    out, counts = canonicalize(model, FusionConfig())
    assert counts["scale_after_matmul"] == 0 and ops(out) == ["Mul", "Transpose", "MatMul", "Softmax"]


def test_a_per_channel_factor_stays() -> None:
    model = _scores("Mul", None)
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.full(8, 0.5, np.float32), "s"))
    out, counts = canonicalize(model, FusionConfig())
    assert counts["scale_after_matmul"] == 0 and ops(out)[0] == "Mul"
