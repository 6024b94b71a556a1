"""Which kernel template a set of nodes forms — the contract with the code generators.

A group is only legal if the backends can generate it as one kernel; `classify` names the
template (docs/fused-format.md) or explains, as data, why the loop domains do not fit together.
"""

from __future__ import annotations

import math
from collections.abc import Collection

from ..ir import Graph, Node
from ..lower.values import Unsupported
from ..ops import OpKind
from .anchor_match import EPILOGUE_VIEW_OPS, match_anchor
from .reduction_match import group_spec, match_reduction

POINTWISE_KINDS = {OpKind.VIEW, OpKind.ELEMENTWISE, OpKind.BROADCAST, OpKind.INJECTIVE}
EPILOGUE_KINDS = {OpKind.ELEMENTWISE, OpKind.BROADCAST}
CHAIN_ANCHORS = {"MatMul", "Gemm"}


class Misfit(Exception):
    """Raised inside classification with the sentence explaining the mismatch."""


def _numel(graph: Graph, value: str) -> int:
    shape = graph.shape(value)
    return math.prod(shape) if shape is not None else -1


def _out(node: Node) -> str:
    return node.outputs[0]


def _external_outputs(graph: Graph, members: Collection[int]) -> list[str]:
    outs = []
    for i in members:
        for o in graph.nodes[i].outputs:
            if not o:
                continue
            v = graph.values[o]
            if v.is_output or any(c not in members for c in v.consumers):
                outs.append(o)
    return outs


def _ancestors_within(graph: Graph, node: Node, members: Collection[int]) -> set[int]:
    seen: set[int] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        for p in graph.predecessors(n):
            if p.index in members and p.index not in seen:
                seen.add(p.index)
                stack.append(p)
    return seen


def _descendants_within(graph: Graph, node: Node, members: Collection[int]) -> set[int]:
    seen: set[int] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        for s in graph.successors(n):
            if s.index in members and s.index not in seen:
                seen.add(s.index)
                stack.append(s)
    return seen


def classify(graph: Graph, members: Collection[int], private: Collection[int] = ()) -> tuple[str | None, str]:
    """(template, "") when one kernel can run `members`, else (None, why).

    `private` names members recomputed inside this kernel: their values never leave it, even
    where other kernels read the same node (each of those recomputes its own copy)."""
    try:
        return _classify(graph, members, frozenset(private)), ""
    except Misfit as why:
        return None, str(why)


def _classify(graph: Graph, members: Collection[int], private: frozenset[int] = frozenset()) -> str:
    nodes = [graph.nodes[i] for i in sorted(members)]
    real = [n for n in nodes if n.kind != OpKind.VIEW]
    if not real:
        return "view"
    if len(nodes) == 1:
        return "single"
    opaque = [n for n in nodes if n.kind == OpKind.OPAQUE]
    if opaque:
        raise Misfit(f"{opaque[0].op_type} '{opaque[0].name}' is opaque and cannot share a kernel")
    anchors = [n for n in nodes if n.kind == OpKind.ANCHOR]
    pools = [n for n in nodes if n.kind == OpKind.REDUCE and "pool" in n.opdef.tags]
    reductions = [n for n in nodes if n.kind == OpKind.REDUCE and "pool" not in n.opdef.tags]
    if len(anchors) > 2:
        raise Misfit("more than two contractions in one kernel")
    if anchors and (reductions or pools):
        raise Misfit(f"{anchors[0].op_type} and {(reductions or pools)[0].op_type} iterate different domains")
    if len(anchors) == 2:
        _anchor_chain(graph, members, anchors)
        return "anchor_chain"
    if anchors:
        _anchor(graph, members, anchors[0], private)
        return "anchor"
    if pools:
        if len(pools) > 1 or reductions:
            raise Misfit("a pooling window does not share a loop nest with another reduction")
        _epilogue_only(graph, members, pools[0])
        return "pool"
    if reductions:
        _reduction(graph, members, private)
        return "reduction"
    _pointwise(graph, members)
    return "pointwise"


def _pointwise(graph: Graph, members: Collection[int]) -> None:
    outs = _external_outputs(graph, members)
    sizes = {_numel(graph, o) for o in outs}
    if len(sizes) > 1:
        raise Misfit(f"outputs {', '.join(outs)} have different element counts {sorted(sizes)}")


def _epilogue_only(graph: Graph, members: Collection[int], root: Node, *, views: bool = False) -> set[int]:
    """Members other than `root` must be elementwise ops downstream of it on its output domain.

    With `views`, view ops may sit among them (same element count, same linear order: the
    epilogue still runs per output tile)."""
    desc = _descendants_within(graph, root, members)
    rest = set(members) - desc - {root.index}
    if rest:
        other = graph.nodes[min(rest)]
        raise Misfit(
            f"{other.op_type} '{other.name}' is neither a prologue nor an epilogue of {root.op_type}"
        )
    size = _numel(graph, _out(root))
    for i in sorted(desc):
        n = graph.nodes[i]
        if n.kind in EPILOGUE_KINDS or (views and n.op_type in EPILOGUE_VIEW_OPS):
            pass
        else:
            raise Misfit(f"{n.op_type} '{n.name}' cannot run as an epilogue of {root.op_type}")
        if _numel(graph, _out(n)) != size:
            raise Misfit(f"epilogue {n.op_type} '{n.name}' changes the domain of {root.op_type}")
        for inp in n.inputs:
            p = graph.producer(inp) if inp else None
            if p is not None and p.index in members and p.index not in desc and p.index != root.index:
                raise Misfit(f"epilogue {n.op_type} '{n.name}' reads a prologue value")
    return desc


def _anchor(
    graph: Graph, members: Collection[int], anchor: Node, private: frozenset[int] = frozenset()
) -> None:
    """One anchor kernel: the group is one exactly when the anchor match succeeds on it."""
    try:
        match_anchor(group_spec(graph, members, private))
    except Unsupported as why:
        raise Misfit(str(why)) from None


def _anchor_chain(graph: Graph, members: Collection[int], anchors: list[Node]) -> None:
    first, second = sorted(anchors, key=lambda n: n.index)
    if first.op_type not in CHAIN_ANCHORS or second.op_type not in CHAIN_ANCHORS:
        raise Misfit("only MatMul/Gemm pairs share a kernel")
    if any(graph.producer(x) is not None for x in second.inputs[1:] if x):
        raise Misfit("the second contraction of a chain needs constant weights")
    # Walk back from the second anchor's left operand to the first anchor through epilogue/view ops.
    middle: set[int] = set()
    node = graph.producer(second.inputs[0])
    while node is not None and node.index in members and node.index != first.index:
        if node.kind not in EPILOGUE_KINDS | {OpKind.VIEW}:
            raise Misfit(f"{node.op_type} between the two contractions is not elementwise")
        middle.add(node.index)
        node = graph.producer(node.inputs[0])
    if node is None or node.index != first.index:
        raise Misfit("the second contraction does not consume the first")
    n1 = (graph.shape(_out(first)) or (0,))[-1]
    k2 = (graph.shape(second.inputs[0]) or (0,))[-1]
    if n1 != k2 or _numel(graph, _out(first)) // max(n1, 1) != _numel(graph, second.inputs[0]) // max(k2, 1):
        raise Misfit("the reshape between the contractions does not keep rows")
    for i in middle | {first.index}:
        for o in graph.nodes[i].outputs:
            v = graph.values[o]
            if v.is_output or any(c not in members for c in v.consumers):
                raise Misfit("the intermediate of a contraction chain is read outside the kernel")
    first_epi = {i for i in middle if graph.nodes[i].kind != OpKind.VIEW}
    for i in first_epi:
        if _numel(graph, _out(graph.nodes[i])) != _numel(graph, _out(first)):
            raise Misfit("the first contraction's epilogue changes its domain")
    rest = set(members) - middle - {first.index}
    _epilogue_only(graph, rest, second, views=True)


def _reduction(graph: Graph, members: Collection[int], private: frozenset[int]) -> None:
    """A row kernel: the group is one exactly when the lowering's match succeeds on it."""
    try:
        match_reduction(group_spec(graph, members, private))
    except Unsupported as why:
        raise Misfit(str(why)) from None
