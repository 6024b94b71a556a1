"""OpenMP thread control through libgomp and the usable-core count."""

from __future__ import annotations

import ctypes
import os
import signal
import time
from pathlib import Path

import numpy as np

from graph_autofusion.backend.cpu import threads
from graph_autofusion.backend.cpu.cache import KernelCache
from graph_autofusion.backend.cpu.compiler import KernelSource, compile_kernels


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
