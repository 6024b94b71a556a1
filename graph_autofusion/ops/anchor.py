"""Anchors: compute-bound contractions that take an elementwise epilogue in the same kernel."""

from __future__ import annotations

from .registry import NodeShapes, OpDef, OpKind, numel, register


def _matmul_flops(s: NodeShapes) -> int:
    a = s.inputs[0] or ()
    k = a[-1] if a else 1
    return 2 * numel(s.outputs[0]) * int(k)


def _gemm_flops(s: NodeShapes) -> int:
    a = s.inputs[0] or (1, 1)
    k = a[0] if s.attrs.get("transA") else a[-1]
    return 2 * numel(s.outputs[0]) * int(k)


def _conv_flops(s: NodeShapes) -> int:
    w = s.inputs[1] or ()
    per_output = 1
    for d in w[1:]:  # (Cin/group, kH, kW)
        per_output *= int(d)
    return 2 * numel(s.outputs[0]) * per_output


def _conv_transpose_flops(s: NodeShapes) -> int:
    w = s.inputs[1] or ()
    x = s.inputs[0] or ()
    per_input = 1
    for d in w[1:]:  # (Cout/group, kH, kW)
        per_input *= int(d)
    return 2 * numel(x) * per_input


register(OpDef("MatMul", OpKind.ANCHOR, _matmul_flops, tags=frozenset({"contraction"})))
register(OpDef("Gemm", OpKind.ANCHOR, _gemm_flops, tags=frozenset({"contraction"})))
register(OpDef("Conv", OpKind.ANCHOR, _conv_flops, tags=frozenset({"contraction", "conv"})))
register(
    OpDef("ConvTranspose", OpKind.ANCHOR, _conv_transpose_flops, tags=frozenset({"contraction", "conv"}))
)
