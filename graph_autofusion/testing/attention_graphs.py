"""Hand-written ONNX attention blocks, the shapes exporters give them, for the attention tests.

    model, feeds = attention_model(batch=2, heads=2, seq=13, head_dim=16, mask="causal")

The block reads activations `[B, S, H*D]` (three of them, or one packed `[B, S, 3*H*D]` cut by
Slices as GPT-2 and ViT are), splits heads with Reshape + Transpose (K straight to `[B, H, D, S]`),
computes `softmax(q k^T * scale + mask) v` and merges the heads back to `[B, S, H*D]`. Variants:

* `scale`: "div" (BERT, GPT-2: scores / sqrt(D)), "mul" (ViT: scores * D^-0.5), "q" (the scale
  folded into Q and K, as SDPA exports write it), "none";
* `mask`: None, "padding" (an additive `[B, 1, 1, S]` input, BERT), "causal" (Where of a constant
  lower triangle, GPT-2), "bool" (Where of a `[B, 1, S, S]` bool input), "causal_add" (an
  additive constant triangle of -inf above the diagonal: a general additive mask);
* `heads_inner`: the feature axis is `(D, H)` instead of `(H, D)`, so a head's elements are H
  apart (no unit-stride rows: the CPU kernel's loop form instead of its sgemm form).
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT


def attention_model(
    *,
    batch: int = 2,
    heads: int = 2,
    seq: int = 16,
    head_dim: int = 16,
    mask: str | None = None,
    scale: str = "div",
    packed: bool = False,
    heads_inner: bool = False,
    seed: int = 0,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The model and example inputs (see the module docstring)."""
    rng = np.random.default_rng(seed)
    b, h, s, d = batch, heads, seq, head_dim
    hd = h * d
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    inputs: list[onnx.ValueInfoProto] = []
    feeds: dict[str, np.ndarray] = {}

    def const(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(value, name=name))
        return name

    def add(op: str, ins: list[str], out: str, **attrs: object) -> str:
        nodes.append(helper.make_node(op, ins, [out], name=f"n_{out}", **attrs))
        return out

    def activation(name: str, shape: list[int], dtype: int = F) -> str:
        inputs.append(helper.make_tensor_value_info(name, dtype, shape))
        if dtype == F:
            feeds[name] = rng.standard_normal(shape).astype(np.float32)
        return name

    if packed:
        qkv = activation("qkv", [b, s, 3 * hd])
        axes = const("axes", np.array([2], np.int64))
        srcs = []
        for k, what in enumerate("qkv"):
            lo = const(f"{what}_lo", np.array([k * hd], np.int64))
            hi = const(f"{what}_hi", np.array([(k + 1) * hd], np.int64))
            srcs.append(add("Slice", [qkv, lo, hi, axes], f"{what}_cut"))
    else:
        srcs = [activation(f"x_{what}", [b, s, hd]) for what in "qkv"]
    if heads_inner:  # the feature axis holds (d, h): head elements are h apart, not adjacent
        split = const("split_shape", np.array([b, s, d, h], np.int64))
        perms = ([0, 3, 1, 2], [0, 3, 2, 1], [0, 3, 1, 2])
    else:
        split = const("split_shape", np.array([b, s, h, d], np.int64))
        perms = ([0, 2, 1, 3], [0, 2, 3, 1], [0, 2, 1, 3])
    q = add("Transpose", [add("Reshape", [srcs[0], split], "q4")], "q", perm=perms[0])
    kt = add("Transpose", [add("Reshape", [srcs[1], split], "k4")], "kt", perm=perms[1])
    v = add("Transpose", [add("Reshape", [srcs[2], split], "v4")], "v", perm=perms[2])
    if scale == "q":
        root = const("root_scale", np.array(d**-0.25, np.float32))
        q = add("Mul", [q, root], "q_scaled")
        kt = add("Mul", [kt, root], "kt_scaled")
    scores = add("MatMul", [q, kt], "scores")
    if scale == "div":
        scores = add("Div", [scores, const("sqrt_d", np.array(math.sqrt(d), np.float32))], "scaled")
    elif scale == "mul":
        scores = add("Mul", [scores, const("inv_sqrt_d", np.array(d**-0.5, np.float32))], "scaled")
    tri = np.tril(np.ones((s, s), dtype=bool))
    if mask == "padding":
        m = activation("mask", [b, 1, 1, s])
        keep = np.ones((b, s), np.float32)
        keep[0, s - max(1, s // 3) :] = 0.0  # the first sequence is padded at its end
        feeds[m] = ((1.0 - keep) * -10000.0).reshape(b, 1, 1, s).astype(np.float32)
        scores = add("Add", [scores, m], "masked")
    elif mask == "causal":
        c = const("causal_bias", tri.reshape(1, 1, s, s))
        fill = const("fill", np.array(np.finfo(np.float32).min, np.float32))
        scores = add("Where", [c, scores, fill], "masked")
    elif mask == "bool":
        c = activation("keep", [b, 1, s, s], TensorProto.BOOL)
        keep = rng.random((b, 1, s, s)) < 0.7
        keep[..., 0] = True  # every row keeps a key
        feeds[c] = keep
        fill = const("fill", np.array(-1e9, np.float32))
        scores = add("Where", [c, scores, fill], "masked")
    elif mask == "causal_add":
        bias = np.where(tri, 0.0, -np.inf).astype(np.float32).reshape(1, 1, s, s)
        scores = add("Add", [scores, const("causal_add", bias)], "masked")
    elif mask is not None:
        raise ValueError(f"unknown mask {mask!r}")
    probs = add("Softmax", [scores], "probs", axis=-1)
    ctx = add("MatMul", [probs, v], "ctx")
    merged = add("Transpose", [ctx], "ctx_t", perm=[0, 2, 1, 3])
    out = add("Reshape", [merged, const("merge_shape", np.array([b, s, hd], np.int64))], "y")
    graph = helper.make_graph(
        nodes, "attention", inputs, [helper.make_tensor_value_info(out, F, [b, s, hd])], inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return model, feeds


__all__ = ["attention_model"]
