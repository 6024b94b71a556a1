"""Pass `constant_gather_nd`: a GatherND whose indices are constant becomes a view or a Gather.

    GatherND(x[2,16], idx[2,1,1,16,2] with idx[b,0,0,k] = (b, k))   →   Reshape(x, [2,1,1,16])

Hugging Face transformers builds its attention mask by indexing the padding mask with index grids
(`mask[batch_idx, kv_idx]`), which the exporter writes as a GatherND over constant indices. GatherND
is opaque to the planner (and has no code generator), so the mask cost two kernels of its own and
a host call; yet the indices only walk the mask in order. Read as flat offsets into the gathered
block of `x`, indices that walk it in order, possibly repeated along some axes, are a Reshape
(+ Expand); any other constant offsets are a Gather on the flattened block, an injective op that
joins its reader's kernel.
"""

from __future__ import annotations

import math

import numpy as np
from onnx import NodeProto, helper

from ..onnx_utils import static_shape
from ._graph import WorkGraph


def constant_gather_nd(work: WorkGraph) -> int:
    """Rewrite every GatherND with constant indices; returns how many were rewritten."""
    return work.replace_each("GatherND", lambda node: _rewrite(work, node))


def _rewrite(work: WorkGraph, node: NodeProto) -> list[NodeProto] | None:
    data, indices, out = node.input[0], node.input[1], node.output[0]
    if any(a.name == "batch_dims" and a.i != 0 for a in node.attribute):
        return None
    if not work.is_constant(indices) or data not in work.types or out not in work.types:
        return None
    shape, out_shape = static_shape(work.types[data]), static_shape(work.types[out])
    idx = np.asarray(work.array(indices), dtype=np.int64)
    if shape is None or out_shape is None or idx.ndim < 1 or idx.shape[-1] > len(shape):
        return None
    depth = idx.shape[-1]
    block, rest = shape[:depth], shape[depth:]
    if np.any(idx < -np.array(block)) or np.any(idx >= np.array(block)):
        return None  # out of range: leave the error to the runtime
    idx = np.where(idx < 0, idx + np.array(block), idx)
    strides = np.array([math.prod(block[j + 1 :]) for j in range(depth)], dtype=np.int64)
    flat = (idx * strides).sum(axis=-1) if depth else np.zeros(idx.shape[:-1], np.int64)
    elem = work.types[data].tensor_type.elem_type
    base = node.name or out
    nodes = []
    kept = _in_order(flat, math.prod(block))
    if kept is not None:
        viewed = [d if k else 1 for d, k in zip(flat.shape, kept, strict=True)] + list(rest)
        target = viewed if list(viewed) != list(out_shape) else None
        into = work.fresh_name(f"{out}_view") if target is not None else out
        nodes.append(_reshape(work, data, into, viewed, f"{base}_view"))
        work.types[into] = helper.make_tensor_type_proto(elem, viewed)
        if target is not None:
            size = work.fresh_name(f"{out}_expand_shape")
            work.set_constant(size, np.array(out_shape, dtype=np.int64))
            nodes.append(helper.make_node("Expand", [into, size], [out], name=f"{base}_expand"))
        return nodes
    rows = work.fresh_name(f"{out}_rows")
    nodes.append(_reshape(work, data, rows, [math.prod(block), *rest], f"{base}_rows"))
    work.types[rows] = helper.make_tensor_type_proto(elem, [math.prod(block), *rest])
    offsets = work.fresh_name(f"{out}_offsets")
    work.set_constant(offsets, flat)
    nodes.append(helper.make_node("Gather", [rows, offsets], [out], name=f"{base}_gather", axis=0))
    return nodes


def _in_order(flat: np.ndarray, count: int) -> list[bool] | None:
    """Per axis of `flat`, whether it walks the block (False: repeats it), when the walking axes
    enumerate offsets 0..count-1 in order; None otherwise."""
    kept = []
    reduced = flat
    for axis in range(flat.ndim):
        first = np.take(reduced, [0], axis=axis)
        repeats = flat.shape[axis] > 1 and bool(np.all(reduced == first))
        kept.append(not repeats)
        if repeats:
            reduced = first
    if reduced.size != count or not np.array_equal(reduced.reshape(-1), np.arange(count)):
        return None
    return kept


def _reshape(work: WorkGraph, data: str, out: str, shape: list[int], name: str) -> NodeProto:
    target = work.fresh_name(f"{out}_shape")
    work.set_constant(target, np.array(shape, dtype=np.int64))
    return helper.make_node("Reshape", [data, target], [out], name=name)
