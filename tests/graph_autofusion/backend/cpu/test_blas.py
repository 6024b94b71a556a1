"""Kernels that call the pip-installed OpenBLAS: correct numbers, self-contained linking, threads."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from graph_autofusion.backend.cpu import blas
from graph_autofusion.backend.cpu.cache import KernelCache
from graph_autofusion.backend.cpu.compiler import Artifact, KernelSource, compile_kernels

GEMM = (
    blas.BLAS_PREAMBLE
    + """
void gemm(const float *A, const float *B, float *C, int M, int N, int K, int trans_b) {
    AF_SGEMM(AfRowMajor, AfNoTrans, trans_b ? AfTrans : AfNoTrans, M, N, K,
             1.0f, A, K, B, trans_b ? K : N, 0.0f, C, N);
}
"""
)

# The anchor shape the code generator emits: the kernel owns the parallel loop over row blocks,
# BLAS runs single-threaded inside it, and the bias+ReLU epilogue runs on the block while hot.
GEMM_BIAS_RELU = (
    blas.BLAS_PREAMBLE
    + """
#include <stdint.h>
void gemm_bias_relu(const float *A, const float *B, const float *bias, float *C,
                    int M, int N, int K) {
    const int MB = 16;
#pragma omp parallel for schedule(dynamic, 1)
    for (int m0 = 0; m0 < M; m0 += MB) {
        int mb = M - m0 < MB ? M - m0 : MB;
        float *c = C + (int64_t)m0 * N;
        AF_SGEMM(AfRowMajor, AfNoTrans, AfNoTrans, mb, N, K, 1.0f, A + (int64_t)m0 * K, K,
                 B, N, 0.0f, c, N);
        for (int i = 0; i < mb; ++i) {
#pragma omp simd
            for (int j = 0; j < N; ++j) {
                float v = c[(int64_t)i * N + j] + bias[j];
                c[(int64_t)i * N + j] = v > 0.0f ? v : 0.0f;
            }
        }
    }
}
"""
)


def _ptr(a: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data)


@pytest.fixture(scope="module")
def arts(tmp_path_factory: pytest.TempPathFactory) -> list[Artifact]:
    cache = KernelCache(tmp_path_factory.mktemp("blas-kernels"))
    return compile_kernels(
        [
            KernelSource("gemm", GEMM, uses_blas=True),
            KernelSource("gemm_bias_relu", GEMM_BIAS_RELU, uses_blas=True),
        ],
        cache=cache,
    )


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_through_the_preamble_matches_numpy(arts: list[Artifact], trans_b: int) -> None:
    rng = np.random.default_rng(trans_b)
    M, N, K = 37, 29, 65
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((N, K) if trans_b else (K, N)).astype(np.float32)
    c = np.empty((M, N), np.float32)
    arts[0].load().gemm(_ptr(a), _ptr(b), _ptr(c), M, N, K, trans_b)
    expected = a.astype(np.float64) @ (b.T if trans_b else b).astype(np.float64)
    np.testing.assert_allclose(c, expected, rtol=1e-5, atol=1e-4)


def test_anchor_with_epilogue_per_row_block_matches_numpy(arts: list[Artifact]) -> None:
    rng = np.random.default_rng(7)
    M, N, K = 100, 48, 80  # M not a multiple of the block: the tail block is exercised
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    c = np.empty((M, N), np.float32)
    arts[1].load().gemm_bias_relu(_ptr(a), _ptr(b), _ptr(bias), _ptr(c), M, N, K)
    expected = np.maximum(a.astype(np.float64) @ b.astype(np.float64) + bias, 0)
    np.testing.assert_allclose(c, expected, rtol=1e-5, atol=1e-4)


def test_flags_make_the_kernel_self_contained() -> None:
    info = blas.blas_info()
    assert (info.include_dir / "cblas.h").is_file() and info.library_file.is_file()
    assert f"-Wl,-rpath,{info.lib_dir}" in blas.link_flags()
    assert "scipy_cblas_sgemm" in blas.BLAS_PREAMBLE


def test_kernel_loads_in_a_fresh_process_without_library_path(arts: list[Artifact]) -> None:
    # The rpath alone must let the dynamic loader find libscipy_openblas: nothing imported first.
    code = (
        "import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); "
        "print(ctypes.cast(lib.gemm, ctypes.c_void_p).value is not None)"
    )
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    out = subprocess.run(
        [sys.executable, "-c", code, str(arts[0].path)], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.strip() == "True"


def test_blas_defaults_to_one_thread_whatever_openblas_env_says(tmp_path: Path) -> None:
    code = "from graph_autofusion.backend.cpu import blas; print(blas.get_blas_threads())"
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "2"}
    env.pop("AUTOFUSION_BLAS_THREADS", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "1"


def test_set_blas_threads_round_trips() -> None:
    before = blas.get_blas_threads()
    try:
        blas.set_blas_threads(2)
        assert blas.get_blas_threads() == 2
        blas.set_blas_threads(1)
        assert blas.get_blas_threads() == 1
    finally:
        blas.set_blas_threads(before)
    with pytest.raises(ValueError):
        blas.set_blas_threads(0)
    assert "OpenBLAS" in blas.blas_config()
