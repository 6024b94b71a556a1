"""Lifetime-based activation memory: the peak the runtime's arena will need for a schedule.

Weights are not counted (they live in the model), views alias their input, and tensors that stay
inside a fused kernel never reach memory. The planner uses the same lifetimes to refuse fusions
that stretch a big tensor's life across the peak (NF003).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..ir import Graph
from ..ops import OpKind


def _alias_root(graph: Graph, value: str) -> str:
    """Follow views back to the tensor that owns the buffer."""
    node = graph.producer(value)
    while node is not None and node.kind == OpKind.VIEW and node.inputs and node.inputs[0]:
        value = node.inputs[0]
        if graph.values[value].is_const:
            break
        node = graph.producer(value)
    return value


def live_profile(graph: Graph, schedule: Sequence[frozenset[int]]) -> np.ndarray:
    """Bytes live at each step of `schedule` (a topological order of node groups)."""
    step_of: dict[int, int] = {}
    for s, members in enumerate(schedule):
        for i in members:
            step_of[i] = s
    end = len(schedule)
    born: dict[str, int] = {}
    dies: dict[str, int] = {}
    for name in graph.inputs:
        born[name] = 0
    for s, members in enumerate(schedule):
        for i in members:
            node = graph.nodes[i]
            for x in node.inputs:
                if not x or graph.values[x].is_const:
                    continue
                root = _alias_root(graph, x)
                dies[root] = max(dies.get(root, s), s)
            for o in node.outputs:
                if not o:
                    continue
                v = graph.values[o]
                internal = not v.is_output and all(step_of.get(c) == s for c in v.consumers)
                if node.kind == OpKind.VIEW or internal:
                    continue
                born.setdefault(o, s)
    for name in graph.outputs:
        dies[_alias_root(graph, name)] = end - 1
    live = np.zeros(max(end, 1), dtype=np.int64)
    for name, b in born.items():
        d = dies.get(name, b)
        live[b : d + 1] += graph.values[name].nbytes
    return live


def peak_memory(graph: Graph, schedule: Sequence[frozenset[int]]) -> int:
    return int(live_profile(graph, schedule).max()) if schedule else 0
