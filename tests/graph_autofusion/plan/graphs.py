"""Tiny hand-built ONNX graphs for planner tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from graph_autofusion import Pattern

F = TensorProto.FLOAT


def model(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, F, None) for n in outputs],
        [
            numpy_helper.from_array(
                v if isinstance(v, np.ndarray) else np.asarray(v, dtype=np.float32), name=k
            )
            for k, v in inits
        ],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    inferred = onnx.shape_inference.infer_shapes(m)
    types = {vi.name: vi.type for vi in [*inferred.graph.value_info, *inferred.graph.output]}
    for out in m.graph.output:
        if out.name in types and types[out.name].tensor_type.HasField("shape"):
            out.type.CopyFrom(types[out.name])
    return m


def node(op, inputs, outputs, name, **attrs) -> onnx.NodeProto:
    return helper.make_node(op, inputs, outputs, name=name, **attrs)


class Propose(Pattern):
    """A user pattern proposing fixed node sets, so legality answers for exactly these groups."""

    name = "propose"

    def __init__(self, *groups: list[str]) -> None:
        self.groups = groups

    def match(self, graph):
        return [list(g) for g in self.groups]
