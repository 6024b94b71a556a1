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
