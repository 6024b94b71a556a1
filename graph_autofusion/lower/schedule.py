"""How long two threads take over a parallel loop's tasks, as the thread pool hands them out.

The lowerings that split work into few tasks (Winograd's bands and channel tiles, a matmul
chain's row blocks) choose their splits by this model of the pool's hand-out.
"""

from __future__ import annotations

from collections.abc import Sequence


def two_ended_makespan(costs: Sequence[float]) -> float:
    """When the later of two threads finishes tasks of these costs handed out from both ends of
    the loop (the thread pool's dynamic loops of two tasks: threadpool/pool.c), the first thread
    from the front, the other from the back, each taking the next as it finishes. A short task
    at the end goes early to the second thread and leaves the two meeting on a long one: with
    bands of 2, 2, 2 and 1 tile rows, ResNet-50's 256-channel 3x3 at 14x14 ran 8 against 6 rows
    (0.585 ms a call against 0.523 with one-ended hand-out, Zen 4)."""
    front, back, i, j = 0.0, 0.0, 0, len(costs) - 1
    while i <= j:
        if front <= back:
            front += costs[i]
            i += 1
        else:
            back += costs[j]
            j -= 1
    return max(front, back)
