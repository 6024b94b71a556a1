"""Pass `remove_identity`: drop `Identity` and inference-mode `Dropout` nodes.

Their readers are rewired to the node's input.  When the node's output is a graph output, the graph
keeps its output name: the *producer* of the input is renamed instead.  That is impossible when the
input is a graph input, a constant or itself a graph output, and then the node stays.  A Dropout
whose mask is read, or which may run in training mode, stays too.
"""

from __future__ import annotations

from onnx import NodeProto

from ._graph import WorkGraph

_DEFAULT = ("", "ai.onnx")


def remove_identity(work: WorkGraph) -> int:
    """Remove what can be removed; returns the number of nodes removed."""
    removed = 0
    graph_outputs = set(work.output_names)
    changed = True
    while changed:  # one removal can unblock another (Identity → Identity → output)
        changed = False
        consumers = work.consumers()
        producers = work.producers()
        for node in list(work.nodes):
            if not _is_identity(work, node, consumers, graph_outputs):
                continue
            source, target = node.input[0], node.output[0]
            if target not in graph_outputs:
                work.nodes.remove(node)
                work.rename_uses(target, source)
            else:
                producer = producers.get(source)
                if producer is None or source in graph_outputs or producer is node:
                    continue
                work.nodes.remove(node)
                producer.output[list(producer.output).index(source)] = target
                work.rename_uses(source, target)
            removed += 1
            changed = True
            break
    return removed


def _is_identity(
    work: WorkGraph, node: NodeProto, consumers: dict[str, list[NodeProto]], graph_outputs: set[str]
) -> bool:
    if node.domain not in _DEFAULT or not node.input or not node.input[0] or not node.output[0]:
        return False
    if node.op_type == "Identity":
        return True
    if node.op_type != "Dropout":
        return False
    if len(node.output) > 1 and node.output[1]:
        mask = node.output[1]
        if mask in graph_outputs or consumers.get(mask):
            return False
    if any(attr.name == "is_test" and attr.i == 0 for attr in node.attribute) and work.opset < 7:
        return False
    if len(node.input) > 2 and node.input[2]:
        # training_mode: only a constant False makes it an identity.
        mode = node.input[2]
        if not work.is_constant(mode) or bool(work.array(mode).any()):
            return False
    return True
