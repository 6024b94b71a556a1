"""Pass constant_gather_nd: GatherND over constant indices becomes a Reshape (+Expand) or a Gather."""

from __future__ import annotations

import numpy as np
from canon_helpers import assert_same_outputs, build_model, fuse_and_check, ops, random_feeds, tensor
from onnx import TensorProto, helper

from graph_autofusion import FusionConfig
from graph_autofusion.canonicalize import canonicalize

B, S = 2, 8


def _grid(query_len: int) -> np.ndarray:
    """transformers' `mask[batch_idx, kv_idx]` grid: idx[b, 0, q, k] = (b, k)."""
    b, _, _, k = np.meshgrid(np.arange(B), [0], np.arange(query_len), np.arange(S), indexing="ij")
    return np.stack([b, k], axis=-1).astype(np.int64)


def _masked_scores(query_len: int) -> object:
    """A bool padding mask gathered by the grid, turned additive, added to attention scores."""
    inits = {"idx": _grid(query_len), "zero": np.array(0.0, np.float32), "neg": np.array(-1e4, np.float32)}
    nodes = [
        helper.make_node("Cast", ["mask"], ["m"], to=TensorProto.BOOL),
        helper.make_node("GatherND", ["m", "idx"], ["g"]),
        helper.make_node("Where", ["g", "zero", "neg"], ["bias"]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),
        helper.make_node("Add", ["scores", "bias"], ["s2"]),
        helper.make_node("Softmax", ["s2"], ["y"], axis=-1),
    ]
    inputs = [
        tensor("mask", [B, S], TensorProto.INT64),
        tensor("q", [B, 2, S, 4]),
        tensor("kt", [B, 2, 4, S]),
    ]
    return build_model(nodes, inputs, [tensor("y", [B, 2, S, S])], inits)


def test_an_in_order_grid_is_a_reshape(tmp_path) -> None:
    model = _masked_scores(query_len=1)
    out, counts = canonicalize(model, FusionConfig())
    assert counts["constant_gather_nd"] == 1
    assert "GatherND" not in ops(out) and "Reshape" in ops(out) and "Expand" not in ops(out)
    feeds = random_feeds(model)
    feeds["mask"] = np.array([[1] * S, [1] * (S - 3) + [0] * 3], dtype=np.int64)
    assert_same_outputs(model, out, feeds)
    kernels, bound = fuse_and_check(model, tmp_path)
    # The (B,1,1,S) mask is one small kernel read by the scores' epilogue (too small a domain to be
    # recomputed there); as an opaque GatherND it took a Cast kernel, itself and a Where kernel.
    assert kernels == bound + 1


def test_a_repeated_axis_is_an_expand() -> None:
    model = _masked_scores(query_len=S)
    out, _ = canonicalize(model, FusionConfig())
    assert "GatherND" not in ops(out) and "Expand" in ops(out)
    assert_same_outputs(model, out, random_feeds(model))


def test_other_constant_offsets_are_a_gather() -> None:
    idx = np.array([[[1, 2], [0, 0]], [[1, 0], [0, 3]]], dtype=np.int64)  # (2, 2, 2): four elements
    nodes = [helper.make_node("GatherND", ["x", "idx"], ["y"])]
    model = build_model(nodes, [tensor("x", [2, 4, 3])], [tensor("y", [2, 2, 3])], {"idx": idx})
    out, counts = canonicalize(model, FusionConfig())
    assert counts["constant_gather_nd"] == 1 and ops(out) == ["Reshape", "Gather"]
    assert_same_outputs(model, out, random_feeds(model))


def test_runtime_indices_stay() -> None:
    nodes = [helper.make_node("GatherND", ["x", "idx"], ["y"])]
    model = build_model(
        nodes, [tensor("x", [2, 4]), tensor("idx", [3, 2], TensorProto.INT64)], [tensor("y", [3])]
    )
    out, counts = canonicalize(model, FusionConfig())
    assert counts["constant_gather_nd"] == 0 and ops(out) == ["GatherND"]
