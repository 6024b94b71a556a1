"""Injective ops: every output element reads one input element through an index map."""

from __future__ import annotations

from .registry import OpDef, OpKind, per_output, register

for _op in (
    "Transpose",
    "Slice",
    "Concat",
    "Gather",
    "Expand",
    "Pad",
    "Tile",
    "Split",
    "DepthToSpace",
    "SpaceToDepth",
    "GatherElements",
    "Trilu",
    "ReverseSequence",
):
    register(OpDef(_op, OpKind.INJECTIVE, per_output(0)))
