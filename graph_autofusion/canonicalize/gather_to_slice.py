"""Pass `gather_to_slice`: a Gather of a constant run of indices from a computed tensor is a window.

    Gather(x[B,S,H], 0, axis=1)        →   Slice(x, 0:1, axis 1) → Squeeze(axis 1)      (x[:, 0])
    Gather(x, [2, 3, 4], axis=a)       →   Slice(x, 2:5, axis a)

A classifier reads its class token as `x[:, 0]`, which both exporters write as a Gather with a
scalar constant index. A Gather moves elements through an index table; a step-1 Slice is the same
strides from an offset, which a contraction reads in place as its operand and `hoist_slices` can
move. Gathers of runtime indices (embedding lookups) and from constants stay.
"""

from __future__ import annotations

import numpy as np
from onnx import NodeProto, helper

from ..onnx_utils import static_shape
from ._graph import WorkGraph


def gather_to_slice(work: WorkGraph) -> int:
    """Rewrite every qualifying Gather; returns how many were rewritten."""
    return work.replace_each("Gather", lambda node: _rewrite(work, node))


def _rewrite(work: WorkGraph, node: NodeProto) -> list[NodeProto] | None:
    data, indices, out = node.input[0], node.input[1], node.output[0]
    if work.is_constant(data) or not work.is_constant(indices) or data not in work.types:
        return None
    shape = static_shape(work.types[data])
    index = np.asarray(work.array(indices), dtype=np.int64)
    if shape is None or not shape or index.ndim > 1 or index.size == 0:
        return None
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0) % len(shape)
    dim = shape[axis]
    if np.any(index < -dim) or np.any(index >= dim):
        return None  # out of range: leave the error to the runtime
    flat = np.where(index < 0, index + dim, index).reshape(-1)
    start = int(flat[0])
    if not np.array_equal(flat, np.arange(start, start + flat.size)):
        return None  # not a run: a real gather
    base = node.name or out
    params = []
    for part, value in (("starts", start), ("ends", start + flat.size), ("axes", axis)):
        name = work.fresh_name(f"{out}_{part}")
        work.set_constant(name, np.array([value], dtype=np.int64))
        params.append(name)
    if index.ndim == 1:
        return [helper.make_node("Slice", [data, *params], [out], name=f"{base}_slice")]
    window = work.fresh_name(f"{out}_window")
    window_shape = [1 if a == axis else d for a, d in enumerate(shape)]
    work.types[window] = helper.make_tensor_type_proto(work.types[data].tensor_type.elem_type, window_shape)
    return [
        helper.make_node("Slice", [data, *params], [window], name=f"{base}_slice"),
        helper.make_node("Squeeze", [window, params[2]], [out], name=f"{base}_squeeze"),
    ]
