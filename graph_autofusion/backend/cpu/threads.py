"""Thread counts for OpenMP kernels, and how many cores this process may really use.

Generated kernels own the parallel loop (OpenMP) and call BLAS single-threaded inside it; two
thread pools fighting over the same cores is the classic way a fused model ends up slower than an
unfused one. This module is the one place that knows how to steer libgomp.

Note on `omp_set_num_threads`: OpenMP keeps the thread count per *calling thread* (an ICV of the
implicit task). A thread that never called it uses the process-wide default, which libgomp reads
from `OMP_NUM_THREADS` once, when it loads. So the runtime should call `set_omp_threads` in the
thread that runs the kernels (it costs nanoseconds), or use `omp_threads()` around a run.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path


def available_cpus() -> int:
    """Cores this process may use: CPU affinity, further capped by a cgroup v2 CPU quota."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        count = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            count = min(count, max(1, int(int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return max(1, count)


@lru_cache(maxsize=1)
def _libgomp() -> ctypes.CDLL:
    """libgomp as the kernels see it: the same soname, so the same loaded instance."""
    name = ctypes.util.find_library("gomp") or "libgomp.so.1"
    lib = ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
    lib.omp_set_num_threads.argtypes = [ctypes.c_int]
    lib.omp_set_num_threads.restype = None
    lib.omp_get_max_threads.argtypes = []
    lib.omp_get_max_threads.restype = ctypes.c_int
    return lib


def set_omp_threads(n: int) -> None:
    """Set the OpenMP team size for parallel regions started from the calling thread."""
    if n < 1:
        raise ValueError(f"thread count must be >= 1, got {n}")
    _libgomp().omp_set_num_threads(n)


def get_omp_threads() -> int:
    """The team size a parallel region started from the calling thread would get."""
    return int(_libgomp().omp_get_max_threads())


@contextmanager
def omp_threads(n: int) -> Iterator[None]:
    """Run a block with `n` OpenMP threads in the calling thread, restoring the old count after."""
    previous = get_omp_threads()
    set_omp_threads(n)
    try:
        yield
    finally:
        set_omp_threads(previous)
