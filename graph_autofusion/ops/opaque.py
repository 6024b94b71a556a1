"""Ops the planner never fuses: data-dependent shapes, control flow, sorting, scattering.

They are listed (not left to the unknown-op fallback) so the report can say they are known.
"""

from __future__ import annotations

from .registry import OpDef, OpKind, per_output, register

for _op in (
    "NonZero",
    "TopK",
    "Resize",
    "ScatterND",
    "ScatterElements",
    "GatherND",
    "Einsum",
    "If",
    "Loop",
    "Scan",
    "NonMaxSuppression",
    "Unique",
    "LSTM",
    "GRU",
    "RNN",
    "RandomNormal",
    "RandomUniform",
    "RandomNormalLike",
    "RandomUniformLike",
    "Multinomial",
    "Shape",
    "Size",
    "ConstantOfShape",
    "Range",
    "OneHot",
    "Compress",
    "Constant",
    "EyeLike",
    "Det",
    "Bernoulli",
    "Upsample",
    "RoiAlign",
    "QuantizeLinear",
    "DequantizeLinear",
    "MatMulInteger",
    "ConvInteger",
    "QLinearConv",
    "QLinearMatMul",
    "DynamicQuantizeLinear",
    "Hardmax",
    "StringNormalizer",
    "Col2Im",
    "GridSample",
    "AffineGrid",
    "DFT",
    "STFT",
    "LRN",
    "MaxUnpool",
    "MaxRoiPool",
    "BitShift",
):
    register(OpDef(_op, OpKind.OPAQUE, per_output(1)))
