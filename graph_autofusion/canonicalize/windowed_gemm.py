"""Pass `windowed_gemm`: a Gemm whose input is a window of another tensor becomes MatMul + Add.

    LayerNorm → x[:, 0] → Gemm(W, b, transB=1)   →   LayerNorm → Slice → Squeeze → MatMul(Wᵀ) → Add(b)

BERT's pooler and ViT's classification head read the class token and apply a Linear, which the
exporters write as a Gemm on a 2-D input. The planner lets a MatMul read its operand through a
window and a stride change (the token is every S-th row of the normalized sequence), but not a
Gemm, so the selected token became a copy kernel of its own. With constant weights the two forms
are one contraction: B is transposed (and scaled by alpha) once here, the bias (times beta)
becomes the Add that the contraction's epilogue applies. Gemms reading a whole tensor stay.
"""

from __future__ import annotations

import numpy as np
from onnx import NodeProto, helper

from ._graph import DEFAULT_DOMAINS, WorkGraph

_VIEWS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})


def windowed_gemm(work: WorkGraph) -> int:
    """Rewrite every qualifying Gemm; returns how many were rewritten."""
    producers = work.producers()

    def rewrite(node: NodeProto) -> list[NodeProto] | None:
        return _rewrite(work, node) if _windowed(node.input[0], producers) else None

    return work.replace_each("Gemm", rewrite)


def _windowed(value: str, producers: dict[str, NodeProto]) -> bool:
    node = producers.get(value)
    while node is not None and node.domain in DEFAULT_DOMAINS and node.op_type in _VIEWS:
        node = producers.get(node.input[0])
    return node is not None and node.domain in DEFAULT_DOMAINS and node.op_type == "Slice"


def _rewrite(work: WorkGraph, gemm: NodeProto) -> list[NodeProto] | None:
    attrs = {a.name: helper.get_attribute_value(a) for a in gemm.attribute}
    if attrs.get("transA", 0):
        return None
    weight = gemm.input[1]
    bias = gemm.input[2] if len(gemm.input) > 2 and gemm.input[2] else None
    if not work.is_constant(weight) or (bias is not None and not work.is_constant(bias)):
        return None
    if gemm.output[0] not in work.types:
        return None
    w = work.array(weight)
    if w.ndim != 2 or w.dtype.kind != "f":
        return None
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))  # type: ignore[arg-type]
    matrix = w.T if attrs.get("transB", 0) else w
    if alpha != 1.0:
        matrix = (matrix.astype(np.float64) * alpha).astype(w.dtype)
    base = gemm.name or gemm.output[0]
    out = gemm.output[0]
    name = work.fresh_name(f"{weight}_matmul")
    work.set_constant(name, np.ascontiguousarray(matrix))
    if bias is None:
        return [helper.make_node("MatMul", [gemm.input[0], name], [out], name=f"{base}_matmul")]
    b = work.array(bias)
    if beta != 1.0:
        b = (b.astype(np.float64) * beta).astype(b.dtype)
    bias_name = work.fresh_name(f"{bias}_add")
    work.set_constant(bias_name, np.ascontiguousarray(b))
    product = work.fresh_name(f"{out}_product")
    work.types[product] = work.types[out]
    return [
        helper.make_node("MatMul", [gemm.input[0], name], [product], name=f"{base}_matmul"),
        helper.make_node("Add", [product, bias_name], [out], name=f"{base}_bias"),
    ]
