"""One memory arena for every intermediate tensor, planned from tensor lifetimes.

Each buffer lives from the step that writes it to the last step that reads it (through any view
that aliases it). Offsets are assigned greedily, largest buffer first, each at the best-fitting
gap (the smallest gap that holds it) among the buffers whose lifetimes overlap — the
"greedy by size" offset planning of TFLite's memory planner. The arena's size is the peak the
model needs, which the runtime reports as `arena_bytes`.

Lifetimes are inclusive on both ends, so a kernel's outputs never share memory with its inputs
(the kernel contract says outputs never alias inputs).
"""

from __future__ import annotations

from dataclasses import dataclass

ALIGNMENT = 64  # a cache line, and enough for any vector load


@dataclass(frozen=True)
class Buffer:
    name: str
    size: int  # bytes
    first: int  # step that writes it (-1: bound before the first step)
    last: int  # last step that reads it


def _align(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def plan_offsets(buffers: list[Buffer]) -> tuple[dict[str, int], int]:
    """Offsets per buffer name and the arena size (the peak)."""
    placed: list[tuple[int, int, Buffer]] = []  # (offset, aligned size, buffer)
    offsets: dict[str, int] = {}
    order = sorted(buffers, key=lambda b: (-b.size, b.first, b.name))
    for buf in order:
        size = _align(max(buf.size, 1))
        live = sorted(
            (off, sz) for off, sz, other in placed if not (other.last < buf.first or buf.last < other.first)
        )
        best: int | None = None
        best_gap: int | None = None
        cursor = 0
        for off, sz in live:
            gap = off - cursor
            if gap >= size and (best_gap is None or gap < best_gap):
                best, best_gap = cursor, gap
            cursor = max(cursor, off + sz)
        offset = best if best is not None else cursor
        offsets[buf.name] = offset
        placed.append((offset, size, buf))
    peak = max((off + sz for off, sz, _ in placed), default=0)
    return offsets, peak
