"""OpenMP thread control through libgomp and the usable-core count."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from graph_autofusion.backend.cpu import threads
from graph_autofusion.backend.cpu.cache import KernelCache
from graph_autofusion.backend.cpu.compiler import KernelSource, compile_kernels
from graph_autofusion.backend.cpu.render_c import PARALLEL_MIN_MACS_SYMBOL
from graph_autofusion.backend.cpu.runtime import compile_model
from graph_autofusion.backend.cpu.threads import (
    PASSIVE_WAKE_NS,
    WAKE_BREAK_EVEN,
    contraction_macs_per_ns,
    omp_wait_policy,
    parallel_min_macs,
)


def test_available_cpus_is_within_the_machine() -> None:
    assert 1 <= threads.available_cpus() <= (os.cpu_count() or 1)


def test_set_and_restore_omp_threads() -> None:
    before = threads.get_omp_threads()
    with threads.omp_threads(3):
        assert threads.get_omp_threads() == 3
        threads.set_omp_threads(1)
        assert threads.get_omp_threads() == 1
    assert threads.get_omp_threads() == before


def test_fork_after_a_parallel_region_does_not_hang(tmp_path: Path) -> None:
    src = """
void inc(float *x, long n) {
#pragma omp parallel for
    for (long i = 0; i < n; ++i) x[i] += 1.0f;
}
"""
    (art,) = compile_kernels([KernelSource("fork_inc", src)], cache=KernelCache(tmp_path))
    lib = art.load()
    x = np.zeros(4096, np.float32)
    with threads.omp_threads(2):
        lib.inc(ctypes.c_void_p(x.ctypes.data), ctypes.c_long(x.size))  # the parent's pool now exists
        pid = os.fork()
        if pid == 0:  # child: must finish, not hang in libgomp
            threads.set_omp_threads(2)
            lib.inc(ctypes.c_void_p(x.ctypes.data), ctypes.c_long(x.size))
            os._exit(0 if threads.forked_after_openmp() and x[0] == 2.0 else 3)
    deadline = time.monotonic() + 30
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError("the forked child hung in its first OpenMP region")
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(status) == 0
    assert x[0] == 1.0 and not threads.forked_after_openmp()


def test_configure_kernel_threads_gives_openmp_the_cores_and_blas_one() -> None:
    from graph_autofusion.backend.cpu import blas

    before = threads.get_omp_threads()
    try:
        assert threads.configure_kernel_threads(2) == 2
        assert blas.get_blas_threads() == 1
        assert threads.configure_kernel_threads() == threads.available_cpus()
    finally:
        threads.set_omp_threads(before)


def test_the_wake_bar_is_the_documented_break_even_and_only_for_sleeping_workers() -> None:
    # parallel_min_macs: WAKE_BREAK_EVEN * wake * rate for sleeping workers of a team of 2+;
    # nothing for spinning workers (the compile-time floor covers them) or one thread.
    rate = contraction_macs_per_ns(4)
    bar = parallel_min_macs(2, "passive")
    assert bar == int(WAKE_BREAK_EVEN * PASSIVE_WAKE_NS * rate) == 4_700_000
    # at the bar a loop takes T1 = 2 W on one thread and (T1 + W) / 2 = 0.75 T1 on two with fine
    # tiles (break-even at T1 = W): the quarter is the margin that coarse tiles eat
    t1 = bar / rate
    assert (t1 + PASSIVE_WAKE_NS) / 2 == pytest.approx(0.75 * t1)
    assert parallel_min_macs(2, "passive", wake_ns=10_000) == 940_000
    assert parallel_min_macs(1, "passive") == 0
    assert parallel_min_macs(2, "active") == parallel_min_macs(2, "default") == 0


@pytest.mark.parametrize(
    ("env", "policy", "omp", "spin"),
    [
        ({}, "BRIEF", None, str(threads.BRIEF_SPINCOUNT)),
        ({"AUTOFUSION_OMP_WAIT_POLICY": "passive"}, "PASSIVE", "PASSIVE", None),
        ({"AUTOFUSION_OMP_WAIT_POLICY": "default"}, "DEFAULT", None, None),
        ({"OMP_WAIT_POLICY": "ACTIVE"}, "ACTIVE", "ACTIVE", None),  # the environment's choice
        ({"GOMP_SPINCOUNT": "50"}, "BRIEF", None, "50"),
    ],
)
def test_the_wait_policy_is_chosen_before_libgomp_loads(
    env: dict[str, str], policy: str, omp: str | None, spin: str | None
) -> None:
    # a fresh interpreter: libgomp reads the variables once, when it loads
    code = (
        "import os; from graph_autofusion.backend.cpu import threads as t; "
        "print(t.omp_wait_policy(), os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'))"
    )
    ours = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "AUTOFUSION_OMP_WAIT_POLICY")
    clean = {k: v for k, v in os.environ.items() if k not in ours}
    out = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [policy, str(omp), str(spin)]
    # only workers that sleep at once raise the bar for waking the team
    assert (parallel_min_macs(2, policy) > 0) == (policy == "PASSIVE")


def test_the_wake_bar_follows_the_kernels_isa() -> None:
    # AVX2 kernels multiply-add about a quarter as fast as AVX-512 ones on the hosts measured, so
    # the same wake-up is paid back by a quarter of the work; levels below v3 take the AVX2 rate
    assert parallel_min_macs(2, "passive", isa_level=3) == int(WAKE_BREAK_EVEN * PASSIVE_WAKE_NS * 11.0)
    assert parallel_min_macs(2, "passive", isa_level=1) == parallel_min_macs(2, "passive", isa_level=3)
    assert parallel_min_macs(2, "passive", isa_level=3) < parallel_min_macs(2, "passive", isa_level=4)


def test_the_runtime_sets_the_bar_in_every_loaded_unit(kernel_cache) -> None:
    w = numpy_helper.from_array(np.ones((64, 32), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 32])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    compiled = compile_model(model, cache=kernel_cache, threads=2)
    want = parallel_min_macs(2, omp_wait_policy(), isa_level=compiled.isa.level)
    assert compiled.stats["parallel_min_macs"] == want
    libs = [compiled._lib(k.path) for k in compiled.kernels.values()]
    assert libs and all(ctypes.c_int64.in_dll(lib, PARALLEL_MIN_MACS_SYMBOL).value == want for lib in libs)
    single = compile_model(model, cache=kernel_cache, threads=1)
    assert single.stats["parallel_min_macs"] == 0
