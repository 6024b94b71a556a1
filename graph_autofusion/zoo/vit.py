"""ViT-B/16 (timm `VisionTransformer` layout, eager attention).

Patch embedding as a strided Conv, flatten + transpose to tokens, a class token concatenated in
front, learned position embeddings, pre-norm blocks with a packed QKV projection (one Linear,
Reshape to (B, N, 3, h, d), Transpose(2, 0, 3, 1, 4), then unbind), a final LayerNorm and a
classification head on token 0.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from .arguments import Style, check_divides, check_positive, check_style
from .builder import GraphBuilder
from .layers import dropout, layer_norm, linear
from .transformer import SWAP_LAST, attention_context, feed_forward


def vit_b16(
    image_size: int = 224,
    patch: int = 16,
    num_layers: int = 12,
    hidden: int = 768,
    heads: int = 12,
    mlp_dim: int | None = None,
    num_classes: int = 1000,
    batch: int = 1,
    channels: int = 3,
    style: Style = "torchscript",
    opset: int | None = None,
    dynamic_batch: bool = False,
    seed: int = 0,
) -> onnx.ModelProto:
    """ViT-B/16: input `input` [batch, channels, image, image]; output `logits` [batch, num_classes].

    `opset` defaults to 17 (torchscript) or 18 (dynamo); `mlp_dim` to 4·hidden.
    """
    opset = opset if opset is not None else (17 if style == "torchscript" else 18)
    check_style(style, opset)
    inner = mlp_dim if mlp_dim is not None else 4 * hidden
    check_positive(
        image_size=image_size, patch=patch, num_layers=num_layers, hidden=hidden, heads=heads,
        mlp_dim=inner, num_classes=num_classes, batch=batch, channels=channels,
    )  # fmt: skip
    check_divides("image_size", image_size, "patch", patch)
    check_divides("hidden", hidden, "heads", heads)
    head_dim = hidden // heads
    grid = image_size // patch
    tokens = grid * grid + 1
    lead = [("batch", 0), tokens]
    b = GraphBuilder(
        style=style,
        opset=opset,
        seed=seed,
        sizes={"batch": batch},
        dynamic=("batch",) if dynamic_batch else (),
    )
    image = b.add_input("input", np.float32, ["batch", channels, image_size, image_size])

    with b.scope("patch_embed"):
        fan_in = channels * patch * patch
        w = b.weight(b.param("proj.weight"), (hidden, channels, patch, patch), 1.0 / math.sqrt(fan_in))
        bias = b.weight(b.param("proj.bias"), (hidden,), 0.02)
        x = b.op(
            "Conv", image, w, bias, dilations=[1, 1], group=1, kernel_shape=[patch, patch],
            pads=[0, 0, 0, 0], strides=[patch, patch],
        )  # fmt: skip
        x = b.op("Transpose", _flatten_spatial(b, x, hidden), perm=[0, 2, 1])
    cls_value = b.normal((1, 1, hidden), 0.02)
    if b.torchscript or b.dynamic:
        shape = b.shape_of(x, [("batch", 0), 1, hidden])
        cls = b.op("Expand", b.initializer("cls_token", cls_value), b.expand_shape(shape))
    else:
        cls = b.initializer("cls_token_expanded", np.broadcast_to(cls_value, (batch, 1, hidden)))
    x = b.op("Concat", cls, x, axis=1)
    x = dropout(b, b.op("Add", x, b.weight("pos_embed", (1, tokens, hidden), 0.02)), 0.0)

    for i in range(num_layers):
        with b.scope("blocks"), b.scope(f"blocks.{i}"):
            a = layer_norm(b, x, hidden, name="norm1", eps=1e-6)
            with b.scope("attn"):
                qkv = linear(b, a, hidden, 3 * hidden, name="qkv", gemm=False)
                qkv = b.op("Transpose", b.reshape(qkv, [*lead, 3, heads, head_dim]), perm=[2, 0, 3, 1, 4])
                q, k, v = _unbind3(b, qkv)
                q = b.op("Mul", q, b.const(head_dim**-0.5))
                k_t = b.op("Transpose", k, perm=SWAP_LAST)
                ctx = attention_context(b, q, k_t, v, lead=lead, hidden=hidden)
                x = b.op("Add", x, linear(b, ctx, hidden, hidden, name="proj", gemm=False))
            m = layer_norm(b, x, hidden, name="norm2", eps=1e-6)
            with b.scope("mlp"):
                x = b.op("Add", x, feed_forward(b, m, hidden, inner, fc1="fc1", fc2="fc2"))

    x = layer_norm(b, x, hidden, name="norm", eps=1e-6, shared=True)
    first = b.op("Gather", x, b.ints(0), axis=1)
    logits = linear(b, first, hidden, num_classes, name="head", gemm=True)
    b.add_output(logits, "logits", np.float32, ["batch", num_classes])
    args = dict(
        image_size=image_size, patch=patch, num_layers=num_layers, hidden=hidden, heads=heads,
        mlp_dim=inner, num_classes=num_classes, batch=batch, channels=channels, style=style,
        opset=opset, dynamic_batch=dynamic_batch, seed=seed,
    )  # fmt: skip
    return b.build("vit_b16", args)


def _unbind3(b: GraphBuilder, qkv: str) -> list[str]:
    """`qkv.unbind(0)`: Split + Squeeze (TorchScript) or Slice + Squeeze per output (dynamo)."""
    if b.torchscript:
        parts = b.node("Split", [qkv, b.ints([1, 1, 1])], outputs=3, axis=0)
    else:
        parts = [b.op("Slice", qkv, b.ints([i]), b.ints([i + 1]), b.ints([0])) for i in range(3)]
    return [b.squeeze(p, [0]) for p in parts]


def _flatten_spatial(b: GraphBuilder, x: str, hidden: int) -> str:
    """`x.flatten(2)`: TorchScript keeps x.shape[:2] via Shape → Slice → Concat(-1)."""
    if not b.torchscript:
        return b.reshape(x, [("batch", 0), hidden, -1])
    lead = b.op("Slice", b.op("Shape", x), b.ints([0]), b.ints([2]), b.ints([0]))
    return b.reshape_to(x, b.op("Concat", lead, b.ints([-1]), axis=0))
