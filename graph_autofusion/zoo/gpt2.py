"""GPT-2 (Hugging Face `GPT2LMHeadModel`, eager attention, no KV cache).

Its signature patterns: `Conv1D` layers exported as Reshape → Gemm → Reshape, the fused QKV
projection cut by Split, a causal mask applied with Where, the tanh ("new") GELU, pre-norm
blocks with a final LayerNorm, and an lm head tied to the token embedding.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from .arguments import Style, check_at_most, check_divides, check_positive, check_style
from .builder import GraphBuilder
from .layers import addmm_linear, dropout, gelu_tanh, layer_norm
from .transformer import HEADS_FIRST, KEY_TRANSPOSED, attention_context, view_heads

LEAD = [("batch", 0), ("sequence", 1)]


def gpt2(
    num_layers: int = 12,
    hidden: int = 768,
    heads: int = 12,
    seq_len: int = 128,
    batch: int = 1,
    vocab: int = 50257,
    max_positions: int = 1024,
    style: Style = "torchscript",
    opset: int | None = None,
    dynamic_batch: bool = False,
    seed: int = 0,
) -> onnx.ModelProto:
    """GPT-2 small: input `input_ids` (int64, [batch, sequence]); output `logits` [batch, sequence, vocab].

    `opset` defaults to 17 (torchscript) or 18 (dynamo).
    """
    opset = opset if opset is not None else (17 if style == "torchscript" else 18)
    check_style(style, opset)
    check_positive(
        num_layers=num_layers, hidden=hidden, heads=heads, seq_len=seq_len, batch=batch, vocab=vocab,
        max_positions=max_positions,
    )  # fmt: skip
    check_divides("hidden", hidden, "heads", heads)
    check_at_most("seq_len", seq_len, "max_positions", max_positions)
    head_dim = hidden // heads
    b = GraphBuilder(
        style=style,
        opset=opset,
        seed=seed,
        sizes={"batch": batch, "sequence": seq_len},
        dynamic=("batch", "sequence") if dynamic_batch else (),
    )
    ids = b.add_input("input_ids", np.int64, ["batch", "sequence"])
    wte_value = b.normal((vocab, hidden), 0.02)
    wte = b.initializer("transformer.wte.weight", wte_value)
    x = _embeddings(b, ids, wte, hidden=hidden, max_positions=max_positions, seq_len=seq_len)
    causal_buffer = np.tril(np.ones((max_positions, max_positions), dtype=bool))[None, None]
    static_mask = (
        None
        if (b.torchscript or b.dynamic)
        else b.initializer("causal_mask", causal_buffer[..., :seq_len, :seq_len])
    )

    for i in range(num_layers):
        with b.scope("transformer"), b.scope(f"h.{i}"):
            a = layer_norm(b, x, hidden, name="ln_1", eps=1e-5)
            with b.scope("attn"):
                qkv = addmm_linear(b, a, hidden, 3 * hidden, name="c_attn", lead=LEAD)
                if b.torchscript:
                    q, k, v = b.node("Split", [qkv, b.ints([hidden] * 3)], outputs=3, axis=2)
                else:
                    q, k, v = b.node("Split", [qkv], outputs=3, axis=2, num_outputs=3)
                q = b.op("Transpose", view_heads(b, q, LEAD, heads, head_dim), perm=HEADS_FIRST)
                k = view_heads(b, k, LEAD, heads, head_dim)
                v = b.op("Transpose", view_heads(b, v, LEAD, heads, head_dim), perm=HEADS_FIRST)
                k_t = b.op("Transpose", k, perm=KEY_TRANSPOSED)
                causal = static_mask or _sliced_causal_mask(b, causal_buffer, q)
                ctx = attention_context(
                    b, q, k_t, v, lead=LEAD, hidden=hidden, divisor=_scale(b, head_dim), causal_mask=causal,
                    merge=b.torchscript,
                )  # fmt: skip
                if not b.torchscript:  # the optimizer merges view(B, S, H) and view(-1, H)
                    ctx = b.reshape(ctx, [-1, hidden])
                attn = addmm_linear(
                    b, ctx, hidden, hidden, name="c_proj", lead=LEAD, flat_input=not b.torchscript
                )
            x = b.op("Add", x, attn)
            m = layer_norm(b, x, hidden, name="ln_2", eps=1e-5)
            with b.scope("mlp"):
                h = gelu_tanh(b, addmm_linear(b, m, hidden, 4 * hidden, name="c_fc", lead=LEAD))
                h = addmm_linear(b, h, 4 * hidden, hidden, name="c_proj", lead=LEAD)
            x = b.op("Add", x, h)

    with b.scope("transformer"):
        x = layer_norm(b, x, hidden, name="ln_f", eps=1e-5, shared=True)
    with b.scope("lm_head"):
        # Tied to wte: both exporters store a transposed copy for the MatMul.
        logits = b.op("MatMul", x, b.initializer(b.param("weight.T"), wte_value.T))
    b.add_output(logits, "logits", np.float32, ["batch", "sequence", vocab])
    args = dict(
        num_layers=num_layers, hidden=hidden, heads=heads, seq_len=seq_len, batch=batch, vocab=vocab,
        max_positions=max_positions, style=style, opset=opset, dynamic_batch=dynamic_batch, seed=seed,
    )  # fmt: skip
    return b.build("gpt2", args)


def _embeddings(b: GraphBuilder, ids: str, wte: str, *, hidden: int, max_positions: int, seq_len: int) -> str:
    """wte[ids] + wpe[arange(seq)]; a static dynamo export folds the position lookup."""
    with b.scope("transformer"):
        wpe_value = b.normal((max_positions, hidden), 0.01)
        tokens = b.op("Gather", wte, ids, axis=0)
        if not b.torchscript and not b.dynamic:
            return b.op("Add", tokens, b.initializer("position_embedding", wpe_value[None, :seq_len]))
        wpe = b.initializer(b.param("wpe.weight"), wpe_value)
        if b.torchscript:
            seq = b.op("Gather", b.op("Shape", ids), b.ints(1), axis=0)
        else:
            seq = b.squeeze(b.dim("sequence"), [0])
        positions = b.unsqueeze(b.op("Range", b.ints(0), seq, b.ints(1)), [0])
        x = b.op("Add", tokens, b.op("Gather", wpe, positions, axis=0))
        return dropout(b, x, 0.1)


def _sliced_causal_mask(b: GraphBuilder, buffer: np.ndarray, q: str) -> str:
    """`bias[:, :, :seq, :seq]` of the lower-triangular buffer, seq read at run time."""
    if b.torchscript:
        seq = b.unsqueeze(b.op("Gather", b.op("Shape", q), b.ints(2), axis=0), [0])
        source = b.const(buffer, np.bool_)
    else:
        seq = b.dim("sequence")
        source = b.initializer(b.param("bias"), buffer)
    ends = b.op("Concat", seq, seq, axis=0)
    return b.op("Slice", source, b.ints([0, 0]), ends, b.ints([2, 3]))


def _scale(b: GraphBuilder, head_dim: int) -> float | str:
    """`torch.full([], v.size(-1) ** 0.5)`: TorchScript keeps Pow + ConstantOfShape + Add of constants."""
    if not b.torchscript:
        return math.sqrt(head_dim)
    root = b.op("Pow", b.const(float(head_dim)), b.const(0.5))
    zeros = b.op(
        "ConstantOfShape",
        b.ints(np.zeros(0, np.int64)),
        value=onnx.numpy_helper.from_array(np.zeros(1, np.float32)),
    )
    return b.op("Add", zeros, root)
