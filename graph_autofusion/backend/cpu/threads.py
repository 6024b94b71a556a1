"""Thread counts for OpenMP kernels, and how many cores this process may really use.

The kernels' parallel regions run on the project's own thread pool (threadpool/__init__.py), not on
libgomp's teams: the team size is still the calling thread's OpenMP setting steered here, and the
wait policy below sets how long the pool's workers spin (`threadpool.SPIN_NS`). The libgomp notes that
follow hold for anything else built with OpenMP, and for `AUTOFUSION_THREAD_POOL=openmp`.

Generated kernels own the parallel loop (OpenMP) and call BLAS single-threaded inside it; two
thread pools fighting over the same cores is the classic way a fused model ends up slower than an
unfused one. This module is the one place that knows how to steer libgomp.

Note on `omp_set_num_threads`: OpenMP keeps the thread count per *calling thread* (an ICV of the
implicit task). A thread that never called it uses the process-wide default, which libgomp reads
from `OMP_NUM_THREADS` once, when it loads. So the runtime should call `set_omp_threads` in the
thread that runs the kernels (it costs nanoseconds), or use `omp_threads()` around a run.

Fork: libgomp is not fork-safe. Once a process has run a parallel region, a child it forks hangs
in its first parallel region with more than one thread (the child inherits the pool's bookkeeping
but not its threads). So a forked child of a process that had libgomp loaded is switched to one
OpenMP thread, and `set_omp_threads` keeps it there (with a warning). Celery's prefork pool is the
case that matters: load and run kernels in the worker children (inside tasks or
`worker_process_init`), never in the parent before it forks, and children keep full threads.

Waiting: idle OpenMP workers spin briefly, then sleep (`GOMP_SPINCOUNT=BRIEF_SPINCOUNT`, set
here, before libgomp loads, unless the environment already names a policy or a spin count). A
model run is a chain of parallel regions a few microseconds apart, so a worker that spins for a
few tens of microseconds is still awake for the next kernel and joins it at once, while between
runs, and whenever its team mate is descheduled for longer than that, it sleeps instead of holding
a core. Either extreme costs: libgomp's default spins up to ~300k iterations at every barrier (a
millisecond or more); on a machine shared with other busy processes a spinning worker takes the
core its descheduled team mate needs, and the kernels' closing barriers then wait whole scheduler
slices. Measured on 2 cores (Zen 4) with one busy neighbour process (`python -c "while True:
pass"`), 2 OpenMP threads, median of 15 runs: BERT-base 2 layers 80.5 ms (p90 271) spinning vs 51.3
ms (p90 83) sleeping at once (`OMP_WAIT_POLICY=PASSIVE`), ResNet-50 209 ms vs 120 ms. Sleeping at
once instead pays a futex wake, and on a virtual machine the wake of an idle vCPU, at every
kernel: on the 2-vCPU Intel Xeon AVX-512 host (2026-12-04), idle, fused ResNet-50 on 2 threads
(medians of 10-15 runs, onnxruntime in the same rounds) ran 38.9-39.0 ms passive, 36.2 ms with
GOMP_SPINCOUNT=1000, 35.0 with 10000 and 100000, 34.9-35.6 with libgomp's default; with
BRIEF_SPINCOUNT (2000) `benchmarks/runtime_speed.py` moved, fused/onnxruntime, ResNet-50 1.30 ->
1.23, MobileNetV2 1.05 -> 0.93, BERT-base 0.91 -> 0.87, GPT-2 0.96 -> 0.92, ViT-B/16 1.02 -> 0.99.
With the busy neighbour the brief spin costs 4-5% against passive (ResNet-50 67.8-69.6 vs
64.0-66.7 ms), a fraction of what full spinning costs there. `AUTOFUSION_OMP_WAIT_POLICY=passive`
sleeps at once (hosts packed with busy workers), `active` spins always, `default` leaves libgomp's
spin-then-sleep. The count is in iterations of a `pause` loop, so its duration follows the CPU's
`pause` latency: 11.7 ns an iteration on the Intel host, so 2000 is some 23 us there. On the
Zen 4 host, loaded, a longer spin (`GOMP_SPINCOUNT=10000`/`20000`) had measured 101-173 ms on
ResNet-50 against passive's 120. `omp_set_dynamic(1)` was tried and rejected: libgomp sizes the team as cores
minus the 1-minute load average, which counts this process itself, so on 2 cores it always ran
one thread and gave up the idle-machine speedup (BERT 2 layers 46-54 ms instead of 26-28 ms). A
policy set in the environment is left alone, and one that libgomp had already read (another
library loaded it first) cannot be changed: `omp_wait_policy()` reports what is in effect.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

log = logging.getLogger(__name__)
_forked_after_openmp = False


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
    """Set the OpenMP team size for parallel regions started from the calling thread.

    In a process forked from one that had libgomp loaded, this stays at 1 (see the module notes).
    """
    if n < 1:
        raise ValueError(f"thread count must be >= 1, got {n}")
    if n > 1 and _forked_after_openmp:
        log.warning(
            "OpenMP kept at 1 thread: this process was forked after OpenMP was loaded, and libgomp "
            "would hang; load kernels after the fork (in the worker process) to use %d threads",
            n,
        )
        n = 1
    _libgomp().omp_set_num_threads(n)


def configure_kernel_threads(n: int | None = None) -> int:
    """The one call a runtime makes before running kernels from the calling thread.

    OpenMP gets `n` threads (default: the usable cores) and BLAS one, because kernels own the
    parallel loop and call BLAS inside it. Returns the OpenMP thread count in effect.
    """
    from graph_autofusion.backend.cpu import blas  # the BLAS is loaded only when kernels run

    n = available_cpus() if n is None else n
    set_omp_threads(n)
    blas.set_blas_threads(1)
    return get_omp_threads()


def forked_after_openmp() -> bool:
    """Whether this process is a fork of one that had libgomp loaded (so it runs 1 thread)."""
    return _forked_after_openmp


def _libgomp_mapped() -> bool:
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            return any("libgomp" in line for line in maps)
    except OSError:
        return False


def _after_fork_in_child() -> None:
    global _forked_after_openmp
    if _libgomp_mapped():
        _forked_after_openmp = True
        _libgomp().omp_set_num_threads(1)  # the child has one thread: its default is now 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


WAIT_POLICY_ENV = "OMP_WAIT_POLICY"
SPINCOUNT_ENV = "GOMP_SPINCOUNT"
# Our own knob: "brief" (the default: spin BRIEF_SPINCOUNT iterations, then sleep), "passive",
# "active", or "default" to leave libgomp's own spin-then-sleep.
BACKEND_WAIT_POLICY_ENV = "AUTOFUSION_OMP_WAIT_POLICY"
DEFAULT_WAIT_POLICY = "BRIEF"
BRIEF_SPINCOUNT = 2000
_wait_policy: str | None = None  # what libgomp read, when known


def _default_wait_policy() -> None:
    """Choose how workers wait before libgomp loads (it reads the variables once, at load)."""
    global _wait_policy
    if _libgomp_mapped():
        _wait_policy = os.environ.get(WAIT_POLICY_ENV)  # already read: whatever was set then
        return
    wanted = os.environ.get(BACKEND_WAIT_POLICY_ENV, DEFAULT_WAIT_POLICY).strip().upper()
    if wanted not in ("BRIEF", "PASSIVE", "ACTIVE", "DEFAULT"):
        log.warning(
            "ignoring %s=%r (expected brief, passive, active or default)", BACKEND_WAIT_POLICY_ENV, wanted
        )
        wanted = DEFAULT_WAIT_POLICY
    if wanted == "DEFAULT" or WAIT_POLICY_ENV in os.environ:
        _wait_policy = os.environ.get(WAIT_POLICY_ENV)  # the environment's choice stands
        return
    if wanted == "BRIEF":
        os.environ.setdefault(SPINCOUNT_ENV, str(BRIEF_SPINCOUNT))
    else:
        os.environ[WAIT_POLICY_ENV] = wanted
    _wait_policy = wanted


def omp_wait_policy() -> str:
    """How idle OpenMP workers of this process wait: "BRIEF" (a short spin, then sleep:
    `GOMP_SPINCOUNT`), "PASSIVE", "ACTIVE", or "DEFAULT" (libgomp's spin-then-sleep: asked for,
    or libgomp was loaded before this module could choose)."""
    return (_wait_policy or "default").upper()


_default_wait_policy()


# The bar for waking the team (`parallel_min_macs`). A contraction loop of `macs` multiply-adds
# takes T1 = macs / rate on the calling thread; over a team whose workers join W late it takes
# about (T1 + W) / 2 with tiles handed out one at a time, so it pays from T1 > W with fine tiles;
# kernels cut as few as 4 (lower/anchor.py MIN_TILES), so a late worker finds fewer left: the bar
# is T1 > 2 W, that is macs > WAKE_BREAK_EVEN * W * rate.
WAKE_BREAK_EVEN = 2.0
# Single-thread multiply-adds per ns of the contraction library on the small tiles that sit near
# the bar, by the kernels' x86-64 level (`contraction_macs_per_ns`): 47 on the Zen 4 host
# (AVX-512; an 8x256x256 Gemm + bias + Relu kernel in 11.2 us), 11 on the Zen 1 host (AVX2 on a
# 128-bit datapath: the same kernel in 48.5 us, 8x512x512 at 11.7, 64x512x512 at 16.2; fastest
# of 200 profiled runs, one thread). With the AVX-512 figure an AVX2 host's bar was 4x high:
# loops of 1-5M multiply-adds, 100-430 us there, stayed on one thread. Intel's AVX2 cores (two
# 256-bit FMA ports) run at about twice Zen 1's rate, so their bar is up to 2x low; the few-row
# GEMV path (afc.h) streams weights at a third of the rate, so its loops near the bar would gain
# from the team and do not get it. Levels below v3 run the portable micro-kernel, no faster than
# AVX2, and take the AVX2 figure.
CONTRACTION_MACS_PER_NS = {4: 47.0, 3: 11.0}
# How late sleeping workers (OMP_WAIT_POLICY=PASSIVE) join a loop, W: the median of
# `contraction.shim.team_wake_ns` (15 probes of 200 us of work after 50 us idle) on the 2-vCPU
# Zen 4 host with neighbours running (load 2.5-4), ten runs: 46-105 us, most near 60 (spinning
# workers: 2.6-3.6 us); with both cores taken by neighbours it exceeded the probe's 200 us of
# work (229-232 us: the worker never joined). 50 us keeps the bar on the low side of that. On
# the 2-vCPU Zen 1 host (AVX2, otherwise idle) the probe read 90-230 us (2 ms of work after
# 50 us, 1 ms and 5 ms idle; three runs), so there the bar is up to 4x low and loops of 1-3M
# multiply-adds wake a team that joins when they are half done: a small loss either way. A
# fixed figure, not a probe at load: one busy moment at start-up would set a process's bar for
# its life, and kernels of tens of millions of multiply-adds (a ResNet-50 1x1 conv) would then
# run on one thread on an idle machine.
PASSIVE_WAKE_NS = 50_000


def contraction_macs_per_ns(isa_level: int) -> float:
    """CONTRACTION_MACS_PER_NS for kernels built for x86-64 level `isa_level`."""
    return CONTRACTION_MACS_PER_NS[4 if isa_level >= 4 else 3]


def parallel_min_macs(
    threads: int, policy: str | None = None, wake_ns: float = PASSIVE_WAKE_NS, isa_level: int = 4
) -> int:
    """The multiply-adds below which a parallel contraction loop runs on the calling thread alone
    (`af_parallel_min_macs`, the `if` clause render_c.py puts on its pragma, set by the runtime
    in every loaded unit): WAKE_BREAK_EVEN * wake_ns * the rate of kernels built for
    `isa_level` (`contraction_macs_per_ns`): 4.7M for AVX-512 kernels, 1.1M for AVX2.

    Only workers that sleep at once (`policy` "PASSIVE"; `omp_wait_policy()` by default) make a
    wake-up worth a bar: a futex wake and, on a virtual machine, the wake of an idle vCPU (with
    "BRIEF", the default, a worker is still spinning when the next kernel of a run starts). Gemm
    + Relu kernels alternating in one process on the Zen 4 host with neighbours running, 2 vs 1 thread,
    medians: 8x256x256 (524K multiply-adds) 48.9 vs 10.5 us, 8x512x512 (2.1M) 74.8 vs 40.1 us,
    64x512x512 (16.8M) 236 vs 313 us. Spinning workers (a fork/join of 0.5-0.8 us, which the
    compile-time floor lower/anchor.py PARALLEL_MIN_MACS covers) or one thread: 0, no bar.
    """
    policy = omp_wait_policy() if policy is None else policy.upper()
    if threads < 2 or policy != "PASSIVE":
        return 0
    return int(WAKE_BREAK_EVEN * wake_ns * contraction_macs_per_ns(isa_level))


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
