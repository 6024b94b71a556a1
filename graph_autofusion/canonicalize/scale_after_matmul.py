"""Pass `scale_after_matmul`: a constant scalar factor on a MatMul operand moves to its result.

    MatMul(q · s, kᵀ) = MatMul(q, kᵀ) · s          MatMul(q / s, kᵀ) = MatMul(q, kᵀ) / s

timm's ViT scales Q before the score product, and the export of torch's
scaled_dot_product_attention scales both Q and Kᵀ by √s, where BERT and GPT-2 divide the scores
after it. A contraction reads a stride change of its operand in place, but not arithmetic, so a
scaled operand costs a kernel of its own, while the scaled result is an epilogue of the
contraction that computes it. The factor may sit above views of the operand (a Transpose of the
scaled key). When both operands are scaled the two factors become one, multiplied in float64 and
rounded once.
"""

from __future__ import annotations

import numpy as np
from onnx import NodeProto, helper

from ..onnx_utils import static_shape
from ._graph import DEFAULT_DOMAINS, WorkGraph

_VIEWS = frozenset({"Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze"})


def scale_after_matmul(work: WorkGraph) -> int:
    """Move every movable factor; returns how many scaling nodes were moved."""
    producers = work.producers()
    consumers = work.consumers()
    graph_outputs = set(work.output_names)
    removed: set[int] = set()
    after: dict[int, NodeProto] = {}  # id(MatMul) -> the scaling node that now follows it
    for matmul in work.nodes:
        if matmul.op_type != "MatMul" or matmul.domain not in DEFAULT_DOMAINS:
            continue
        if matmul.output[0] not in work.types:
            continue
        factors: list[tuple[NodeProto, NodeProto, int, float, bool]] = []
        for slot in (0, 1):
            found = _scaled_operand(work, matmul, slot, producers, consumers, graph_outputs)
            if found is not None:
                factors.append(found)
        if not factors:
            continue
        for scale, reader, position, _, _ in factors:
            reader.input[position] = _data_input(work, scale)
            removed.add(id(scale))
        after[id(matmul)] = _scaling(work, matmul, [(f, div) for *_, f, div in factors])
    if not removed:
        return 0
    nodes: list[NodeProto] = []
    for node in work.nodes:
        if id(node) in removed:
            continue
        nodes.append(node)
        if id(node) in after:
            nodes.append(after[id(node)])
    work.nodes = nodes
    return len(removed)


def _scalar(work: WorkGraph, name: str) -> float | None:
    if not work.is_constant(name):
        return None
    value = work.array(name)
    if value.size != 1 or value.dtype.kind != "f":
        return None
    return float(value.reshape(-1)[0])


def _data_input(work: WorkGraph, scale: NodeProto) -> str:
    """The scaled tensor of a Mul/Div by a constant scalar."""
    if scale.op_type == "Mul" and _scalar(work, scale.input[1]) is None:
        return scale.input[1]
    return scale.input[0]


def _scaled_operand(
    work: WorkGraph,
    matmul: NodeProto,
    slot: int,
    producers: dict[str, NodeProto],
    consumers: dict[str, list[NodeProto]],
    graph_outputs: set[str],
) -> tuple[NodeProto, NodeProto, int, float, bool] | None:
    """(scaling node, the node reading it, input position there, factor, is a division) when
    operand `slot` is a scaled tensor seen through views that nothing else reads."""
    reader, position = matmul, slot
    value = matmul.input[slot]
    while True:
        if value in graph_outputs or len(consumers.get(value, ())) != 1:
            return None
        node = producers.get(value)
        if node is None or node.domain not in DEFAULT_DOMAINS:
            return None
        if node.op_type in _VIEWS:
            reader, position, value = node, 0, node.input[0]
            continue
        break
    if node.op_type not in ("Mul", "Div") or len(node.input) != 2:
        return None
    if node.op_type == "Div":
        factor, data = _scalar(work, node.input[1]), node.input[0]
    else:
        factor = _scalar(work, node.input[1])
        data = node.input[0]
        if factor is None:
            factor, data = _scalar(work, node.input[0]), node.input[1]
    if factor is None or work.is_constant(data):
        return None
    kept, scaled = work.types.get(data), work.types.get(value)
    if kept is None or scaled is None:
        return None
    if static_shape(kept) is None or static_shape(kept) != static_shape(scaled):
        return None  # the factor broadcasts the operand to a higher rank
    if kept.tensor_type.elem_type != scaled.tensor_type.elem_type:
        return None
    return node, reader, position, factor, node.op_type == "Div"


def _scaling(work: WorkGraph, matmul: NodeProto, factors: list[tuple[float, bool]]) -> NodeProto:
    """The node that applies `factors` to the MatMul's result, under the result's old name."""
    result = matmul.output[0]
    raw = work.fresh_name(f"{result}_unscaled")
    matmul.output[0] = raw
    work.types[raw] = work.types[result]
    dtype = helper.tensor_dtype_to_np_dtype(work.types[result].tensor_type.elem_type)
    if len(factors) == 1:
        value, divide = factors[0]
        op = "Div" if divide else "Mul"
    else:
        value, op = 1.0, "Mul"
        for factor, divide in factors:
            value = value / factor if divide else value * factor
    constant = work.fresh_name(f"{result}_scale")
    work.set_constant(constant, np.array(value, dtype=np.float64).astype(dtype))
    name = f"{matmul.name or 'matmul'}_scale"
    return helper.make_node(op, [raw, constant], [result], name=name)
