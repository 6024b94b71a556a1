"""Memory layouts shared by the planner and the code generators.

Whether a view can be taken without a copy decides both what the planner may fuse (a stride change
is free, a gather is not) and how a kernel addresses its operands, so the rule lives in one place.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def reshape_strides(
    shape: Sequence[int], strides: Sequence[int], new_shape: Sequence[int]
) -> tuple[int, ...] | None:
    """Strides of `new_shape` over the same elements without a copy, or None (numpy's rule)."""
    old = [(int(d), int(s)) for d, s in zip(shape, strides, strict=True) if int(d) != 1]
    new = [int(d) for d in new_shape]
    out = [0] * len(new)
    if math.prod(new) != math.prod(d for d, _ in old):
        return None
    nonunit = [a for a, d in enumerate(new) if d != 1]
    oi = 0
    ni = 0
    while ni < len(nonunit) and oi < len(old):
        nj, oj = ni + 1, oi + 1
        np_, op = new[nonunit[ni]], old[oi][0]
        while np_ != op:
            if np_ < op:
                if nj >= len(nonunit):
                    return None
                np_ *= new[nonunit[nj]]
                nj += 1
            else:
                if oj >= len(old):
                    return None
                op *= old[oj][0]
                oj += 1
        for k in range(oi, oj - 1):
            if old[k][1] != old[k + 1][0] * old[k + 1][1]:
                return None
        out[nonunit[nj - 1]] = old[oj - 1][1]
        for k in range(nj - 1, ni, -1):
            out[nonunit[k - 1]] = out[nonunit[k]] * new[nonunit[k]]
        ni, oi = nj, oj
    return tuple(out)


def axis_groups(src: Sequence[int], dst: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """Pair runs of input axes with runs of output axes holding the same elements (a reshape keeps
    the element order, so both shapes split the flat index at the same places)."""
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(src) or j < len(dst):
        si, dj = [], []
        ps = pd = 1
        if i < len(src):
            ps *= src[i]
            si.append(i)
            i += 1
        if j < len(dst):
            pd *= dst[j]
            dj.append(j)
            j += 1
        while ps != pd:
            if ps < pd and i < len(src):
                ps *= src[i]
                si.append(i)
                i += 1
            elif pd < ps and j < len(dst):
                pd *= dst[j]
                dj.append(j)
                j += 1
            else:
                return []  # sizes do not match: not a reshape of static shapes
        groups.append((si, dj))
    return groups


def split_sizes(dim: int, outputs: int, given: Sequence[int] | None) -> list[int] | None:
    """Sizes of a Split's outputs along its axis (ONNX rules), or None when they do not cover it.

    Without explicit sizes the axis splits into equal parts, the last one smaller when it does not
    divide (opset 18; earlier opsets only allow even splits, which this rule also gives)."""
    if outputs < 1:
        return None
    if given is not None:
        sizes = [int(v) for v in given]
    else:
        part = -(-dim // outputs)
        sizes = [max(0, min(part, dim - k * part)) for k in range(outputs)]
    if len(sizes) != outputs or any(s < 0 for s in sizes) or sum(sizes) != dim:
        return None
    return sizes


def slice_window(
    shape: Sequence[int],
    starts: Sequence[int],
    ends: Sequence[int],
    axes: Sequence[int] | None,
    steps: Sequence[int] | None,
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(first index, shape) of a step-1 Slice of `shape` (ONNX clamping rules), or None.

    Such a window is the source's strides from an element offset, so it is a view, not a copy;
    any other step is a gather."""
    rank = len(shape)
    axes = list(range(len(starts))) if axes is None else [int(a) for a in axes]
    if len(starts) != len(ends) or len(axes) != len(starts):
        return None
    if steps is not None and (len(steps) != len(starts) or any(int(s) != 1 for s in steps)):
        return None
    begin = [0] * rank
    out = [int(d) for d in shape]
    seen: set[int] = set()
    for start, end, axis in zip(starts, ends, axes, strict=True):
        if not -rank <= axis < rank or axis % rank in seen:
            return None
        axis %= rank
        seen.add(axis)
        dim = int(shape[axis])
        lo = int(start) + dim if int(start) < 0 else int(start)
        hi = int(end) + dim if int(end) < 0 else int(end)
        lo, hi = min(max(lo, 0), dim), min(max(hi, 0), dim)
        begin[axis], out[axis] = lo, max(0, hi - lo)
    return tuple(begin), tuple(out)
