"""The BLAS that anchor kernels call: OpenBLAS from the `scipy-openblas32` wheel.

Why this one: `pip` installs it (no system package, so the two set-up commands stay the whole
set-up), it ships headers and a shared library, and its symbols carry a `scipy_` prefix
(`scipy_cblas_sgemm`), so it never clashes with the OpenBLAS that numpy bundles (which uses
`scipy_..._64_` names and 64-bit integers) or with a system BLAS. Integers are 32-bit (`blasint`
is `int`).

Generated code includes `BLAS_PREAMBLE` and calls `AF_SGEMM(AfRowMajor, AfNoTrans, ...)` instead
of naming the vendor symbol, so switching BLAS later touches only this module. A kernel with
`uses_blas=True` is compiled with `compile_flags()` and linked with `link_flags()`; the link
flags embed an rpath, so the shared object finds the library when loaded without
`LD_LIBRARY_PATH`.

Threads: kernels run their own OpenMP loop and call BLAS from inside it, so BLAS must run
single-threaded there or the two pools oversubscribe the cores. `load_blas()` therefore sets
OpenBLAS to one thread the first time it loads it (override with `AUTOFUSION_BLAS_THREADS`);
OpenBLAS's thread count is process-wide, so callers that want a multi-threaded sgemm (a benchmark
baseline) set it and restore it themselves.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from graph_autofusion.errors import CompilationError

BLAS_THREADS_ENV = "AUTOFUSION_BLAS_THREADS"


@dataclass(frozen=True)
class BlasInfo:
    """Where the BLAS lives and how its symbols are named."""

    include_dir: Path
    lib_dir: Path
    library: str  # link name, for `-l`
    library_file: Path  # the shared object itself
    symbol_prefix: str  # "scipy_": scipy_cblas_sgemm, scipy_openblas_set_num_threads
    version: str


@lru_cache(maxsize=1)
def blas_info() -> BlasInfo:
    """Locate the `scipy-openblas32` headers and library (raises a clear error if absent)."""
    try:
        import scipy_openblas32
    except ImportError as exc:  # pragma: no cover - it is a hard dependency
        raise CompilationError(
            "BLAS kernels need the 'scipy-openblas32' package; install the project's dependencies.",
            code="blas_not_found",
        ) from exc
    lib_dir = Path(scipy_openblas32.get_lib_dir())
    return BlasInfo(
        include_dir=Path(scipy_openblas32.get_include_dir()),
        lib_dir=lib_dir,
        library=scipy_openblas32.get_library(),
        library_file=lib_dir / scipy_openblas32.get_library(fullname=True),
        symbol_prefix="scipy_",
        version=str(getattr(scipy_openblas32, "__version__", "unknown")),
    )


def compile_flags() -> list[str]:
    """Preprocessor flags for a translation unit that includes `BLAS_PREAMBLE`."""
    return [f"-I{blas_info().include_dir}"]


def link_flags() -> list[str]:
    """Linker flags: the library plus an rpath so `dlopen` finds it without LD_LIBRARY_PATH."""
    info = blas_info()
    return [f"-L{info.lib_dir}", f"-l{info.library}", f"-Wl,-rpath,{info.lib_dir}"]


# The vendor header already declares the prefixed names; the AF_* aliases are what generated
# code uses, so a different BLAS only changes this block.
BLAS_PREAMBLE = """\
/* BLAS: OpenBLAS from scipy-openblas32 (prefixed symbols, 32-bit integers). */
#include <cblas.h>
#define AfRowMajor CblasRowMajor
#define AfColMajor CblasColMajor
#define AfNoTrans CblasNoTrans
#define AfTrans CblasTrans
/* AF_SGEMM(order, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) */
#define AF_SGEMM scipy_cblas_sgemm
/* AF_SGEMV(order, trans, M, N, alpha, A, lda, x, incx, beta, y, incy) */
#define AF_SGEMV scipy_cblas_sgemv
#define AF_SDOT scipy_cblas_sdot
typedef blasint af_blasint;
#ifndef AF_SGEMM_TILE
#define AF_SGEMM_TILE
#include <stdint.h>
/* c = alpha * op(a) @ op(b) on row-major tiles, beta 0: the contraction routine kernel-IR anchor
 * kernels call (lower/anchor.py `contraction`), with plain integer transposes and sizes. */
static inline void af_sgemm_tile(int64_t trans_a, int64_t trans_b, int64_t m, int64_t n, int64_t k,
                                 float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                                 float *c, int64_t ldc) {
  AF_SGEMM(AfRowMajor, trans_a ? AfTrans : AfNoTrans, trans_b ? AfTrans : AfNoTrans, (af_blasint)m,
           (af_blasint)n, (af_blasint)k, alpha, a, (af_blasint)lda, b, (af_blasint)ldb, 0.0f, c,
           (af_blasint)ldc);
}
#endif
"""


@lru_cache(maxsize=1)
def load_blas() -> ctypes.CDLL:
    """Load the BLAS into this process (globally) and set its thread count to the kernel default.

    Loading it with RTLD_GLOBAL before any kernel means every kernel binds to this one instance,
    so the thread setting below is the one they see.
    """
    lib = ctypes.CDLL(str(blas_info().library_file), mode=ctypes.RTLD_GLOBAL)
    lib.scipy_openblas_set_num_threads.argtypes = [ctypes.c_int]
    lib.scipy_openblas_set_num_threads.restype = None
    lib.scipy_openblas_get_num_threads.argtypes = []
    lib.scipy_openblas_get_num_threads.restype = ctypes.c_int
    lib.scipy_openblas_get_config.argtypes = []
    lib.scipy_openblas_get_config.restype = ctypes.c_char_p
    lib.scipy_openblas_set_num_threads(_default_threads())
    return lib


def _default_threads() -> int:
    raw = os.environ.get(BLAS_THREADS_ENV, "1")
    try:
        return max(1, int(raw))
    except ValueError:
        return 1


def set_blas_threads(n: int) -> None:
    """Set OpenBLAS's (process-wide) thread count. Kernels expect 1; see the module docstring."""
    if n < 1:
        raise ValueError(f"thread count must be >= 1, got {n}")
    load_blas().scipy_openblas_set_num_threads(n)


def get_blas_threads() -> int:
    """OpenBLAS's current thread count."""
    return int(load_blas().scipy_openblas_get_num_threads())


def blas_config() -> str:
    """OpenBLAS's build description (version, kernel it picked for this CPU, thread limits)."""
    return load_blas().scipy_openblas_get_config().decode("utf-8", errors="replace").strip()
