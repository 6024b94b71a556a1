"""Reductions and windowed ops: each output element combines many inputs along some axes."""

from __future__ import annotations

from .registry import NodeShapes, OpDef, OpKind, numel, per_input, register


def _window(s: NodeShapes) -> int:
    kernel = s.attrs.get("kernel_shape") or []
    size = 1
    for k in kernel:  # type: ignore[union-attr]
        size *= int(k)
    return size * numel(s.outputs[0])


# Tags say which kernel template computes an op (lowering reads them; no backend lists ops):
# "row"  the row template (lower/reduction.py) rewrites it into accumulators over trailing axes,
# "scan" one output element folds an axis of the input (ArgMax, CumSum: lower/values.py),
# "pool" one output element folds a window (lower/values.py).
for _op, _cost, _tag in [
    ("ReduceMean", 1, "row"),
    ("ReduceSum", 1, "row"),
    ("ReduceMax", 1, "row"),
    ("ReduceMin", 1, "row"),
    ("ReduceProd", 1, "row"),
    ("ReduceL1", 2, "row"),
    ("ReduceL2", 2, "row"),
    ("ReduceSumSquare", 2, "row"),
    ("ReduceLogSum", 1, "row"),
    ("ReduceLogSumExp", 10, "row"),
    ("ArgMax", 1, "scan"),
    ("ArgMin", 1, "scan"),
    ("Softmax", 12, "row"),
    ("LogSoftmax", 12, "row"),
    ("LayerNormalization", 8, "row"),
    ("GlobalAveragePool", 1, "row"),
    ("GlobalMaxPool", 1, "row"),
    ("InstanceNormalization", 8, "row"),
    ("GroupNormalization", 8, ""),
    ("LpNormalization", 3, "row"),
    ("MeanVarianceNormalization", 8, "row"),
    ("CumSum", 1, "scan"),
]:
    register(OpDef(_op, OpKind.REDUCE, per_input(_cost), tags=frozenset({"reduction", _tag} - {""})))

for _op in ("MaxPool", "AveragePool", "LpPool"):
    register(OpDef(_op, OpKind.REDUCE, _window, tags=frozenset({"pool"})))
