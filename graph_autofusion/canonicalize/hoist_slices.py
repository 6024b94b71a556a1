"""Pass `hoist_slices`: take Slice and Split windows before the Transpose or Reshape above them.

    qkv[B,S,3·h·d] → Reshape[B,S,3,h,d] → Transpose(2,0,3,1,4) → Slice(axis 0, i:i+1) → Squeeze
      becomes
    qkv → Slice(axis 2, i·h·d:(i+1)·h·d) → Reshape[B,S,1,h,d] → Transpose(2,0,3,1,4) → Squeeze

A packed attention projection (timm's ViT, both exporters) is viewed as (B, S, 3, h, d), permuted
once, then unbound into Q, K and V. The permuted tensor is read by three windows that go to three
different kernels, so it has to be materialized by a kernel of its own, and the scaled Q made one
more. Taken on the projection's own layout instead, each window is a column block of a tensor that
is already in memory, and the Slice → Reshape → Transpose chain after it is a stride change that
its reader takes in place (a contraction's operand, an elementwise kernel's index map): the
layout chain GPT-2's exporters write from the start.

A window moves through a Transpose to the permuted axis, and through a view (Reshape, Flatten,
Squeeze, Unsqueeze, all with static shapes) when the windowed axis is the leading factor of the
input axis it was split from (a window of `3` in `96 → 3×2×16` is a block of 32·k columns). A
Split becomes one Slice per output that is read. The layout node is hoisted over only when every
reader of its output is a window that can move, so it is never duplicated: it disappears, and each
window gets its own copy of it below. Repeats until nothing moves, so a window climbs whole
chains.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from onnx import NodeProto, helper

from ..layout import axis_groups, slice_window, split_sizes
from ..onnx_utils import static_shape
from ._graph import DEFAULT_DOMAINS, WorkGraph, transpose_perm

_VIEWS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})

#: One window of a tensor: {axis: (start, end)} over the axes it narrows, in that tensor's axes.
Window = dict[int, tuple[int, int]]


@dataclass
class _Reader:
    """A Slice or Split reading the layout node's output: its windows, one per read output."""

    node: NodeProto
    outputs: list[str]
    windows: list[Window]


def hoist_slices(work: WorkGraph) -> int:
    """Move windows up until none can move; returns how many layout nodes were hoisted over."""
    moved = 0
    while _sweep(work):
        moved += 1
    return moved


def _sweep(work: WorkGraph) -> bool:
    """Hoist the windows below one layout node (the first that qualifies); True if one moved."""
    consumers = work.consumers()
    graph_outputs = set(work.output_names)
    for layout in work.nodes:
        if layout.domain not in DEFAULT_DOMAINS or layout.op_type not in _VIEWS | {"Transpose"}:
            continue
        out = layout.output[0]
        readers = consumers.get(out, [])
        if not readers or out in graph_outputs:
            continue
        src, dst = _shape(work, layout.input[0]), _shape(work, out)
        if src is None or dst is None:
            continue
        found = [_reader(work, node, out, dst, consumers, graph_outputs) for node in readers]
        if any(r is None for r in found):
            continue
        mapped = [[_through(layout, src, dst, w) for w in r.windows] for r in found if r is not None]
        if any(m is None for ms in mapped for m in ms):
            continue
        _rewrite(work, layout, src, [r for r in found if r is not None], mapped)  # type: ignore[arg-type]
        return True
    return False


def _shape(work: WorkGraph, name: str) -> tuple[int, ...] | None:
    found = work.types.get(name)
    return static_shape(found) if found is not None else None


def _ints(work: WorkGraph, node: NodeProto, slot: int) -> list[int] | None:
    if len(node.input) <= slot or not node.input[slot]:
        return None
    name = node.input[slot]
    if not work.is_constant(name):
        raise ValueError(name)
    return [int(v) for v in work.array(name).reshape(-1)]


def _reader(
    work: WorkGraph,
    node: NodeProto,
    layout_out: str,
    shape: tuple[int, ...],
    consumers: dict[str, list[NodeProto]],
    graph_outputs: set[str],
) -> _Reader | None:
    """The windows `node` takes of its first input (of `shape`), or None if it is no constant window."""
    if node.domain not in DEFAULT_DOMAINS or node.op_type not in ("Slice", "Split") or len(node.input) < 1:
        return None
    if not shape or list(node.input).count(layout_out) != 1 or node.input[0] != layout_out:
        return None  # the layout output is a window parameter too
    try:
        if node.op_type == "Slice":
            if len(node.input) < 3:
                return None  # attribute form (before opset 10): left as it is
            starts, ends = _ints(work, node, 1), _ints(work, node, 2)
            axes, steps = _ints(work, node, 3), _ints(work, node, 4)
            found = slice_window(shape, starts or [], ends or [], axes, steps)
            if found is None or not starts or _shape(work, node.output[0]) is None:
                return None
            begin, size = found
            window = {a: (begin[a], begin[a] + size[a]) for a in range(len(shape)) if size[a] != shape[a]}
            return _Reader(node, [node.output[0]], [window])
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        axis = int(attrs.get("axis", 0)) % len(shape)  # type: ignore[call-overload]
        given = _ints(work, node, 1)
        if given is None and "split" in attrs:
            given = [int(v) for v in attrs["split"]]  # type: ignore[union-attr]
    except ValueError:
        return None  # a window parameter computed at run time
    sizes = split_sizes(shape[axis], len(node.output), given)
    if sizes is None:
        return None
    if any(o and _shape(work, o) is None for o in node.output):
        return None
    outputs, windows, start = [], [], 0
    for out, size in zip(node.output, sizes, strict=True):
        if out and (consumers.get(out) or out in graph_outputs):
            outputs.append(out)
            windows.append({axis: (start, start + size)} if size != shape[axis] else {})
        start += size
    return _Reader(node, outputs, windows)


def _through(layout: NodeProto, src: tuple[int, ...], dst: tuple[int, ...], window: Window) -> Window | None:
    """`window` of the layout node's output as a window of its input, or None when it is not one."""
    if layout.op_type == "Transpose":
        perm = transpose_perm(layout, len(src))
        return {perm[a]: span for a, span in window.items()}
    mapped: Window = {}
    for src_axes, dst_axes in axis_groups(src, dst):
        inside = [a for a in dst_axes if a in window]
        if not inside:
            continue
        axis = inside[0]
        leading = [a for a in dst_axes if a < axis]
        if len(inside) > 1 or len(src_axes) != 1 or any(dst[a] != 1 for a in leading):
            return None  # not a block of one input axis
        rest = math.prod(dst[a] for a in dst_axes if a > axis)
        start, end = window[axis]
        mapped[src_axes[0]] = (start * rest, end * rest)
    return mapped


def _rewrite(
    work: WorkGraph,
    layout: NodeProto,
    src: tuple[int, ...],
    readers: list[_Reader],
    mapped: list[list[Window]],
) -> None:
    """Replace `layout` and its readers by a Slice of its input, then a copy of it, per window."""
    source = layout.input[0]
    elem = work.types[source].tensor_type.elem_type
    replaced = {id(layout)} | {id(r.node) for r in readers}
    added: list[NodeProto] = []
    for reader, windows in zip(readers, mapped, strict=True):
        for k, (out, window) in enumerate(zip(reader.outputs, windows, strict=True)):
            base = reader.node.name or out
            base = f"{base}_{k}" if len(reader.outputs) > 1 else base
            sliced = source
            if window:
                sliced = work.fresh_name(f"{out}_window")
                axes = sorted(window)
                params = []
                for part, values in (
                    ("starts", [window[a][0] for a in axes]),
                    ("ends", [window[a][1] for a in axes]),
                    ("axes", axes),
                ):
                    name = work.fresh_name(f"{sliced}_{part}")
                    work.set_constant(name, np.array(values, dtype=np.int64))
                    params.append(name)
                added.append(helper.make_node("Slice", [source, *params], [sliced], name=f"{base}_hoisted"))
                shape = [window[a][1] - window[a][0] if a in window else d for a, d in enumerate(src)]
                work.types[sliced] = helper.make_tensor_type_proto(elem, shape)
            added.append(_layout_copy(work, layout, sliced, out, f"{base}_{layout.op_type.lower()}"))
    nodes = [n for n in work.nodes if id(n) not in replaced]
    # The new nodes read only `source`: put them right after its producer's place, i.e. where the
    # layout node was (the pipeline sorts the graph again before it finishes).
    at = next(k for k, n in enumerate(work.nodes) if id(n) == id(layout))
    before = sum(1 for n in work.nodes[:at] if id(n) not in replaced)
    work.nodes = [*nodes[:before], *added, *nodes[before:]]


def _layout_copy(work: WorkGraph, layout: NodeProto, data: str, out: str, name: str) -> NodeProto:
    """`layout` applied to `data`, writing `out` (whose type, the window's, is known)."""
    if layout.op_type == "Transpose":
        rank = len(work.types[data].tensor_type.shape.dim)
        return helper.make_node("Transpose", [data], [out], name=name, perm=transpose_perm(layout, rank))
    target = work.fresh_name(f"{out}_shape")
    shape = static_shape(work.types[out])
    assert shape is not None
    work.set_constant(target, np.array(shape, dtype=np.int64))
    return helper.make_node("Reshape", [data, target], [out], name=name)
