"""Which kernel template a set of nodes forms — the contract with the code generators.

A group is only legal if the backends can generate it as one kernel; `classify` names the
template (docs/fused-format.md) or explains, as data, why the loop domains do not fit together.
"""

from __future__ import annotations

import math
from collections.abc import Collection

import onnx

from ..ir import Graph, Node
from ..layout import reshape_strides, slice_window, split_sizes
from ..lower.values import Unsupported
from ..ops import OpKind
from .attention_match import looks_like_attention, match_attention
from .reduction_match import group_spec, match_reduction

POINTWISE_KINDS = {OpKind.VIEW, OpKind.ELEMENTWISE, OpKind.BROADCAST, OpKind.INJECTIVE}
EPILOGUE_KINDS = {OpKind.ELEMENTWISE, OpKind.BROADCAST}
CHAIN_ANCHORS = {"MatMul", "Gemm"}
STRIDE_PROLOGUE_OPS = {"Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Split", "Slice"}
# Prologue ops that take a window of their input: the same strides from an element offset.
WINDOW_PROLOGUE_OPS = {"Split", "Slice"}
# Views an anchor's epilogue may contain: they keep the element order, so the epilogue still runs
# on the tile's linear index (Dropout is a view here, but the code generators do not read it).
EPILOGUE_VIEW_OPS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"}
# Anchors whose stores can absorb an output Transpose (as the ldc and batch offsets of a GEMM).
TRANSPOSED_STORE_ANCHORS = {"MatMul", "Gemm"}


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


def _const_ints(graph: Graph, node: Node, slot: int) -> list[int] | None:
    """An optional integer operand of `node` read at plan time; None when absent or not constant."""
    if len(node.inputs) <= slot or not node.inputs[slot]:
        return None
    value = graph.const_value(node.inputs[slot])
    if value is None:
        raise Misfit(f"{node.op_type} '{node.name}' input {slot} ('{node.inputs[slot]}') is not a constant")
    return [int(v) for v in value.reshape(-1)]


def _window(graph: Graph, node: Node, value: str, shape: list[int]) -> list[int]:
    """Shape of output `value` of a Split or step-1 Slice over `shape` (the codegen's rule: constant
    parameters, steps of 1); raises Misfit otherwise."""
    rank = len(shape)
    if node.op_type == "Split":
        axis = int(node.attrs.get("axis", 0)) % max(rank, 1)
        given = _const_ints(graph, node, 1)
        if given is None and node.attrs.get("split") is not None:
            given = [int(v) for v in node.attrs["split"]]
        sizes = split_sizes(shape[axis], len(node.outputs), given)
        if sizes is None:
            raise Misfit(f"Split '{node.name}' sizes do not cover its axis")
        out = list(shape)
        out[axis] = sizes[list(node.outputs).index(value)]
        return out
    if len(node.inputs) > 1:
        starts, ends = _const_ints(graph, node, 1), _const_ints(graph, node, 2)
        axes, steps = _const_ints(graph, node, 3), _const_ints(graph, node, 4)
    else:
        starts = [int(v) for v in node.attrs.get("starts", [])]
        ends = [int(v) for v in node.attrs.get("ends", [])]
        axes = [int(v) for v in node.attrs["axes"]] if node.attrs.get("axes") is not None else None
        steps = None
    window = slice_window(shape, starts or [], ends or [], axes, steps) if starts and ends else None
    if window is None:
        raise Misfit(f"Slice '{node.name}' is not a constant step-1 window")
    return list(window[1])


def operand_strides(
    graph: Graph, chain: list[Node], source: str, values: list[str] | None = None
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """Shape and element strides of `source` seen through a Transpose/Reshape/Split/Slice chain.

    `values[i]` names the output of `chain[i]` the chain follows (the first output when omitted;
    a Split has several). A Split or step-1 Slice keeps the strides and moves the base pointer,
    so it changes only the shape. None when the chain needs a copy (a BLAS call can absorb a
    stride change and an offset, not a gather); Misfit when a window's parameters are unknown."""
    shape = list(graph.shape(source) or ())
    strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
    for k, node in enumerate(chain):
        value = values[k] if values is not None else _out(node)
        out_shape = list(graph.shape(value) or ())
        if node.op_type == "Transpose":
            perm = node.attrs.get("perm") or list(reversed(range(len(shape))))
            shape = [shape[p] for p in perm]
            strides = [strides[p] for p in perm]
        elif node.op_type in WINDOW_PROLOGUE_OPS:
            shape = _window(graph, node, value, shape)
        else:
            new = reshape_strides(shape, strides, out_shape)
            if new is None:
                return None
            shape, strides = out_shape, new
    return tuple(shape), tuple(strides)


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
    if looks_like_attention([n.op_type for n in nodes]):
        _attention(graph, members, private)
        return "attention"
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


def _epilogue_only(
    graph: Graph, members: Collection[int], root: Node, *, views: bool = False, transpose: bool = False
) -> set[int]:
    """Members other than `root` must be elementwise ops downstream of it on its output domain.

    With `views`, view ops may sit among them (same element count, same linear order: the
    epilogue still runs per output tile). With `transpose`, one Transpose followed only by views
    may end the epilogue when `root`'s stores can absorb it (`_output_transpose`)."""
    desc = _descendants_within(graph, root, members)
    rest = set(members) - desc - {root.index}
    if rest:
        other = graph.nodes[min(rest)]
        raise Misfit(
            f"{other.op_type} '{other.name}' is neither a prologue nor an epilogue of {root.op_type}"
        )
    size = _numel(graph, _out(root))
    tail = _output_transpose(graph, members, root, desc) if transpose else None
    after = _descendants_within(graph, tail, members) if tail is not None else set()
    for i in sorted(desc):
        n = graph.nodes[i]
        if i in after:
            if n.op_type not in EPILOGUE_VIEW_OPS:
                raise Misfit(
                    f"{n.op_type} '{n.name}' after the output Transpose '{tail.name}' would need a copy"
                )
        elif n is tail or n.kind in EPILOGUE_KINDS or (views and n.op_type in EPILOGUE_VIEW_OPS):
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


def _output_transpose(graph: Graph, members: Collection[int], root: Node, desc: set[int]) -> Node | None:
    """The epilogue's Transpose, if any, when `root` can store its tiles in the permuted layout.

    The GEMM writes each row of a tile to its permuted place, so the Transpose must keep the last
    axis last and map the contraction's output, through the views around it, to a layout with
    unit-stride columns (attention's `[B,H,S,D] -> Transpose(0,2,1,3)`: ldc = H*D)."""
    found = [graph.nodes[i] for i in sorted(desc) if graph.nodes[i].op_type == "Transpose"]
    if not found:
        return None
    tail = found[0]
    if root.op_type not in TRANSPOSED_STORE_ANCHORS:
        raise Misfit(f"Transpose '{tail.name}' after {root.op_type} '{root.name}' would need a copy")
    if len(found) > 1:
        raise Misfit(f"{root.op_type} '{root.name}' can store through one output Transpose, not {len(found)}")
    src = list(graph.shape(tail.inputs[0]) or ())
    perm = [int(p) for p in (tail.attrs.get("perm") or reversed(range(len(src))))]
    if not src or perm[-1] != len(src) - 1:
        raise Misfit(f"Transpose '{tail.name}' moves the last axis of {root.op_type} '{root.name}'")
    if root.op_type == "MatMul" and any(len(graph.shape(x) or ()) < 2 for x in root.inputs[:2]):
        raise Misfit(f"Transpose '{tail.name}' after a MatMul of a vector would need a copy")
    out = list(graph.shape(_out(tail)) or ())
    dense = [math.prod(out[i + 1 :]) for i in range(len(out))]
    src_strides = [0] * len(src)
    for axis, p in enumerate(perm):
        src_strides[p] = dense[axis]
    y = list(graph.shape(_out(root)) or ())
    strides = reshape_strides(src, src_strides, y)
    if strides is None or not y or (y[-1] != 1 and strides[-1] != 1):
        raise Misfit(
            f"Transpose '{tail.name}' does not keep the rows of {root.op_type} '{root.name}' contiguous"
        )
    after = _descendants_within(graph, tail, members) | {tail.index}
    leaving = _external_outputs(graph, after)
    if len(leaving) != 1:
        raise Misfit(
            f"{len(leaving)} views of the transposed output of '{root.name}' leave the kernel, not one"
        )
    return tail


def _prologue_ok(
    graph: Graph,
    anchor: Node,
    prologue: set[int],
    members: Collection[int],
    private: frozenset[int] = frozenset(),
) -> None:
    if not prologue:
        return
    if anchor.op_type != "MatMul":
        raise Misfit(f"{anchor.op_type} takes no fused prologue")
    for i in prologue:
        n = graph.nodes[i]
        if n.op_type not in STRIDE_PROLOGUE_OPS:
            raise Misfit(f"{n.op_type} '{n.name}' before {anchor.op_type} would need a copy")
    used: set[int] = set()
    read: set[str] = set()  # values the chains into the anchor read
    for slot in (0, 1):
        chain: list[Node] = []
        values: list[str] = []
        value = anchor.inputs[slot]
        node = graph.producer(value)
        while node is not None and node.index in prologue:
            chain.append(node)
            values.append(value)
            value = node.inputs[0]
            node = graph.producer(value)
        if not chain:
            continue
        chain.reverse()
        values.reverse()
        used.update(n.index for n in chain)
        read.update(values)
        seen = operand_strides(graph, chain, value, values)
        if seen is None or len(seen[0]) < 2 or 1 not in (seen[1][-1], seen[1][-2]):
            raise Misfit(f"the layout change feeding {anchor.op_type} '{anchor.name}' is not a stride change")
    if used != prologue:
        raise Misfit("prologue nodes do not form chains into the contraction")
    chained = {anchor.index} | used
    for i in used:
        node = graph.nodes[i]
        for o in node.outputs:
            if not o:
                continue
            v = graph.values[o]
            if o in read:
                if v.is_output or any(c not in chained for c in v.consumers):
                    raise Misfit(f"'{node.name}' feeds {anchor.op_type} and other consumers")
            elif (v.is_output or v.consumers) and i not in private:
                # A kernel reads its prologue in place and stores nothing of it: a Split output
                # read elsewhere would need the Split as a kernel of its own (or recomputed).
                raise Misfit(
                    f"{node.op_type} '{node.name}' output '{o}' is read outside the chains into "
                    f"{anchor.op_type} '{anchor.name}'"
                )


def _anchor(
    graph: Graph, members: Collection[int], anchor: Node, private: frozenset[int] = frozenset()
) -> None:
    prologue = _ancestors_within(graph, anchor, members)
    _prologue_ok(graph, anchor, prologue, members, private)
    _epilogue_only(graph, set(members) - prologue, anchor, views=True, transpose=True)
    _fp32_boundary(graph, members)


# Integer/bool constants up to this size are inlined into a kernel (extract.CONST_MAX_INT_ELEMENTS),
# so they never become a kernel parameter.
_INLINED_INT_CONSTANT = 4096


def _fp32_boundary(graph: Graph, members: Collection[int]) -> None:
    """Anchor kernels take and give fp32 only: a bool/int tensor crossing the group's boundary
    (a runtime Where mask, a Cast to int64 after a MatMul) made the generator decline the whole
    group, so the contraction ran on the onnx.reference host path. Such a group is a misfit."""
    inside = set(members)
    crossing = set(_external_outputs(graph, members))
    for i in inside:
        for x in graph.nodes[i].inputs:
            v = graph.values.get(x) if x else None
            if v is None or (v.producer is not None and v.producer in inside):
                continue
            if v.is_const and _numel(graph, x) <= _INLINED_INT_CONSTANT:
                continue
            crossing.add(x)
    for x in sorted(crossing):
        elem = graph.values[x].elem_type
        if elem != onnx.TensorProto.FLOAT:
            name = onnx.TensorProto.DataType.Name(elem)
            raise Misfit(f"{x!r} crosses an anchor kernel's boundary as {name}; anchor kernels are fp32")


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
