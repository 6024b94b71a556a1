"""BERT (Hugging Face `BertModel`, eager attention): embeddings, post-norm encoder, pooler."""

from __future__ import annotations

import math

import numpy as np
import onnx

from .arguments import Style, check_at_most, check_divides, check_positive, check_style
from .builder import GraphBuilder
from .layers import dropout, layer_norm, linear
from .transformer import HEADS_FIRST, KEY_TRANSPOSED, attention_context, feed_forward, view_heads

LEAD = [("batch", 0), ("sequence", 1)]


def bert_base(
    num_layers: int = 12,
    hidden: int = 768,
    heads: int = 12,
    seq_len: int = 128,
    batch: int = 1,
    vocab: int = 30522,
    intermediate: int | None = None,
    max_positions: int = 512,
    style: Style = "torchscript",
    opset: int | None = None,
    dynamic_batch: bool = False,
    seed: int = 0,
) -> onnx.ModelProto:
    """BERT-base: inputs `input_ids`, `attention_mask` (int64, [batch, sequence]); outputs
    `last_hidden_state` [batch, sequence, hidden] and `pooler_output` [batch, hidden].

    `opset` defaults to 17 (torchscript) or 18 (dynamo); `intermediate` to 4·hidden.
    """
    opset = opset if opset is not None else (17 if style == "torchscript" else 18)
    check_style(style, opset)
    inner = intermediate if intermediate is not None else 4 * hidden
    check_positive(
        num_layers=num_layers, hidden=hidden, heads=heads, seq_len=seq_len, batch=batch, vocab=vocab
    )
    check_positive(intermediate=inner, max_positions=max_positions)
    check_divides("hidden", hidden, "heads", heads)
    check_at_most("seq_len", seq_len, "max_positions", max_positions)
    b = GraphBuilder(
        style=style,
        opset=opset,
        seed=seed,
        sizes={"batch": batch, "sequence": seq_len},
        dynamic=("batch", "sequence") if dynamic_batch else (),
    )
    ids = b.add_input("input_ids", np.int64, ["batch", "sequence"])
    mask = b.add_input("attention_mask", np.int64, ["batch", "sequence"])

    x = _embeddings(b, ids, hidden=hidden, vocab=vocab, max_positions=max_positions, seq_len=seq_len)
    ext_mask = _extended_mask(b, mask)
    for i in range(num_layers):
        with b.scope("encoder"), b.scope(f"layer.{i}"):
            with b.scope("attention"):
                with b.scope("self"):
                    ctx = _self_attention(b, x, ext_mask, hidden=hidden, heads=heads)
                with b.scope("output"):
                    y = linear(b, ctx, hidden, hidden, name="dense", gemm=False)
                    x = layer_norm(b, b.op("Add", y, x), hidden, name="LayerNorm", eps=1e-12)
            with b.scope("ffn"):
                y = feed_forward(b, x, hidden, inner, fc1="intermediate", fc2="output")
            with b.scope("output"):
                last = i == num_layers - 1
                x = layer_norm(b, b.op("Add", y, x), hidden, name="LayerNorm", eps=1e-12, shared=last)

    with b.scope("pooler"):
        first = b.op("Gather", x, b.ints(0), axis=1)
        pooled = b.op("Tanh", linear(b, first, hidden, hidden, name="dense", gemm=True))
    b.add_output(x, "last_hidden_state", np.float32, ["batch", "sequence", hidden])
    b.add_output(pooled, "pooler_output", np.float32, ["batch", hidden])
    args = dict(
        num_layers=num_layers, hidden=hidden, heads=heads, seq_len=seq_len, batch=batch, vocab=vocab,
        intermediate=inner, max_positions=max_positions, style=style, opset=opset,
        dynamic_batch=dynamic_batch, seed=seed,
    )  # fmt: skip
    return b.build("bert_base", args)


def _self_attention(b: GraphBuilder, x: str, mask: str, *, hidden: int, heads: int) -> str:
    """Separate query/key/value Linears, heads split by view + permute, scaled by 1/sqrt(d)."""
    head_dim = hidden // heads
    q = linear(b, x, hidden, hidden, name="query", gemm=False)
    q = b.op("Transpose", view_heads(b, q, LEAD, heads, head_dim), perm=HEADS_FIRST)
    k = view_heads(b, linear(b, x, hidden, hidden, name="key", gemm=False), LEAD, heads, head_dim)
    v = linear(b, x, hidden, hidden, name="value", gemm=False)
    v = b.op("Transpose", view_heads(b, v, LEAD, heads, head_dim), perm=HEADS_FIRST)
    k_t = b.op("Transpose", k, perm=KEY_TRANSPOSED)
    return attention_context(
        b, q, k_t, v, lead=LEAD, hidden=hidden, divisor=math.sqrt(head_dim), additive_mask=mask
    )


def _embeddings(
    b: GraphBuilder, ids: str, *, hidden: int, vocab: int, max_positions: int, seq_len: int
) -> str:
    """word + token-type + position embeddings, LayerNorm, dropout.

    TorchScript slices the `position_ids` / `token_type_ids` buffers by the runtime sequence
    length and gathers; static dynamo exports fold the two constant gathers into initializers.
    """
    with b.scope("embeddings"):
        word = b.weight(b.param("word_embeddings.weight"), (vocab, hidden), 0.02)
        pos_table = b.normal((max_positions, hidden), 0.02)
        type_table = b.normal((2, hidden), 0.02)
        symbolic = b.torchscript or bool(b.dynamic)
        if symbolic:
            pos = b.initializer(b.param("position_embeddings.weight"), pos_table)
            types = b.initializer(b.param("token_type_embeddings.weight"), type_table)
            if b.torchscript:
                seq = b.unsqueeze(b.op("Gather", b.op("Shape", ids), b.ints(1), axis=0), [0])
                batch = b.unsqueeze(b.op("Gather", b.op("Shape", ids), b.ints(0), axis=0), [0])
            else:
                seq, batch = b.dim("sequence"), b.dim("batch")
            position_ids = b.const(np.arange(max_positions)[None, :], np.int64)
            type_ids = b.const(np.zeros((1, max_positions)), np.int64)
            pos_ids = b.op("Slice", position_ids, b.ints([0]), seq, b.ints([1]), b.ints([1]))
            type_ids = b.op("Slice", type_ids, b.ints([0]), seq, b.ints([1]), b.ints([1]))
            type_ids = b.op("Expand", type_ids, b.expand_shape(b.op("Concat", batch, seq, axis=0)))
            x = b.op("Add", b.op("Gather", word, ids, axis=0), b.op("Gather", types, type_ids, axis=0))
            x = b.op("Add", x, b.op("Gather", pos, pos_ids, axis=0))
        else:
            batch = b.sizes["batch"]
            folded_types = np.broadcast_to(type_table[0], (batch, seq_len, hidden))
            x = b.op(
                "Add", b.op("Gather", word, ids, axis=0), b.initializer("token_type_embedding", folded_types)
            )
            x = b.op("Add", x, b.initializer("position_embedding", pos_table[None, :seq_len]))
        x = layer_norm(b, x, hidden, name="LayerNorm", eps=1e-12)
        return dropout(b, x, 0.1)


def _extended_mask(b: GraphBuilder, mask: str) -> str:
    """(1 - mask[:, None, None, :].float()) * -10000, the additive attention mask."""
    expanded = b.unsqueeze(b.unsqueeze(mask, [1]), [2]) if b.torchscript else b.unsqueeze(mask, [1, 2])
    as_float = b.op("Cast", expanded, to=onnx.TensorProto.FLOAT)
    return b.op("Mul", b.op("Sub", b.const(1.0), as_float), b.const(-10000.0))
