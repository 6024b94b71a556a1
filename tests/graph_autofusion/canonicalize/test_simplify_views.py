"""Pass simplify_views: Transpose/reshape chains shrink to at most one Transpose and one Reshape."""

from __future__ import annotations

import numpy as np
from canon_helpers import assert_same_outputs, build_model, fuse_and_check, ops, random_feeds, tensor
from onnx import helper

from graph_autofusion import FusionConfig
from graph_autofusion.canonicalize import canonicalize

B, S, HEADS, D = 2, 8, 2, 8


def _perm(model) -> list[int]:
    node = next(n for n in model.graph.node if n.op_type == "Transpose")
    return list(node.attribute[0].ints)


def _sdpa_key() -> object:
    """The key path of torch's scaled_dot_product_attention export: (B,S,h,d) → (B,h,S,d) →
    (B·h,S,d) → (B·h,d,S) → (B,h,d,S), then Q·Kᵀ and a Softmax."""
    inits = {
        "bhsd": np.array([B * HEADS, S, D], dtype=np.int64),
        "bhds": np.array([B, HEADS, D, S], dtype=np.int64),
    }
    nodes = [
        helper.make_node("Transpose", ["k"], ["k1"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["k1", "bhsd"], ["k2"]),
        helper.make_node("Transpose", ["k2"], ["k3"], perm=[0, 2, 1]),
        helper.make_node("Reshape", ["k3", "bhds"], ["kt"]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["y"], axis=-1),
    ]
    return build_model(
        nodes,
        [tensor("q", [B, HEADS, S, D]), tensor("k", [B, S, HEADS, D])],
        [tensor("y", [B, HEADS, S, S])],
        inits,
    )


def test_the_sdpa_key_chain_is_one_transpose(tmp_path) -> None:
    model = _sdpa_key()
    out, counts = canonicalize(model, FusionConfig())
    assert counts["simplify_views"] >= 3
    assert ops(out) == ["Transpose", "MatMul", "Softmax"] and _perm(out) == [0, 2, 3, 1]
    assert_same_outputs(model, out, random_feeds(model))
    assert fuse_and_check(model, tmp_path) == (2, 2)  # the key is read in place by Q·Kᵀ


def test_two_transposes_compose() -> None:
    nodes = [
        helper.make_node("Transpose", ["x"], ["a"], perm=[1, 2, 0]),
        helper.make_node("Transpose", ["a"], ["y"], perm=[2, 0, 1]),
        helper.make_node("Relu", ["y"], ["z"]),
    ]
    model = build_model(nodes, [tensor("x", [2, 3, 4])], [tensor("z", [2, 3, 4])])
    out, _ = canonicalize(model, FusionConfig())
    assert ops(out) == ["Relu"]  # the two permutations cancel
    assert_same_outputs(model, out, random_feeds(model))


def test_reshapes_merge_and_a_transpose_read_twice_stays() -> None:
    inits = {"s1": np.array([6, 4], dtype=np.int64), "s2": np.array([3, 8], dtype=np.int64)}
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
        helper.make_node("Reshape", ["t", "s1"], ["r1"]),
        helper.make_node("Reshape", ["r1", "s2"], ["y"]),
        helper.make_node("Transpose", ["t"], ["w"], perm=[2, 1, 0]),
    ]
    model = build_model(nodes, [tensor("x", [2, 3, 4])], [tensor("y", [3, 8]), tensor("w", [4, 2, 3])], inits)
    out, _ = canonicalize(model, FusionConfig())
    assert ops(out) == ["Transpose", "Reshape", "Transpose"]
    assert_same_outputs(model, out, random_feeds(model))


def test_a_splitting_reshape_keeps_its_transpose_after_it() -> None:
    # (6, 4) → (2, 3, 4) splits an axis: the Transpose after it cannot move above.
    inits = {"s": np.array([2, 3, 4], dtype=np.int64)}
    nodes = [
        helper.make_node("Reshape", ["x", "s"], ["r"]),
        helper.make_node("Transpose", ["r"], ["y"], perm=[1, 0, 2]),
    ]
    model = build_model(nodes, [tensor("x", [6, 4])], [tensor("y", [3, 2, 4])], inits)
    out, counts = canonicalize(model, FusionConfig())
    assert counts["simplify_views"] == 0 and ops(out) == ["Reshape", "Transpose"]
