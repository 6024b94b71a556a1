"""The kernels' thread pool: OpenMP regions of compiled units run as tasks the caller can finish alone."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import graph_autofusion as gaf
from graph_autofusion import zoo
from graph_autofusion.backend.cpu import threadpool, threads
from graph_autofusion.backend.cpu.cache import KernelCache
from graph_autofusion.backend.cpu.compiler import KernelSource, compile_kernels
from graph_autofusion.backend.cpu.runtime import compile_model

# small zoo models: every kind of kernel the generators emit (convs, depthwise, attention, norms)
SMALL = {
    "mobilenet_v2": {"image_size": 64, "width_mult": 0.5, "num_classes": 10},
    "bert_base": {"num_layers": 1, "hidden": 64, "heads": 2, "seq_len": 16, "vocab": 100},
    "resnet50": {"image_size": 32, "width": 8, "layers": (1, 1, 1, 1), "num_classes": 10},
}

REGIONS = r"""
#include <omp.h>
#include <stdint.h>
#include <time.h>
/* who[i] = 1 + the OpenMP thread that ran iteration i (static schedule), teams[i] its team size */
void static_owner(int32_t *who, int32_t *teams, long n) {
#pragma omp parallel for schedule(static)
  for (long i = 0; i < n; ++i) { who[i] = 1 + omp_get_thread_num(); teams[i] = omp_get_num_threads(); }
}
/* who[i] = 1 + the OpenMP thread that ran iteration i of a dynamic schedule (chunks of 1) */
void dynamic_owner(int32_t *who, long n) {
#pragma omp parallel for schedule(dynamic, 1)
  for (long i = 0; i < n; ++i) {
    volatile float spin = 0.0f; /* a few hundred ns of work: the worker gets a share */
    for (int k = 0; k < 200; ++k) spin += 1.0f;
    who[i] = 1 + omp_get_thread_num();
  }
}
/* hits[i] += 1 for every iteration a dynamic schedule hands out, in chunks of 3 */
void dynamic_hits(int32_t *hits, long n) {
#pragma omp parallel for schedule(dynamic, 3)
  for (long i = 0; i < n; ++i) hits[i] += 1;
}
/* a region with per-thread scratch around a dynamic worksharing loop, as render_c emits them */
void scratch_rows(const float *x, float *y, float *scratch, long rows, long cols) {
#pragma omp parallel
  {
    float *mine = scratch + (long)omp_get_thread_num() * cols;
#pragma omp for schedule(dynamic)
    for (long r = 0; r < rows; ++r) {
      for (long c = 0; c < cols; ++c) mine[c] = 2.0f * x[r * cols + c];
      for (long c = 0; c < cols; ++c) y[r * cols + c] = mine[cols - 1 - c];
    }
  }
}
float max_reduce(const float *x, long n) {
  float m = -1e30f;
#pragma omp parallel for reduction(max : m)
  for (long i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}
double sum_reduce(const float *x, long n) {
  double s = 0.0;
#pragma omp parallel for reduction(+ : s)
  for (long i = 0; i < n; ++i) s += x[i];
  return s;
}
/* a region whose thread 0 works for `ns` nanoseconds and whose other threads return at once */
void uneven_region(long ns) {
#pragma omp parallel
  {
    if (omp_get_thread_num() == 0) {
      struct timespec t0, t;
      clock_gettime(CLOCK_MONOTONIC, &t0);
      do clock_gettime(CLOCK_MONOTONIC, &t);
      while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < ns);
    }
  }
}
int serial_if(long n) {
  int team = 0;
#pragma omp parallel if (n > 1000)
  {
    if (omp_get_thread_num() == 0) team = omp_get_num_threads();
  }
  return team;
}
"""


@pytest.fixture(scope="module")
def regions(kernel_cache: KernelCache) -> ctypes.CDLL:
    (art,) = compile_kernels([KernelSource("pool_regions", REGIONS)], cache=kernel_cache)
    lib = art.load()
    lib.max_reduce.restype = ctypes.c_float
    lib.sum_reduce.restype = ctypes.c_double
    return lib


def ptr(a: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data)


@pytest.fixture(params=["workers", "caller_alone"])
def team_of_two(request: pytest.FixtureRequest):
    """Two threads, with the worker taking tasks or (`caller_alone`) held off them."""
    with threads.omp_threads(2):
        if request.param == "caller_alone":
            with threadpool.workers_held():
                yield request.param
        else:
            yield request.param


def test_units_are_attached_and_their_regions_run_on_the_pool(regions: ctypes.CDLL) -> None:
    assert ctypes.c_void_p.in_dll(regions, threadpool.API_SYMBOL).value is not None
    before = threadpool.stats()["regions"]
    who, teams = np.zeros(1000, np.int32), np.zeros(1000, np.int32)
    with threads.omp_threads(2):
        regions.static_owner(ptr(who), ptr(teams), ctypes.c_long(1000))
    assert threadpool.stats()["regions"] == before + 1
    assert threadpool.stats()["workers"] >= 1


def test_static_schedules_see_the_task_as_their_thread(regions: ctypes.CDLL, team_of_two: str) -> None:
    who, teams = np.zeros(1001, np.int32), np.zeros(1001, np.int32)
    regions.static_owner(ptr(who), ptr(teams), ctypes.c_long(who.size))
    # gcc's static schedule: thread 0 takes the first ceil(n / 2) iterations, thread 1 the rest
    np.testing.assert_array_equal(who, np.repeat([1, 2], [501, 500]))
    assert set(teams.tolist()) == {2}


def test_the_caller_alone_runs_every_task(regions: ctypes.CDLL) -> None:
    """A worker that never comes (asleep, descheduled) costs its share of the work, not a wait."""
    before = threadpool.stats()
    with threads.omp_threads(2), threadpool.workers_held():
        for _ in range(50):
            who, teams = np.zeros(64, np.int32), np.zeros(64, np.int32)
            regions.static_owner(ptr(who), ptr(teams), ctypes.c_long(64))
            assert set(who.tolist()) == {1, 2}
    after = threadpool.stats()
    assert after["regions"] == before["regions"] + 50
    assert after["tasks_by_workers"] == before["tasks_by_workers"]


def test_two_threads_take_dynamic_chunks_from_both_ends(regions: ctypes.CDLL, team_of_two: str) -> None:
    """Thread 0 takes a prefix of the iterations, thread 1 the rest from the back: each thread
    keeps about the same part of the image from one kernel to the next (pool.c says why)."""
    for n in (1, 2, 5, 64, 1000):
        for _ in range(20):
            who = np.zeros(n, np.int32)
            regions.dynamic_owner(ptr(who), ctypes.c_long(n))
            assert set(who.tolist()) <= {1, 2}
            assert np.all(np.diff(who) >= 0), who  # ones, then twos
            if team_of_two == "caller_alone":
                assert set(who.tolist()) == {1}  # thread 1's task, run last, finds nothing left


def test_dynamic_schedules_hand_out_each_iteration_once(regions: ctypes.CDLL, team_of_two: str) -> None:
    for n in (0, 1, 2, 3, 7, 1000, 100_003):
        hits = np.zeros(max(n, 1), np.int32)
        regions.dynamic_hits(ptr(hits), ctypes.c_long(n))
        np.testing.assert_array_equal(hits[:n], 1)


def test_scratch_per_thread_around_a_worksharing_loop(regions: ctypes.CDLL, team_of_two: str) -> None:
    rows, cols = 257, 33
    x = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    y = np.zeros_like(x)
    scratch = np.full((2, cols), np.nan, np.float32)
    regions.scratch_rows(ptr(x), ptr(y), ptr(scratch), ctypes.c_long(rows), ctypes.c_long(cols))
    np.testing.assert_array_equal(y, 2.0 * x[:, ::-1])


def test_reductions(regions: ctypes.CDLL, team_of_two: str) -> None:
    x = np.random.default_rng(1).standard_normal(100_001).astype(np.float32)
    assert regions.max_reduce(ptr(x), ctypes.c_long(x.size)) == x.max()
    total = float(x.astype(np.float64).sum())
    assert regions.sum_reduce(ptr(x), ctypes.c_long(x.size)) == pytest.approx(total)


def test_a_false_if_clause_runs_a_team_of_one(regions: ctypes.CDLL) -> None:
    with threads.omp_threads(2):
        assert regions.serial_if(ctypes.c_long(10)) == 1
        assert regions.serial_if(ctypes.c_long(10_000)) == 2


def test_callers_on_two_threads_at_once(regions: ctypes.CDLL) -> None:
    """The pool serves one caller at a time; a second runs its region inline, still right."""
    failures: list[str] = []

    def hammer(seed: int) -> None:
        threads.set_omp_threads(2)
        for n in range(1, 400, 7):
            hits = np.zeros(n, np.int32)
            regions.dynamic_hits(ptr(hits), ctypes.c_long(n))
            if not (hits == 1).all():
                failures.append(f"caller {seed}, n={n}")

    workers = [threading.Thread(target=hammer, args=(i,)) for i in range(3)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=60)
    assert not failures


def test_switched_off_units_keep_libgomp(kernel_cache: KernelCache, monkeypatch) -> None:
    monkeypatch.setenv(threadpool.POOL_ENV, "openmp")
    (art,) = compile_kernels([KernelSource("pool_regions", REGIONS)], cache=kernel_cache)
    assert not threadpool.attach(ctypes.CDLL(str(art.path)))
    monkeypatch.setenv(threadpool.POOL_ENV, "pool")
    assert threadpool.attach(ctypes.CDLL(str(art.path)))


def test_a_barrier_inside_a_pool_region_stops_loudly(tmp_path: Path) -> None:
    """Tasks of one region may run one after another on one thread: a barrier cannot hold."""
    script = textwrap.dedent(
        f"""
        import ctypes
        from graph_autofusion.backend.cpu import threads
        from graph_autofusion.backend.cpu.cache import KernelCache
        from graph_autofusion.backend.cpu.compiler import KernelSource, compile_kernels
        src = '''
        void two_phases(float *x) {{
        #pragma omp parallel
          {{
            x[0] += 1.0f;
        #pragma omp barrier
            x[1] += 1.0f;
          }}
        }}
        '''
        (art,) = compile_kernels([KernelSource("pool_barrier", src)], cache=KernelCache({str(tmp_path)!r}))
        lib = art.load()
        x = (ctypes.c_float * 2)()
        with threads.omp_threads(1):
            lib.two_phases(x)  # a team of one has nothing to wait for
        print("one thread ok", flush=True)
        with threads.omp_threads(2):
            lib.two_phases(x)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert "one thread ok" in proc.stdout
    assert proc.returncode != 0
    assert "a barrier inside a parallel region of the thread pool" in proc.stderr


def test_generated_kernels_call_only_routed_entry_points(kernel_cache: KernelCache) -> None:
    """Every libgomp entry point a zoo model's kernels reference is one the entry shim routes:
    one it does not would run libgomp's own team around the pool's bookkeeping."""
    routed = {*threadpool.WRAPPED, "omp_get_max_threads"}
    for name, size in SMALL.items():
        model = compile_model(gaf.fuse(zoo.build(name, **size)).model, cache=kernel_cache, threads=2)
        for path in {info.path for info in model.kernels.values()}:
            out = subprocess.run(["nm", "-D", "--undefined-only", str(path)], capture_output=True, text=True)
            names = {line.split()[-1].split("@")[0] for line in out.stdout.splitlines() if line.strip()}
            openmp = {n for n in names if n.startswith(("GOMP_", "omp_"))}
            assert openmp <= routed, (name, path.name, openmp - routed)


def test_a_model_gives_the_same_answer_on_the_pool_and_on_libgomp(kernel_cache: KernelCache) -> None:
    source = zoo.build("mobilenet_v2", **SMALL["mobilenet_v2"])
    feeds = zoo.example_inputs(source)
    pooled = compile_model(gaf.fuse(source).model, cache=kernel_cache, threads=2)
    before = threadpool.stats()["regions"]
    got = pooled(feeds)
    assert pooled.stats["thread_pool"] == "pool"
    assert threadpool.stats()["regions"] > before
    env = {**os.environ, threadpool.POOL_ENV: "openmp"}
    script = textwrap.dedent(
        f"""
        import numpy as np, sys
        import graph_autofusion as gaf
        from graph_autofusion import zoo
        from graph_autofusion.backend.cpu.cache import KernelCache
        from graph_autofusion.backend.cpu.runtime import compile_model
        source = zoo.build("mobilenet_v2", **{SMALL["mobilenet_v2"]!r})
        m = compile_model(gaf.fuse(source).model, cache=KernelCache({str(kernel_cache.root)!r}), threads=2)
        out = m(zoo.example_inputs(source))
        np.savez(sys.argv[1], **out)
        """
    )
    target = kernel_cache.root / "openmp_outputs.npz"
    subprocess.run([sys.executable, "-c", script, str(target)], env=env, check=True, timeout=600)
    expected = np.load(target)
    for key, value in got.items():
        np.testing.assert_array_equal(value, expected[key])


def _worker_tids() -> list[int]:
    """The pool's worker threads, by their name."""
    tids = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            if (task / "comm").read_text().strip() == threadpool.WORKER_NAME:
                tids.append(int(task.name))
        except FileNotFoundError:  # a thread of another library that has just ended
            continue
    return tids


def _state(tid: int) -> str:
    """A thread's scheduler state letter (R running or runnable, S asleep, ...)."""
    return Path(f"/proc/{os.getpid()}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _asleep_with(region: Callable[[], None], tid: int, cpus: set[int], tries: int = 20) -> set[int]:
    """The CPUs a worker may run on once it sleeps with `cpus` after `region` (or the last seen).

    The region's wake reaches the worker asynchronously, and it sleeps again 100 us after it; a
    worker that was about to sleep when the region began, and found its tasks already taken, sleeps
    through it with the mask of the caller before (the next region wakes it): so run the region
    again until the mask shows, a few times."""
    allowed: set[int] = set()
    for _ in range(tries):
        region()
        deadline = time.monotonic() + 0.2
        while time.monotonic() < deadline:
            state = _state(tid)
            allowed = os.sched_getaffinity(tid)
            if state == "S" and allowed == cpus:
                return allowed
            time.sleep(0.01)
    return allowed


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to keep apart")
def test_a_sleeping_worker_keeps_off_its_callers_cpu(regions: ctypes.CDLL) -> None:
    """A worker sleeps with the last caller's CPU out of its affinity (a wake in a virtual machine
    put it beside its caller: pool.c), and takes back its whole mask when it wakes: after the
    caller moves to another CPU, the sleeping worker avoids that one instead."""
    allowed = os.sched_getaffinity(0)
    first, second = sorted(allowed)[:2]
    who, teams = np.zeros(64, np.int32), np.zeros(64, np.int32)
    try:
        with threads.omp_threads(2):
            # the worker starts unpinned (a thread inherits its creator's affinity)
            regions.static_owner(ptr(who), ptr(teams), ctypes.c_long(who.size))
            (tid,) = _worker_tids()

            def region() -> None:
                regions.static_owner(ptr(who), ptr(teams), ctypes.c_long(who.size))

            for caller in (first, second):
                os.sched_setaffinity(0, {caller})  # this thread, the regions' caller
                assert _asleep_with(region, tid, allowed - {caller}) == allowed - {caller}
    finally:
        os.sched_setaffinity(0, allowed)


def test_a_worker_done_early_spins_while_its_region_runs(regions: ctypes.CDLL) -> None:
    """The spin counts from the pool's last busy moment: a worker whose share ended early keeps
    spinning while the caller finishes the region (the next one follows within microseconds),
    instead of sleeping 100 us after its own task and making the next region wake it."""
    with threads.omp_threads(2):
        regions.uneven_region(ctypes.c_long(0))  # the worker exists and is awake
        (tid,) = _worker_tids()
        states: list[str] = []
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                states.append(_state(tid))
                time.sleep(0.002)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            regions.uneven_region(ctypes.c_long(300_000_000))  # 0.3 s, the worker's task empty
        finally:
            done.set()
            sampler.join()
    assert len(states) > 20 and "R" in states
    # from its wake (a few ms on a virtual machine) to the region's end: spinning, where a worker
    # that counted its spin from its own (empty) task would sleep from 100 us on, and one
    # preempted between two clock readings of its spin check slept mid-region (4 runs in 10 on a
    # Zen 4 host, the sampler thread taking its CPU); a few samples are allowed to miss
    awake = states[states.index("R") : -1]
    assert len(awake) > 20 and awake.count("S") <= len(awake) // 5, "".join(states)
