"""The op registry covers every op the zoo and real torch exports use, with sane kinds and costs."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

import graph_autofusion as gaf
from graph_autofusion.kernel_ir import DType
from graph_autofusion.kernel_ir import nodes as ir
from graph_autofusion.ops import OpKind, lookup, registered_ops
from graph_autofusion.ops.registry import NodeShapes

EXPORTS = Path(__file__).resolve().parents[2] / "data" / "torch_exports"
SMALL = gaf.zoo.TINY


def _models() -> list[tuple[str, onnx.ModelProto]]:
    out = [
        (f"{n}/{s}", gaf.zoo.build(n, style=s, **kw))
        for n, kw in SMALL.items()
        for s in ("torchscript", "dynamo")
    ]
    out += [(p.name, onnx.load(p)) for p in sorted(EXPORTS.glob("*.onnx"))]
    return out


def test_every_used_op_is_registered() -> None:
    known = registered_ops()
    missing = {
        (name, node.op_type)
        for name, model in _models()
        for node in model.graph.node
        if (node.domain if node.domain != "ai.onnx" else "", node.op_type) not in known
    }
    assert not missing


def test_unknown_ops_are_opaque_not_errors() -> None:
    op = lookup("SomethingNew", "com.example")
    assert op.kind == OpKind.OPAQUE
    assert op.cost(NodeShapes([(2, 3)], [(2, 3)], [4], [4], {})).bytes == 48


@pytest.mark.parametrize(
    ("op", "kind"),
    [
        ("Reshape", OpKind.VIEW),
        ("Relu", OpKind.ELEMENTWISE),
        ("Add", OpKind.BROADCAST),
        ("Transpose", OpKind.INJECTIVE),
        ("Softmax", OpKind.REDUCE),
        ("MaxPool", OpKind.REDUCE),
        ("Conv", OpKind.ANCHOR),
        ("MatMul", OpKind.ANCHOR),
        ("NonZero", OpKind.OPAQUE),
    ],
)
def test_kinds(op: str, kind: OpKind) -> None:
    assert lookup(op).kind == kind


def test_costs_from_shapes() -> None:
    mm = lookup("MatMul").cost(NodeShapes([(8, 16), (16, 4)], [(8, 4)], [4, 4], [4], {}))
    assert mm.flops == 2 * 8 * 16 * 4 and mm.bytes == 4 * (8 * 16 + 16 * 4 + 8 * 4)
    conv = lookup("Conv").cost(NodeShapes([(1, 3, 8, 8), (4, 3, 3, 3)], [(1, 4, 8, 8)], [4, 4], [4], {}))
    assert conv.flops == 2 * (4 * 8 * 8) * (3 * 3 * 3)


def test_elementwise_ops_carry_ir_formulas() -> None:
    for (_, name), op in registered_ops().items():
        if op.kind in (OpKind.ELEMENTWISE, OpKind.BROADCAST) and "index_rule" not in op.tags:
            assert op.scalar is not None, name
    x = ir.var("x", DType.F32)
    relu = lookup("Relu").scalar([x], {})
    assert str(relu) == "select(gt(x, 0.0), x, 0.0)" and relu.dtype is DType.F32
    # the element type comes from the arguments: the same formula on int64 compares with 0
    assert str(lookup("Relu").scalar([ir.var("n")], {})) == "select(gt(n, 0), n, 0)"
