"""The thread pool that runs the generated kernels' parallel loops.

Why not libgomp's teams: an OpenMP parallel region cannot end before every thread of its team has
checked in, so each kernel of a run pays for any worker that is late: asleep after its spin, or on
a vCPU the hypervisor took away for a while. On the 2-vCPU hosts this project runs on that made
the fused conv nets bimodal (ResNet-50 18 ms in one stretch, 20-33 ms in another, the same code;
onnxruntime, whose caller finishes a loop alone when its workers are late, barely moved).

How: kernels are still written and compiled with OpenMP pragmas (gcc outlines each region and
computes static schedules inline); every OpenMP unit is linked with `entry.c` and
`-Wl,--wrap=<entry point>` for each libgomp entry point gcc emits (`WRAPPED`), so those calls go
to this pool (`pool.c`) once the runtime attaches it to the unit (`attach`). A region of T threads
becomes T tasks, task i running the outlined body as OpenMP thread i: the caller runs task 0,
claims the others from one atomic word as the workers do and then waits only for tasks already
started, so a late worker costs nothing but its share of the work. With two threads a dynamic
loop is handed out from both ends, thread 0 from the front and thread 1 from the back, so each
core keeps about the same half of the image from kernel to kernel (pool.c says what it
measured). Workers spin while a region runs and `spin_ns` after the last
one (the kernels of a run are microseconds apart), then sleep on a futex that the next region's
caller rings without waiting for anyone to wake; a worker sleeps with its caller's CPU out of its
affinity, so that the wake cannot put it beside its caller (pool.c: afp_sleep_away, with figures).

Team size stays where it was: a `num_threads` clause, else the calling thread's OpenMP setting
(`threads.set_omp_threads`, the team policy in team.py). `AUTOFUSION_THREAD_POOL=openmp` leaves
units unattached, running libgomp's teams as before (a comparison, or a kernel that needs what
the pool does not support: a barrier inside a region stops the process with a message).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from graph_autofusion.backend.cpu.compiler import KernelSource


_HERE = Path(__file__).resolve().parent
POOL_ENV = "AUTOFUSION_THREAD_POOL"
API_SYMBOL = "af_pool_api"
SYMBOL = "afp_pool"  # the pool's unit, among a model's artifacts
WORKER_NAME = "afp-worker"  # the workers' thread name (pool.c: AFP_WORKER_NAME)
# Every libgomp entry point the entry shim routes (gcc's outlined regions, nonmonotonic dynamic
# schedules, static schedules' thread queries, atomics for reductions it cannot do lock-free).
WRAPPED = (
    "GOMP_parallel",
    "GOMP_parallel_loop_nonmonotonic_dynamic",
    "GOMP_loop_nonmonotonic_dynamic_start",
    "GOMP_loop_nonmonotonic_dynamic_next",
    "GOMP_loop_end_nowait",
    "GOMP_loop_end",
    "GOMP_barrier",
    "GOMP_atomic_start",
    "GOMP_atomic_end",
    "omp_get_thread_num",
    "omp_get_num_threads",
)
# How long a worker spins after the last region, by threads.omp_wait_policy(): long enough to
# bridge the gaps between a run's kernels (a few microseconds, up to tens where the host runs a
# small operator between them), short enough that an idle process gives its cores back at once.
SPIN_NS = {"BRIEF": 100_000, "PASSIVE": 0, "ACTIVE": -1, "DEFAULT": 2_000_000}


def enabled() -> bool:
    """Whether loaded units run their regions on the pool (`AUTOFUSION_THREAD_POOL`, default on)."""
    return os.environ.get(POOL_ENV, "pool").strip().lower() != "openmp"


def _with_api(name: str) -> str:
    """`name`'s C text after api.h, the table layout both sides share."""
    return (_HERE / "api.h").read_text(encoding="utf-8") + (_HERE / name).read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def entry_source() -> str:
    """The C text linked into every OpenMP unit next to its kernels."""
    return _with_api("entry.c")


def link_flags() -> list[str]:
    """The linker flags that send a unit's libgomp calls to its entry shim."""
    return [f"-Wl,--wrap={symbol}" for symbol in WRAPPED]


def source() -> KernelSource:
    """The pool as a unit to compile: it goes with every compiled model, as the driver does, so
    a bundle carries it and loads without compiling."""
    from graph_autofusion.backend.cpu.compiler import KernelSource

    return KernelSource(SYMBOL, _with_api("pool.c"), uses_openmp=False)


_loaded: ctypes.CDLL | None = None


def load(path: Path) -> ctypes.CDLL:
    """The process's pool: the first one loaded serves every unit (builds of the same `pool.c`
    are interchangeable, and a second pool would be a second set of workers)."""
    global _loaded
    if _loaded is None:
        lib = ctypes.CDLL(str(path))
        for name, restype, argtypes in (
            ("afp_set_spin_ns", None, [ctypes.c_long]),
            ("afp_spin_ns", ctypes.c_long, []),
            ("afp_workers", ctypes.c_int, []),
            ("afp_regions", ctypes.c_long, []),
            ("afp_tasks_by_workers", ctypes.c_long, []),
            ("afp_step_asides", ctypes.c_long, []),
            ("afp_hold_workers", None, [ctypes.c_int]),
            ("afp_set_two_ended", None, [ctypes.c_int]),
        ):
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
        from graph_autofusion.backend.cpu.threads import omp_wait_policy

        lib.afp_set_spin_ns(SPIN_NS.get(omp_wait_policy(), SPIN_NS["BRIEF"]))
        _loaded = lib
    return _loaded


def library() -> ctypes.CDLL:
    """The process's pool, compiled (through the kernel cache) and loaded if none is yet."""
    if _loaded is not None:
        return _loaded
    from graph_autofusion.backend.cpu.compiler import compile_kernels

    (artifact,) = compile_kernels([source()])
    return load(artifact.path)


def attach(lib: ctypes.CDLL, pool_path: Path | None = None) -> bool:
    """Route `lib`'s parallel regions to the pool (the one at `pool_path` unless one is loaded;
    compiled if neither); False where `lib` has no entry shim (a non-OpenMP unit, one built
    before the pool) or the pool is switched off."""
    if not enabled():
        return False
    try:
        slot = ctypes.c_void_p.in_dll(lib, API_SYMBOL)
    except ValueError:
        return False
    pool_lib = load(pool_path) if pool_path is not None else library()
    slot.value = ctypes.addressof(ctypes.c_char.in_dll(pool_lib, "afp_api"))
    return True


@contextmanager
def workers_held() -> Iterator[None]:
    """Workers claim no task inside the block: every region's caller runs all of its tasks, as
    when its workers are asleep or descheduled (for tests of that path)."""
    library().afp_hold_workers(1)
    try:
        yield
    finally:
        library().afp_hold_workers(0)


def stats() -> dict[str, int]:
    """Workers started, regions run on the pool, tasks the workers (not the callers) ran, and
    how often a worker found itself on its caller's CPU and moved off it (pool.c: afp_step_aside)."""
    lib = library()
    return {
        "workers": int(lib.afp_workers()),
        "regions": int(lib.afp_regions()),
        "tasks_by_workers": int(lib.afp_tasks_by_workers()),
        "step_asides": int(lib.afp_step_asides()),
        "spin_ns": int(lib.afp_spin_ns()),
    }
