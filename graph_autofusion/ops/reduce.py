"""Reductions and windowed ops: each output element combines many inputs along some axes."""

from __future__ import annotations

from .registry import NodeShapes, OpDef, OpKind, numel, per_input, register


def _window(s: NodeShapes) -> int:
    kernel = s.attrs.get("kernel_shape") or []
    size = 1
    for k in kernel:  # type: ignore[union-attr]
        size *= int(k)
    return size * numel(s.outputs[0])


for _op, _cost in [
    ("ReduceMean", 1),
    ("ReduceSum", 1),
    ("ReduceMax", 1),
    ("ReduceMin", 1),
    ("ReduceProd", 1),
    ("ReduceL1", 2),
    ("ReduceL2", 2),
    ("ReduceSumSquare", 2),
    ("ReduceLogSum", 1),
    ("ReduceLogSumExp", 10),
    ("ArgMax", 1),
    ("ArgMin", 1),
    ("Softmax", 12),
    ("LogSoftmax", 12),
    ("LayerNormalization", 8),
    ("GlobalAveragePool", 1),
    ("GlobalMaxPool", 1),
    ("InstanceNormalization", 8),
    ("GroupNormalization", 8),
    ("LpNormalization", 3),
    ("MeanVarianceNormalization", 8),
    ("CumSum", 1),
]:
    register(OpDef(_op, OpKind.REDUCE, per_input(_cost), tags=frozenset({"reduction"})))

for _op in ("MaxPool", "AveragePool", "LpPool"):
    register(OpDef(_op, OpKind.REDUCE, _window, tags=frozenset({"pool"})))
