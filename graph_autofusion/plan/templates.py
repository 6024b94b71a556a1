"""Which kernel template a set of nodes forms — the contract with the code generators.

A group is only legal if the backends can generate it as one kernel; `classify` names the
template (docs/fused-format.md) or explains, as data, why the loop domains do not fit together.
"""

from __future__ import annotations

import math
from collections.abc import Collection

from ..hardware import HardwareProfile
from ..ir import Graph, Node
from ..lower.values import Unsupported
from ..ops import OpKind
from .anchor_match import EPILOGUE_VIEW_OPS, INLINED_INT_CONSTANT, match_anchor, match_chain
from .attention_match import looks_like_attention, match_attention
from .reduction_match import group_spec, match_reduction

POINTWISE_KINDS = {OpKind.VIEW, OpKind.ELEMENTWISE, OpKind.BROADCAST, OpKind.INJECTIVE}
EPILOGUE_KINDS = {OpKind.ELEMENTWISE, OpKind.BROADCAST}


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


def row_stages(hw: HardwareProfile) -> bool:
    """Whether a MatMul/Gemm anchor may close with a LayerNormalization or open with a
    GlobalAveragePool of its left operand for the target `hw` describes: the CPU backend renders
    both (lower/anchor.py); the Triton anchors (CUDA, Ascend) do not, so the planner does not form
    such groups for them."""
    return hw.compute_capability is None and hw.unified_buffer_bytes <= 0


def classify(
    graph: Graph, members: Collection[int], private: Collection[int] = (), *, row_stages: bool = True
) -> tuple[str | None, str]:
    """(template, "") when one kernel can run `members`, else (None, why).

    `private` names members recomputed inside this kernel: their values never leave it, even
    where other kernels read the same node (each of those recomputes its own copy). `row_stages`:
    whether an anchor may close with a LayerNormalization or open with a GlobalAveragePool
    (`row_stages`)."""
    try:
        return _classify(graph, members, frozenset(private), row_stages), ""
    except Misfit as why:
        return None, str(why)


def _classify(
    graph: Graph, members: Collection[int], private: frozenset[int] = frozenset(), row_stages: bool = True
) -> str:
    nodes = [graph.nodes[i] for i in sorted(members)]
    real = [n for n in nodes if n.kind != OpKind.VIEW]
    if not real:
        return "view"
    if len(nodes) == 1:
        return "single"
    opaque = [n for n in nodes if n.kind == OpKind.OPAQUE]
    if opaque:
        raise Misfit(f"{opaque[0].op_type} '{opaque[0].name}' is opaque and cannot share a kernel")
    if looks_like_attention([n.op_type for n in nodes]):
        _attention(graph, members, private)
        return "attention"
    anchors = [n for n in nodes if n.kind == OpKind.ANCHOR]
    pools = [n for n in nodes if n.kind == OpKind.REDUCE and "pool" in n.opdef.tags]
    reductions = [n for n in nodes if n.kind == OpKind.REDUCE and "pool" not in n.opdef.tags]
    if len(anchors) > 2:
        raise Misfit("more than two contractions in one kernel")
    # A LayerNormalization closing a GEMM, a GlobalAveragePool opening one (plan/anchor_match.py).
    staged = [n for n in reductions if n.op_type in ("LayerNormalization", "GlobalAveragePool")]
    if anchors and len(anchors) <= 2 and not pools and reductions and staged == reductions:
        if not row_stages:
            raise Misfit(f"the target's {anchors[0].op_type} kernels do not normalise or pool rows")
        if len(anchors) == 2:
            _anchor_chain(graph, members, anchors)
            return "anchor_chain"
        _anchor(graph, members, anchors[0], private)
        return "anchor"
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
        match_anchor(group_spec(graph, members, private, max_constant=INLINED_INT_CONSTANT))
    except Unsupported as why:
        raise Misfit(str(why)) from None


def _anchor_chain(graph: Graph, members: Collection[int], anchors: list[Node]) -> None:
    """Two contractions in one kernel: the group is one exactly when the chain match succeeds,
    given weights known before the kernel runs (which only the graph can tell): the second's,
    and a conv chain's first conv's too (the library packs it once)."""
    first, second = sorted(anchors, key=lambda n: n.index)
    if any(graph.producer(x) is not None for x in second.inputs[1:] if x):
        raise Misfit("the second contraction of a chain needs constant weights")
    if first.op_type == "Conv" and any(graph.producer(x) is not None for x in first.inputs[1:] if x):
        raise Misfit("the first conv of a conv chain needs constant weights")
    try:
        match_chain(group_spec(graph, members, max_constant=INLINED_INT_CONSTANT))
    except Unsupported as why:
        raise Misfit(str(why)) from None


def _attention(graph: Graph, members: Collection[int], private: frozenset[int]) -> None:
    """One attention kernel (plan/attention_match.py): the group is one when the match succeeds."""
    try:
        match_attention(group_spec(graph, members, private))
    except Unsupported as why:
        raise Misfit(str(why)) from None


def _reduction(graph: Graph, members: Collection[int], private: frozenset[int]) -> None:
    """A row kernel: the group is one exactly when the lowering's match succeeds on it."""
    try:
        match_reduction(group_spec(graph, members, private))
    except Unsupported as why:
        raise Misfit(str(why)) from None
