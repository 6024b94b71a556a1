"""Pass `simplify_views`: a chain of Transposes and reshapes becomes at most a Transpose and a Reshape.

    Transpose → Transpose                  one Transpose (the permutations composed; none if identity)
    reshape → reshape                      one Reshape (Reshape, Flatten, Squeeze, Unsqueeze alike)
    merging reshape → Transpose            Transpose of the merged axis groups → Reshape
    Reshape to the shape it already has    nothing

The export of torch's scaled_dot_product_attention batches heads for its 3-D matmul: the key,
already permuted to (B, h, S, d), is reshaped to (B·h, S, d), transposed to (B·h, d, S) and
reshaped back to (B, h, d, S). The merge of B and h is not a stride view of the permuted key, so
the planner could not read the chain in place and the key became a copy kernel; composed, it is
one Transpose (0, 2, 3, 1) of the projection's view, which a contraction reads as strides.

A Transpose after a reshape that only merges runs of axes (each output axis a group of input
axes) permutes those groups, so it can run first, on the unmerged axes, and the merge after it;
that moves every Transpose of a chain next to the others and every reshape next to the others.
Shapes are static here. A node is folded into its reader only when nothing else reads it, so no
layout change is ever duplicated.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from onnx import NodeProto, helper

from ..layout import axis_groups
from ..onnx_utils import has_subgraph, static_shape
from ._graph import DEFAULT_DOMAINS, WorkGraph, transpose_perm

_RESHAPES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})


def simplify_views(work: WorkGraph) -> int:
    """Apply the rewrites until none applies; returns how many were applied."""
    done = 0
    while _step(work):
        done += 1
    return done


def _kind(node: NodeProto) -> str | None:
    if node.domain not in DEFAULT_DOMAINS:
        return None
    if node.op_type in _RESHAPES:
        return "reshape"
    return "transpose" if node.op_type == "Transpose" else None


def _step(work: WorkGraph) -> bool:
    producers = work.producers()
    consumers = work.consumers()
    graph_outputs = set(work.output_names)
    for k, node in enumerate(work.nodes):
        kind = _kind(node)
        if kind is None or not node.input or not node.output:
            continue
        src, dst = _shape(work, node.input[0]), _shape(work, node.output[0])
        if src is None or dst is None:
            continue
        readers = consumers.get(node.output[0], ())
        if (
            _is_identity(node, src, dst)
            and node.output[0] not in graph_outputs
            and not any(has_subgraph(r) for r in readers)
        ):
            _bypass(work, node, readers)
            return True
        above = producers.get(node.input[0])
        if above is None or _kind(above) is None or node.input[0] in graph_outputs:
            continue
        if len(consumers.get(node.input[0], ())) != 1:
            continue
        origin = _shape(work, above.input[0])
        if origin is None:
            continue
        if _kind(above) == kind == "transpose":
            perm = transpose_perm(above, len(origin))
            composed = [perm[p] for p in transpose_perm(node, len(src))]
            work.nodes[k] = _transpose(above.input[0], node.output[0], composed, node.name)
            work.nodes.remove(above)
            return True
        if _kind(above) == kind == "reshape":
            work.nodes[k] = _reshape(work, above.input[0], node.output[0], dst, node.name)
            work.nodes.remove(above)
            return True
        if _kind(above) == "reshape" and kind == "transpose":
            groups = axis_groups(origin, src)
            if not groups or any(len(out) != 1 or not into for into, out in groups):
                continue  # not a pure merge of axis runs
            order = {out[0]: into for into, out in groups}
            perm = [a for p in transpose_perm(node, len(src)) for a in order[p]]
            moved = above.output[0]
            work.types[moved] = helper.make_tensor_type_proto(
                work.types[moved].tensor_type.elem_type, [origin[a] for a in perm]
            )
            at = work.nodes.index(above)
            work.nodes[at] = _transpose(above.input[0], moved, perm, above.name)
            work.nodes[k] = _reshape(work, moved, node.output[0], dst, node.name)
            return True
    return False


def _shape(work: WorkGraph, name: str) -> tuple[int, ...] | None:
    found = work.types.get(name)
    return static_shape(found) if found is not None else None


def _is_identity(node: NodeProto, src: tuple[int, ...], dst: tuple[int, ...]) -> bool:
    if node.op_type == "Transpose":
        return transpose_perm(node, len(src)) == list(range(len(src)))
    return src == dst


def _bypass(work: WorkGraph, node: NodeProto, readers: Sequence[NodeProto]) -> None:
    """Remove a node that changes nothing, its readers reading its input instead."""
    old, new = node.output[0], node.input[0]
    for reader in readers:
        for i, name in enumerate(reader.input):
            if name == old:
                reader.input[i] = new
    work.nodes = [n for n in work.nodes if n is not node]


def _transpose(data: str, out: str, perm: list[int], name: str) -> NodeProto:
    return helper.make_node("Transpose", [data], [out], name=name, perm=perm)


def _reshape(work: WorkGraph, data: str, out: str, shape: tuple[int, ...], name: str) -> NodeProto:
    target = work.fresh_name(f"{out}_shape")
    work.set_constant(target, np.array(shape, dtype=np.int64))
    return helper.make_node("Reshape", [data, target], [out], name=name)
