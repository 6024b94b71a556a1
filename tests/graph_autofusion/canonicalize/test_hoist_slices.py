"""Pass hoist_slices: windows of a Transpose/Reshape output are taken on the input's layout."""

from __future__ import annotations

import numpy as np
import pytest
from canon_helpers import assert_same_outputs, build_model, fuse_and_check, ops, random_feeds, tensor
from onnx import helper, numpy_helper

from graph_autofusion import FusionConfig
from graph_autofusion.canonicalize import canonicalize

B, S, HEADS, D = 2, 8, 2, 8
H = HEADS * D


def _packed_attention(unbind: str) -> object:
    """timm's ViT attention: one QKV projection viewed as (B,S,3,h,d), permuted (2,0,3,1,4), then
    unbound by one Split (TorchScript) or three Slices (dynamo); Q scaled before Q·Kᵀ."""
    rng = np.random.default_rng(0)
    inits = {
        "w": (rng.standard_normal((H, 3 * H)) / np.sqrt(H)).astype(np.float32),
        "b": rng.standard_normal(3 * H).astype(np.float32),
        "shape": np.array([B, S, 3, HEADS, D], dtype=np.int64),
        "zero": np.array([0], dtype=np.int64),
        "scale": np.array(D**-0.5, dtype=np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["mm"]),
        helper.make_node("Add", ["mm", "b"], ["qkv"]),
        helper.make_node("Reshape", ["qkv", "shape"], ["view"]),
        helper.make_node("Transpose", ["view"], ["perm"], perm=[2, 0, 3, 1, 4]),
    ]
    if unbind == "split":
        inits["ones"] = np.array([1, 1, 1], dtype=np.int64)
        nodes.append(helper.make_node("Split", ["perm", "ones"], ["p0", "p1", "p2"], axis=0))
    else:
        for i in range(3):
            inits[f"s{i}"], inits[f"e{i}"] = np.array([i], np.int64), np.array([i + 1], np.int64)
            nodes.append(helper.make_node("Slice", ["perm", f"s{i}", f"e{i}", "zero"], [f"p{i}"]))
    nodes += [
        *(helper.make_node("Squeeze", [f"p{i}", "zero"], [n]) for i, n in enumerate(("q", "k", "v"))),
        helper.make_node("Mul", ["q", "scale"], ["qs"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["qs", "kt"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["y"]),
    ]
    return build_model(nodes, [tensor("x", [B, S, H])], [tensor("y", [B, HEADS, S, D])], inits, opset=18)


@pytest.mark.parametrize("unbind", ["split", "slices"])
def test_unbound_qkv_windows_move_onto_the_projection(unbind: str, tmp_path) -> None:
    model = _packed_attention(unbind)
    out, counts = canonicalize(model, FusionConfig())
    assert counts["hoist_slices"] == 2  # over the Transpose, then over the Reshape
    assert "Split" not in ops(out)
    slices = [n for n in out.graph.node if n.op_type == "Slice"]
    assert len(slices) == 3 and all(n.input[0] == "qkv" for n in slices)
    assert_same_outputs(model, out, random_feeds(model))
    kernels, bound = fuse_and_check(model, tmp_path)
    # QKV+bias, then Q·Kᵀ with its scale, Softmax and P·V as one attention kernel: nothing else
    assert kernels == bound - 2


def test_a_window_inside_an_axis_block_stays() -> None:
    # Columns 1..3 of each 4-wide row of a (2, 8) → (2, 2, 4) view are not one block of the input.
    inits = {
        "shape": np.array([2, 2, 4], dtype=np.int64),
        "s": np.array([1], np.int64),
        "e": np.array([3], np.int64),
        "axis": np.array([2], np.int64),
    }
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Reshape", ["r", "shape"], ["v"]),
        helper.make_node("Slice", ["v", "s", "e", "axis"], ["y"]),
    ]
    model = build_model(nodes, [tensor("x", [2, 8])], [tensor("y", [2, 2, 2])], inits, opset=18)
    out, counts = canonicalize(model, FusionConfig())
    assert counts["hoist_slices"] == 0 and ops(out) == ["Relu", "Reshape", "Slice"]


def test_a_leading_block_of_a_split_axis_moves() -> None:
    # Index 1 of the middle axis of a (2, 8) → (2, 2, 4) view is columns 4..7 of the input.
    inits = {"shape": np.array([2, 2, 4], dtype=np.int64), "s": np.array([1], np.int64),
             "e": np.array([2], np.int64), "axis": np.array([1], np.int64)}  # fmt: skip
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Reshape", ["r", "shape"], ["v"]),
        helper.make_node("Slice", ["v", "s", "e", "axis"], ["y"]),
        helper.make_node("Neg", ["y"], ["z"]),
    ]
    model = build_model(nodes, [tensor("x", [2, 8])], [tensor("z", [2, 1, 4])], inits, opset=18)
    out, counts = canonicalize(model, FusionConfig())
    assert counts["hoist_slices"] == 1 and ops(out) == ["Relu", "Slice", "Reshape", "Neg"]
    window = out.graph.node[1]
    init = {t.name: t for t in out.graph.initializer}
    starts, ends = (numpy_helper.to_array(init[n]) for n in window.input[1:3])
    assert (starts.tolist(), ends.tolist()) == ([4], [8])
    assert_same_outputs(model, out, random_feeds(model))


def test_a_transpose_read_by_other_ops_stays() -> None:
    inits = {"s": np.array([0], np.int64), "e": np.array([1], np.int64), "axis": np.array([0], np.int64)}
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
        helper.make_node("Slice", ["t", "s", "e", "axis"], ["a"]),
        helper.make_node("Neg", ["t"], ["b"]),
    ]
    model = build_model(
        nodes, [tensor("x", [3, 4])], [tensor("a", [1, 3]), tensor("b", [4, 3])], inits, opset=18
    )
    out, counts = canonicalize(model, FusionConfig())
    assert counts["hoist_slices"] == 0 and ops(out) == ["Transpose", "Slice", "Neg"]
