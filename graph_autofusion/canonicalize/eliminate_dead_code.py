"""Pass `eliminate_dead_code`: remove nodes no graph output depends on, then unused initializers.

Liveness walks backwards from the graph outputs; a node with a subgraph keeps alive whatever its
subgraph reads from the outer scope.  Initializers listed as graph inputs are part of the model's
interface and always stay.
"""

from __future__ import annotations

from ..onnx_utils import node_inputs
from ._graph import WorkGraph


def eliminate_dead_code(work: WorkGraph) -> tuple[int, int]:
    """Returns (nodes removed, initializers of the input model removed).

    Constants created by folding and dropped again once folded further are not counted: they are
    bookkeeping of this stage, not something the user's model carried.
    """
    live = set(work.output_names)
    kept = []
    for node in reversed(work.nodes):  # nodes are in topological order
        if any(name in live for name in node.output if name):
            kept.append(node)
            live.update(node_inputs(node))
    kept.reverse()
    removed_nodes = len(work.nodes) - len(kept)
    work.nodes = kept
    unused = [n for n in work.initializers if n not in live and n not in work.input_names]
    for name in unused:
        work.drop_initializer(name)
    return removed_nodes, sum(1 for name in unused if name in work.source_initializers)
