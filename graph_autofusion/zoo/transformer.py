"""Pieces of eager multi-head attention shared by the BERT, GPT-2 and ViT builders.

They follow the Hugging Face / timm eager code paths (no fused scaled_dot_product_attention), which
is what both exporters turn into MatMul / Div / Add-or-Where / Softmax / MatMul plus the
Reshape/Transpose pairs around them.
"""

from __future__ import annotations

from collections.abc import Sequence

from .builder import DimSpec, GraphBuilder
from .layers import gelu_erf, linear

#: Transpose permutations exporters emit: (B,S,h,d)→(B,h,S,d), the key's fused double transpose
#: (B,S,h,d)→(B,h,d,S), and the last-two-axes swap of an already head-major key.
HEADS_FIRST = [0, 2, 1, 3]
KEY_TRANSPOSED = [0, 2, 3, 1]
SWAP_LAST = [0, 1, 3, 2]


def view_heads(b: GraphBuilder, x: str, lead: Sequence[DimSpec], heads: int, head_dim: int) -> str:
    """`x.view(*lead, heads, head_dim)` (the permute that follows is the caller's)."""
    return b.reshape(x, [*lead, heads, head_dim])


def attention_context(
    b: GraphBuilder,
    q: str,
    k_t: str,
    v: str,
    *,
    lead: Sequence[DimSpec],
    hidden: int,
    divisor: float | str | None = None,
    additive_mask: str | None = None,
    causal_mask: str | None = None,
    merge: bool = True,
) -> str:
    """softmax(q·kᵀ [/ divisor] [+ mask | where(causal)])·v, heads merged back to (*lead, hidden).

    `q` and `v` are head-major (B,h,S,d), `k_t` is (B,h,d,S).  `divisor` is a constant or the name
    of a tensor that holds it.  With `merge=False` the context is
    returned as (B,S,h,d), for a caller whose next reshape absorbs the merge.
    """
    scores = b.op("MatMul", q, k_t)
    if divisor is not None:
        scores = b.op("Div", scores, divisor if isinstance(divisor, str) else b.const(divisor))
    if additive_mask is not None:
        scores = b.op("Add", scores, additive_mask)
    if causal_mask is not None:
        scores = b.op("Where", causal_mask, scores, b.const(-3.4028234663852886e38))
    probs = b.op("Softmax", scores, axis=-1)
    context = b.op("Transpose", b.op("MatMul", probs, v), perm=HEADS_FIRST)
    return b.reshape(context, [*lead, hidden]) if merge else context


def feed_forward(b: GraphBuilder, x: str, hidden: int, inner: int, *, fc1: str, fc2: str) -> str:
    """Linear → exact GELU → Linear on a (B,S,H) activation."""
    h = gelu_erf(b, linear(b, x, hidden, inner, name=fc1, gemm=False))
    return linear(b, h, inner, hidden, name=fc2, gemm=False)
