"""Pass `split_to_slices`: a `Split` of a materialized tensor becomes one `Slice` per output.

A kernel reading a Split output can take it in place (an offset into the source), but a Split is
one node with several outputs, and the planner puts a node in exactly one kernel: when Q, K and V
come out of one Split they go to different kernels, so the Split had to run as a kernel of its own.
Slices have one output each and join their readers. Only done when the source is already in memory
— produced by a contraction or fed to the graph, possibly through views — because slicing a value
that a fused kernel would otherwise compute inline would force it out to memory instead.
"""

from __future__ import annotations

import numpy as np
from onnx import NodeProto, helper

from ._graph import DEFAULT_DOMAINS, WorkGraph

_VIEWS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})
_MATERIALIZED = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose"})


def split_to_slices(work: WorkGraph) -> int:
    """Rewrite what qualifies; returns the number of Split nodes rewritten."""
    producers = work.producers()
    read = set(work.consumers()) | set(work.output_names)
    return work.replace_each("Split", lambda node: _as_slices(work, node, producers, read))


def _materialized(name: str, producers: dict[str, NodeProto]) -> bool:
    node = producers.get(name)
    while node is not None and node.op_type in _VIEWS and node.domain in DEFAULT_DOMAINS:
        node = producers.get(node.input[0])
    return node is None or node.op_type in _MATERIALIZED


def _as_slices(
    work: WorkGraph, node: NodeProto, producers: dict[str, NodeProto], read: set[str]
) -> list[NodeProto] | None:
    """One Slice per output that anything reads (an unread Split output simply disappears)."""
    source = node.input[0]
    shape_type = work.types.get(source)
    if shape_type is None or not _materialized(source, producers):
        return None
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in shape_type.tensor_type.shape.dim]
    if not dims or min(dims) < 0:
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    axis = int(attrs.get("axis", 0)) % len(dims)
    outputs = list(node.output)
    if len(node.input) > 1 and node.input[1]:
        if not work.is_constant(node.input[1]):
            return None
        sizes = [int(s) for s in work.array(node.input[1]).reshape(-1)]
    elif "split" in attrs:
        sizes = [int(s) for s in attrs["split"]]  # type: ignore[union-attr]
    else:
        parts = len(outputs)
        step = -(-dims[axis] // parts)  # ceil, as opset 18's num_outputs splits
        sizes = [min(step, dims[axis] - k * step) for k in range(parts)]
    if len(sizes) != len(outputs) or sum(sizes) != dims[axis]:
        return None
    slices = []
    start = 0
    for k, (out, size) in enumerate(zip(outputs, sizes, strict=True)):
        if out in read:
            names = [
                work.fresh_name(f"{node.name or 'split'}_{part}{k}") for part in ("starts", "ends", "axes")
            ]
            for name, value in zip(names, (start, start + size, axis), strict=True):
                work.set_constant(name, np.array([value], dtype=np.int64))
            slices.append(helper.make_node("Slice", [source, *names], [out], name=f"{node.name}_slice{k}"))
        start += size
    return slices
