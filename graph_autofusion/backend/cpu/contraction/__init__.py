"""The contraction library: register-blocked fp32 GEMM tiles with one operand packed once.

What was measured first (2026-12-03, the 2-vCPU AMD EPYC Zen 4 host, x86-64-v4+avx512bf16+
avx512vnni, gcc 12; the host was shared and loaded 5-8, so wall-clock figures drift by 2x and the
decisions below rest on process CPU time with one thread, which preemption cannot inflate):

* OpenBLAS 0.3.34 (scipy-openblas32, DYNAMIC_ARCH) picks its SkylakeX (AVX-512) core here, not
  an AVX2 one. One-thread `cblas_sgemm` on whole ResNet-50 / BERT shapes runs at 65-95 GFLOP/s
  against a 115-118 GFLOP/s single-core FMA peak (1 zmm FMA per cycle at ~3.7 GHz).
* Called per output tile from the anchors' OpenMP loop it re-packs the weights on every call;
  the anchors reached 77 GFLOP/s (ResNet-50) and 83 (BERT-base) over their whole time.

What the library does about it: the weights are packed once, at load, by the runtime, into the
micro-kernel's panel layout; only the activation is packed per tile, into a per-thread buffer
that stays in L2; pixel tiles are whole panels. Measured the same way (`benchmarks/contraction.py
--models resnet50,mobilenet_v2,bert_base` and `--threads 1 --cpu-time`), library vs OpenBLAS:
ResNet-50 97.4 vs 107.5 ms (-9.4%; anchors at 84 vs 76 GFLOP/s), MobileNetV2 11.2 vs 12.2 ms
(-8.2%), BERT-base 243.3 vs 280.9 ms (-13.4%; anchors at 93 vs 81 GFLOP/s); per zoo shape
1.06-1.18x on 14 of 16, 1.00x on the 7x7 3x3 conv and 0.98x on MobileNetV2's last 1x1 (N = 49
pixels fills 49 of 64 vector lanes). The micro-kernel alone runs at the FMA peak (118 GFLOP/s,
any of 8x32 / 12x32 / 14x32 / 8x48 / ymm 6x16) from L1/L2;
what is left is im2col, the per-tile activation packing and lane waste at narrow tiles.

Operands that are not constants (attention's Q x K^T and P x V) do not fit `afc_gemm_*`: packing
both per call measured 0.78-0.94x OpenBLAS on the 128x128x64 and 128x64x128 head shapes. The
attention kernel has its own tiles instead (`afa.c`): K^T and V packed once per head and reused
by every query row block, the other operand read in place by a micro-kernel that broadcasts its
rows' elements, so nothing is packed per call (~100 GFLOP/s per core at BERT's and ViT's head
shapes, against 65-95 for one-thread sgemm).

What it holds (fixed C sources next to this module, compiled with each kernel's own -march, so
the ISA is part of the cache key like every other kernel):

* `afc.h`: the ABI (documented there): packed layouts, `afc_pack_a/_b`, `afc_gemm_ap` (A packed,
  conv weights `[Cout, Cin*kh*kw]`), `afc_gemm_bp` (B packed, MatMul/Gemm weights) and
  `afc_conv_ap` (A packed, B a stride-1 conv's implicit im2col read from its zero-padded input
  band: the micro-kernel's B rows at a per-depth offset, no copy of the activation but the band),
  `afc_conv_bp` (B the packed W^T, the pixels as rows: up to CONV_BP_INPLACE_CHANNELS output
  channels the micro-kernel broadcasts each pixel's taps from the band in place) and
  `afc_store_t` / `afc_store_t_post` (such a tile stored transposed into NCHW, the latter with
  the post-ops below applied on the way); `afc_gemm_bp_in` / `afc_gemm_ap_in`
  keep a thread's packing of an operand that is a kernel input for the call's later tiles or row
  chunks (a 1x1 conv's tile runs in chunks of 24 output channels against its pixels packed once,
  each chunk finished by the epilogue while in L1), and `afc_gemm_ap_post` applies a conv's
  common epilogue (bias, residual, Relu/Clip) to each tile's accumulators before their store
  (AVX-512, AVX2; right after it in the portable build); `afc_dw3x3` / `afc_dw3x3_s2`,
  depthwise 3x3s of stride 1 and 2, each padded input row read once and its column shifts kept
  in registers (all of MobileNetV2's depthwise convs); `afc_wino3x3_pack` / `afc_wino3x3`, a
  stride-1 3x3 conv as Winograd F(2x2, 3x3) (the weight's 16 transforms as B-panels, then per
  band of tile rows the input transform, 16 products and the output transform).
* `afc.c`: micro-kernels (AVX-512 8x32 with 16 zmm accumulators, AVX2+FMA 6x16, portable 4x16),
  the packing routines and the single-threaded tile drivers with K blocking (at most KC=256,
  split evenly), the Goto loop order and a software prefetch of the next weight panel (afc.h);
  up to AFC_GEMV_ROWS rows (7 on AVX-512: a batch-1..7 Gemm/MatMul) `afc_gemm_bp` takes a GEMV
  path instead, each packed weight panel streamed once against register accumulators
  (0.33-0.47x the panel path's time at one row, afc.h).
* `afa.c`: the attention tiles (afa.c documents them), the prelude of the CPU attention kernel.
* `afv.h`: vector helpers both preludes start with (the 8 x 8 register transpose of the packing).
* `shim.py`: the library with exported entry points for ctypes (tests, benchmarks, FMA peak, and
  the OpenMP wake-up probe behind backend/cpu/threads.py PASSIVE_WAKE_NS).

Why compiled into each unit (the text sits atop every kernel that uses it, behind an include
guard, so a combined unit of many such kernels compiles it once) rather than as one shared
object that kernels link against: a kernel then has no load-order, rpath or cache-eviction
dependency on another file, a bundle stays self-contained, and the functions are `static`, so
units never clash. The price is ~0.3 s of compile per cold unit. Generated code never uses the
ISA's panel sizes as Python numbers (sizes are C expressions of `AFC_MR`/`AFC_NR`), so a bundle
recompiled for another ISA stays consistent.

`AUTOFUSION_CONTRACTION=blas|library` chooses how anchors with a constant weight operand
contract; the default is `library`, the faster of the two on this host by the figures above.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

CONTRACTION_ENV = "AUTOFUSION_CONTRACTION"
MODES = ("blas", "library")
# The faster mode on the Zen 4 AVX-512 host (module docstring). For AVX2 hosts the closest
# measurement we have is this host with AUTOFUSION_ISA=v3 against OpenBLAS forced to its Haswell
# core (OPENBLAS_CORETYPE=Zen): a tie (ResNet-50 104.1 vs 102.6 ms, BERT-base 267.1 vs 265.2 ms
# CPU time, within the run-to-run noise), so one default serves both.
DEFAULT_MODE = "library"

# Column tiles of a multiple of this many columns are whole B panels on every ISA (AFC_NR is 32
# or 16), so generators round the tiles they hand the library to it without knowing the ISA.
PANEL_QUANTUM = 32

# afc.h's AFC_CONV_BP_INPLACE_N: up to this many output channels afc_conv_bp reads a conv's taps
# from its band in place (no A-panel copy), which lower/conv.py's band rows are chosen around.
CONV_BP_INPLACE_CHANNELS = 128

# Version of the packed-weight buffers a bundle stores (bundle.py): raw native-endian floats as
# `<kernel>_prepack` writes them, in the panel layouts of afc.h for the bundle's ISA. Kernels
# carry the layout in their code (their digest changes with afc.h); this number changes when
# what a stored buffer means does, so a bundle of another version packs afresh at load.
PACKED_LAYOUT_VERSION = 1

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
    helpers = (_HERE / "afv.h").read_text(encoding="utf-8")
    header = (_HERE / "afc.h").read_text(encoding="utf-8")
    body = (_HERE / "afc.c").read_text(encoding="utf-8")
    return f"{helpers}\n{header}\n{body}"


@lru_cache(maxsize=1)
def attention_source() -> str:
    """The attention tiles (afa.c: K^T and V packed per head, Q K^T and P V products) as C text,
    a prelude for the CPU attention kernel (lower/attention.py)."""
    helpers = (_HERE / "afv.h").read_text(encoding="utf-8")
    return f"{helpers}\n" + (_HERE / "afa.c").read_text(encoding="utf-8")
