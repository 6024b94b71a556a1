"""Pass windowed_gemm: a Gemm reading a window (BERT's pooler, ViT's head) becomes MatMul + Add."""

from __future__ import annotations

import numpy as np
from canon_helpers import assert_same_outputs, build_model, fuse_and_check, ops, random_feeds, tensor
from onnx import helper

from graph_autofusion import FusionConfig
from graph_autofusion.canonicalize import canonicalize

B, S, H, N = 2, 6, 16, 8


def _pooler(select: bool, **gemm: float) -> object:
    """LayerNorm → x[:, 0] (or the mean over tokens) → Gemm → Tanh."""
    rng = np.random.default_rng(0)
    inits = {
        "g": np.ones(H, np.float32),
        "beta": np.zeros(H, np.float32),
        "w": (rng.standard_normal((N, H)) / 4).astype(np.float32),
        "b": rng.standard_normal(N).astype(np.float32),
        "zero": np.array(0, np.int64),
        "axes": np.array([1], np.int64),
    }
    pick = (
        helper.make_node("Gather", ["ln", "zero"], ["cls"], axis=1)
        if select
        else helper.make_node("ReduceMean", ["ln", "axes"], ["cls"], keepdims=0)
    )
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g", "beta"], ["ln"], axis=-1),
        pick,
        helper.make_node("Gemm", ["cls", "w", "b"], ["p"], transB=1, **gemm),
        helper.make_node("Tanh", ["p"], ["y"]),
    ]
    return build_model(nodes, [tensor("x", [B, S, H])], [tensor("y", [B, N])], inits, opset=18)


def test_the_class_token_is_read_in_place(tmp_path) -> None:
    model = _pooler(select=True)
    out, counts = canonicalize(model, FusionConfig())
    assert counts["gather_to_slice"] == 1 and counts["windowed_gemm"] == 1
    assert ops(out) == ["LayerNormalization", "Slice", "Squeeze", "MatMul", "Add", "Tanh"]
    assert_same_outputs(model, out, random_feeds(model))
    assert fuse_and_check(model, tmp_path) == (2, 2)  # LayerNorm; the token's MatMul + bias + tanh


def test_alpha_and_beta_fold_into_the_constants() -> None:
    model = _pooler(select=True, alpha=0.5, beta=2.0)
    out, _ = canonicalize(model, FusionConfig())
    assert "Gemm" not in ops(out)
    assert_same_outputs(model, out, random_feeds(model))


def test_a_gemm_on_a_whole_tensor_stays() -> None:
    out, counts = canonicalize(_pooler(select=False), FusionConfig())
    assert counts["windowed_gemm"] == 0 and "Gemm" in ops(out)
