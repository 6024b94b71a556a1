"""Export a plan as an ONNX model: each fused group becomes one node of domain
`ai.graph_autofusion` whose body is a model-local function (docs/fused-format.md).

Function bodies use canonical local names (x0.., t0.., y0..) and carry small constants inline,
so the same group repeated across layers exports — and later compiles — as one function.
"""

from __future__ import annotations

import hashlib
import json

import onnx
from onnx import helper, numpy_helper

from .ir import Graph
from .onnx_utils import node_inputs
from .plan import Plan, PlannedGroup
from .plan.anchor_match import match_anchor, match_chain
from .plan.cost import group_boundary
from .plan.reduction_match import group_spec

DOMAIN = "ai.graph_autofusion"
INLINE_CONSTANT_ELEMENTS = 64  # initializers up to this size are copied into function bodies


def _value_info(graph: Graph, name: str, local: str) -> onnx.ValueInfoProto:
    v = graph.values[name]
    return helper.make_tensor_value_info(local, v.elem_type, list(v.shape) if v.shape is not None else None)


def _function(
    graph: Graph, group: PlannedGroup, opset: int
) -> tuple[onnx.FunctionProto, list[str], list[str]]:
    inputs, outputs = group_boundary(graph, group.members, group.private)
    inline = [
        x
        for x in inputs
        if graph.values[x].is_const
        and (graph.values[x].shape is not None)
        and _numel(graph.values[x].shape) <= INLINE_CONSTANT_ELEMENTS
    ]
    call_inputs = [x for x in inputs if x not in inline]
    names: dict[str, str] = {x: f"x{i}" for i, x in enumerate(call_inputs)}
    names.update({y: f"y{i}" for i, y in enumerate(outputs)})
    body: list[onnx.NodeProto] = []
    for k, x in enumerate(inline):
        names[x] = f"c{k}"
        tensor = numpy_helper.from_array(numpy_helper.to_array(graph.initializers[x]), name=f"c{k}")
        body.append(helper.make_node("Constant", [], [f"c{k}"], name=f"const{k}", value=tensor))
    temp = 0
    value_info = []
    for j, i in enumerate(group.members):
        proto = graph.nodes[i].proto
        for o in proto.output:
            if o and o not in names:
                names[o] = f"t{temp}"
                temp += 1
                value_info.append(_value_info(graph, o, names[o]))
        node = onnx.NodeProto()
        node.CopyFrom(proto)
        node.name = f"n{j}"
        node.doc_string = ""
        del node.input[:]
        node.input.extend(names[x] if x else "" for x in proto.input)
        del node.output[:]
        node.output.extend(names[o] if o else "" for o in proto.output)
        body.append(node)
    doc: dict[str, object] = {"pattern": "+".join(group.patterns) or "auto", "template": group.template}
    # The planner's typed match, in the body's local names (docs/fused-format.md).
    local_nodes = {graph.nodes[i].proto.name: f"n{j}" for j, i in enumerate(group.members)}
    if group.template == "anchor":
        match = match_anchor(group_spec(graph, group.members, group.private))
        doc["match"] = match.to_json(tensor=lambda t: names.get(t, t), node=lambda n: local_nodes.get(n, n))
    elif group.template == "anchor_chain":
        chain = match_chain(group_spec(graph, group.members, group.private))
        doc["match"] = chain.to_json(node=lambda n: local_nodes.get(n, n))
    template_info = json.dumps(doc, sort_keys=True)
    signature = hashlib.sha256()
    for x in call_inputs:
        signature.update(_value_info(graph, x, "").SerializeToString())
    for y in outputs:
        signature.update(_value_info(graph, y, "").SerializeToString())
    for n in body:
        signature.update(n.SerializeToString())
    for vi in value_info:
        signature.update(vi.SerializeToString())
    signature.update(template_info.encode())
    fn = helper.make_function(
        DOMAIN,
        f"fused_{group.template}_{signature.hexdigest()[:12]}",
        [names[x] for x in call_inputs],
        [names[y] for y in outputs],
        body,
        [helper.make_opsetid("", opset)],
    )
    fn.value_info.extend(value_info)
    fn.doc_string = template_info
    return fn, call_inputs, outputs


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def export(graph: Graph, plan: Plan) -> onnx.ModelProto:
    src = graph.model
    opset = next(o.version for o in src.opset_import if o.domain in ("", "ai.onnx"))
    nodes: list[onnx.NodeProto] = []
    functions: dict[str, onnx.FunctionProto] = {}
    fused_index = 0
    for group in plan.groups:
        if len(group.members) == 1:
            node = onnx.NodeProto()
            node.CopyFrom(graph.nodes[group.members[0]].proto)
            nodes.append(node)
            continue
        fn, call_inputs, outputs = _function(graph, group, opset)
        functions.setdefault(fn.name, fn)
        members = [graph.nodes[i].name for i in group.members]
        node = helper.make_node(fn.name, call_inputs, outputs, name=f"fused_{fused_index}", domain=DOMAIN)
        node.doc_string = json.dumps({"pattern": "+".join(group.patterns) or "auto", "members": members})
        nodes.append(node)
        fused_index += 1
    # node_inputs: a weight read only from inside an If/Loop/Scan body is still needed.
    visible = {x for n in nodes for x in [*node_inputs(n), *n.output] if x}
    g = src.graph
    initializers = [t for t in g.initializer if t.name in visible or t.name in {o.name for o in g.output}]
    value_info = [vi for vi in g.value_info if vi.name in visible]
    new_graph = helper.make_graph(
        nodes, g.name or "fused", list(g.input), list(g.output), initializers, value_info=value_info
    )
    opsets = [o for o in src.opset_import if o.domain != DOMAIN] + [helper.make_opsetid(DOMAIN, 1)]
    model = helper.make_model(
        new_graph,
        opset_imports=opsets,
        functions=list(functions.values()),
        producer_name="graph_autofusion",
        ir_version=10,
    )  # functions with value_info need IR 10; onnxruntime reads it
    for prop in src.metadata_props:
        model.metadata_props.add().CopyFrom(prop)
    return model
