"""The contraction library: register-blocked fp32 GEMM tiles with one operand packed once.

Why it exists (measured 2026-12-03 on the 2-vCPU AMD EPYC Zen 4 host, x86-64-v4+avx512bf16+
avx512vnni; `benchmarks/contraction.py`): OpenBLAS 0.3.34 (scipy-openblas32, DYNAMIC_ARCH) picks
its SkylakeX (AVX-512) core here, and one-thread `cblas_sgemm` on whole ResNet-50 / BERT shapes
runs at 65-89 GFLOP/s. Called per output tile from inside our OpenMP loop it packs both
operands on every call, weights included, so the anchors pay a weight re-pack per tile and
narrow tiles (7x7 and 14x14 convs) lose most to it. This library keeps the weights packed once
(at load, by the runtime) in the micro-kernel's panel layout and packs only the activation per
tile, into a per-thread buffer that stays in L2.

What it holds (fixed C sources next to this module, compiled with each kernel's own -march, so
the ISA is part of the cache key like every other kernel):

* `afc.h`: the ABI (documented there): packed layouts, `afc_pack_a/_b`, `afc_gemm_ap` (A packed,
  conv weights `[Cout, Cin*kh*kw]`) and `afc_gemm_bp` (B packed, MatMul/Gemm weights).
* `afc.c`: micro-kernels (AVX-512 8x32 with 16 zmm accumulators, AVX2+FMA 6x16, portable 4x16),
  the packing routines and the single-threaded tile drivers with K blocking (KC=256).

Why compiled into each unit (the text sits atop every kernel that uses it, behind an include
guard, so a combined unit of many such kernels compiles it once) rather than as one shared
object that kernels link against: a kernel then has no load-order, rpath or cache-eviction
dependency on another file, a bundle stays self-contained, and the functions are `static`, so
units never clash. The price is ~0.3 s of compile per cold unit.

`AUTOFUSION_CONTRACTION=blas|library` chooses how anchors with a constant weight operand
contract; the default is `library` (see `DEFAULT_MODE` for the measurement behind it). Operands
that are not constants (attention's Q x K^T) keep OpenBLAS.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

CONTRACTION_ENV = "AUTOFUSION_CONTRACTION"
MODES = ("blas", "library")
# Measured on the Zen 4 host (benchmarks/runtime_speed.py, 2 threads): see the module docstring.
DEFAULT_MODE = "library"

# Column tiles of a multiple of this many columns are whole B panels on every ISA (AFC_NR is 32
# or 16), so generators round the tiles they hand the library to it without knowing the ISA.
PANEL_QUANTUM = 32

_HERE = Path(__file__).parent


def contraction_mode() -> str:
    """`$AUTOFUSION_CONTRACTION` (`blas` or `library`), else `DEFAULT_MODE`."""
    raw = (os.environ.get(CONTRACTION_ENV) or DEFAULT_MODE).strip().lower()
    if raw not in MODES:
        from ....errors import InvalidConfigError

        raise InvalidConfigError(
            f"{CONTRACTION_ENV}={raw!r} is not one of {', '.join(MODES)}",
            code="invalid_contraction",
            value=raw,
        )
    return raw


@lru_cache(maxsize=1)
def library_source() -> str:
    """The library as C text (header, then implementation): a prelude for kernels that use it."""
    header = (_HERE / "afc.h").read_text(encoding="utf-8")
    body = (_HERE / "afc.c").read_text(encoding="utf-8")
    return f"{header}\n{body}"


def a_panels_floats(m: int, k: int) -> str:
    """C constant expression: floats of the A-panels of an m x k operand (afc_packed_a_floats).

    An expression, not a number: the panel height `AFC_MR` is the ISA's, which only the C
    compiler building the kernel knows, so generated code never depends on Python agreeing with
    the -march a kernel is finally built for (a bundle recompiled for another host included)."""
    return f"((({m}L) + AFC_MR - 1) / AFC_MR * AFC_MR * {max(k, 1)}L)"


def b_panels_floats(k: int, n: int) -> str:
    """C constant expression: floats of the B-panels of a k x n operand (afc_packed_b_floats)."""
    return f"((({n}L) + AFC_NR - 1) / AFC_NR * AFC_NR * {max(k, 1)}L)"
