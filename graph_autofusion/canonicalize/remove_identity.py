"""Pass `remove_identity`: drop `Identity` and inference-mode `Dropout` nodes.

Their readers are rewired to the node's input.  When the node's output is a graph output, the graph
keeps its output name: the *producer* of the input is renamed instead.  That is impossible when the
input is a graph input, a constant or itself a graph output, and then the node stays.  A Dropout
whose mask is read, or which may run in training mode, stays too.

One sweep in topological order with an alias map (removed name → surviving name) and one rewiring
pass at the end, so the cost stays linear even for exports with hundreds of Identity nodes.
"""

from __future__ import annotations

from onnx import NodeProto

from ..onnx_utils import outer_scope_inputs, subgraphs
from ._graph import DEFAULT_DOMAINS, WorkGraph, rename_in_graph


def remove_identity(work: WorkGraph) -> int:
    """Remove what can be removed; returns the number of nodes removed."""
    graph_outputs = set(work.output_names)
    consumers = work.consumers()
    producers = work.producers()
    alias: dict[str, str] = {}

    def resolve(name: str) -> str:
        while name in alias:
            name = alias[name]
        return name

    kept: list[NodeProto] = []
    for node in work.nodes:
        if not _is_identity(work, node, consumers, graph_outputs):
            kept.append(node)
            continue
        source, target = resolve(node.input[0]), node.output[0]
        if target not in graph_outputs:
            alias[target] = source
            continue
        producer = producers.get(source)
        if producer is None or source in graph_outputs:
            node.input[0] = source
            kept.append(node)  # source is an input, a constant or an output itself: keep the copy
            continue
        producer.output[list(producer.output).index(source)] = target
        producers[target] = producer
        del producers[source]
        if source in work.types:
            work.types[target] = work.types[source]
        alias[source] = target

    if alias:
        for node in kept:
            for i, name in enumerate(node.input):
                if name in alias:
                    node.input[i] = resolve(name)
            if any(s for s in subgraphs(node)):
                for old in outer_scope_inputs(node) & alias.keys():
                    for graph in subgraphs(node):
                        rename_in_graph(graph, old, resolve(old))
    removed = len(work.nodes) - len(kept)
    work.nodes = kept
    return removed


def _is_identity(
    work: WorkGraph, node: NodeProto, consumers: dict[str, list[NodeProto]], graph_outputs: set[str]
) -> bool:
    if node.domain not in DEFAULT_DOMAINS or not node.input or not node.input[0] or not node.output[0]:
        return False
    if node.op_type == "Identity":
        return True
    if node.op_type != "Dropout":
        return False
    if len(node.output) > 1 and node.output[1]:
        mask = node.output[1]
        if mask in graph_outputs or consumers.get(mask):
            return False
    if len(node.input) > 2 and node.input[2]:
        # training_mode (opset 12+): only a constant False makes the node an identity.
        mode = node.input[2]
        if not work.is_constant(mode) or bool(work.array(mode).any()):
            return False
    return True
