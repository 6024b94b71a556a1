"""Block sizes and grids of Triton launches, from the target's hardware profile.

CUDA: a pointwise block of 1024 lanes (4 warps of 32 threads, 8 elements each), rows walked in
chunks of up to 1024, one program per block. Ascend (triton-ascend): the grid is at most the AI
core count, each program looping over its share of blocks, and a block's *working set* — every
block-sized value the function holds (`Launch.lane_bytes` per lane) — must fit the Unified
Buffer; the block is the largest power of two that does. A launch that cannot fit even a minimal
block is refused (`Unsupported`), and its kernel runs on the host with that reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...hardware import HardwareProfile
from ...lower.values import Unsupported
from .render import Launch

CUDA_BLOCK = 1024
CUDA_ROW_BLOCK = 1024
ASCEND_MAX_BLOCK = 8192
MIN_BLOCK = 16  # below this a block is too small to be worth a lane mask (and the cube tile is 16)


@dataclass(frozen=True)
class LaunchConfig:
    """How one launch runs: its grid, the blocks it covers, and its compile-time block sizes."""

    grid: int
    nblocks: int
    meta: dict[str, int]  # constexpr parameters (BLOCK, RBLOCK, ...)
    options: dict[str, int] = field(default_factory=dict)  # launch options (num_warps on CUDA)
    working_set: int = 0  # bytes one block holds on chip (lane_bytes x lanes)


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (max(n, 1) - 1).bit_length())


def _pow2_at_most(n: int) -> int:
    return 1 << max(0, n.bit_length() - 1)


def is_ascend(profile: HardwareProfile) -> bool:
    return profile.unified_buffer_bytes > 0


def _fit(limit: int, want: int, lane_bytes: int, profile: HardwareProfile, what: str) -> int:
    """The block: at most `limit` and the work `want`, within the UB budget on Ascend."""
    block = min(limit, _pow2_at_least(want))
    if is_ascend(profile) and lane_bytes:
        block = min(block, _pow2_at_most(profile.unified_buffer_bytes // lane_bytes))
        if block < min(MIN_BLOCK, _pow2_at_least(want)):
            raise Unsupported(
                f"{what}: {lane_bytes} bytes per lane leave no block of {MIN_BLOCK} lanes within the "
                f"{profile.unified_buffer_bytes // 1024} KB Unified Buffer"
            )
    return max(block, 1)


def configure(launch: Launch, profile: HardwareProfile, block: int | None = None) -> LaunchConfig:
    """Grid and block sizes of `launch` on `profile` (`block` overrides the chosen block, as the
    autotuner does; it is still held to the UB budget)."""
    ascend = is_ascend(profile)
    meta: dict[str, int] = {}
    lanes = 1
    if launch.kind == "gemm":
        return _configure_gemm(launch, profile, block)
    if launch.kind == "attention":
        return _configure_attention(launch, profile, block)
    if launch.kind == "flat":
        limit = ASCEND_MAX_BLOCK if ascend else CUDA_BLOCK
        meta["BLOCK"] = _fit(block or limit, launch.extent, launch.lane_bytes, profile, launch.function)
        lanes = meta["BLOCK"]
        nblocks = -(-launch.extent // meta["BLOCK"])
    else:
        meta["BLOCK"] = 1
        nblocks = launch.extent if launch.kind == "row" else 1
        if launch.row_blocks:
            limit = ASCEND_MAX_BLOCK if ascend else CUDA_ROW_BLOCK
            meta["RBLOCK"] = _fit(
                block or limit, launch.row_length, launch.lane_bytes, profile, launch.function
            )
            lanes = meta["RBLOCK"]
    grid = min(nblocks, profile.cores) if ascend else nblocks
    options = {"num_warps": profile.num_warps} if profile.num_warps else {}
    return LaunchConfig(max(grid, 1), max(nblocks, 1), meta, options, launch.lane_bytes * lanes)


def _clamp_pow2(n: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, _pow2_at_least(n)))


def _configure_gemm(launch: Launch, profile: HardwareProfile, block: int | None) -> LaunchConfig:
    """BM x BN x BK tiles: CUDA up to 64 x 64 x 32; Ascend multiples of the cube tile, shrunk until
    the working set (operand tiles, accumulator, epilogue values) fits the Unified Buffer."""
    batch, m, n, k = launch.tile
    ascend = is_ascend(profile)
    cube = (profile.cube_tile or (16, 16))[0]
    top = block or 64
    bm, bn = _clamp_pow2(m, 16, top), _clamp_pow2(n, 16, top)
    bk = _clamp_pow2(k, 16, 64 if ascend else 32)
    bm, bn, bk = (max(cube, x) for x in (bm, bn, bk)) if ascend else (bm, bn, bk)

    def working_set(bm: int, bn: int, bk: int) -> int:
        return 4 * (bm * bk + bk * bn + bm * bn) + launch.lane_bytes * max(bm * bk, bk * bn, bm * bn)

    if ascend:
        while working_set(bm, bn, bk) > profile.unified_buffer_bytes:
            largest = max(bm, bn, bk)
            if largest <= cube:
                raise Unsupported(
                    f"{launch.function}: no {cube}x{cube} tile fits the "
                    f"{profile.unified_buffer_bytes // 1024} KB Unified Buffer"
                )
            if bk == largest:
                bk //= 2
            elif bn == largest:
                bn //= 2
            else:
                bm //= 2
    nblocks = batch * -(-m // bm) * -(-n // bn)
    grid = min(nblocks, profile.cores) if ascend else nblocks
    options = {"num_warps": profile.num_warps} if profile.num_warps else {}
    meta = {"BLOCK": 1, "BM": bm, "BN": bn, "BK": bk}
    return LaunchConfig(max(grid, 1), max(nblocks, 1), meta, options, working_set(bm, bn, bk))


def _configure_attention(launch: Launch, profile: HardwareProfile, block: int | None) -> LaunchConfig:
    """BM query rows x BN keys per step: CUDA 64 x 64 from compute capability 8 on (more shared
    memory and registers per SM), 32 x 32 before; Ascend multiples of the cube tile, halved until
    the working set (Q block, K and V blocks, the scores, the accumulator) fits the Unified Buffer."""
    heads, sq, sk, bd, bdv = launch.tile
    ascend = is_ascend(profile)
    cube = (profile.cube_tile or (16, 16))[0]
    cc = profile.compute_capability or (8, 0)
    top = block or (64 if ascend or cc >= (8, 0) else 32)
    bm, bn = _clamp_pow2(sq, 16, top), _clamp_pow2(sk, 16, top)
    if ascend:
        bm, bn = max(cube, bm), max(cube, bn)

    def working_set(bm: int, bn: int) -> int:
        return 4 * (bm * bd + bn * bd + bn * bdv + bm * bdv + 2 * bm) + launch.lane_bytes * bm * bn

    if ascend:
        while working_set(bm, bn) > profile.unified_buffer_bytes:
            if max(bm, bn) <= cube:
                raise Unsupported(
                    f"{launch.function}: no {cube}x{cube} attention block fits the "
                    f"{profile.unified_buffer_bytes // 1024} KB Unified Buffer"
                )
            if bn >= bm:
                bn //= 2
            else:
                bm //= 2
    nblocks = heads * -(-sq // bm)
    grid = min(nblocks, profile.cores) if ascend else nblocks
    options = {"num_warps": profile.num_warps} if profile.num_warps else {}
    meta = {"BLOCK": 1, "BM": bm, "BN": bn}
    return LaunchConfig(max(grid, 1), max(nblocks, 1), meta, options, working_set(bm, bn))


def check_ascend(config: LaunchConfig, profile: HardwareProfile) -> list[str]:
    """What a launch breaks of the Ascend constraints (empty when it keeps them)."""
    problems = []
    if config.grid > profile.cores:
        problems.append(f"grid {config.grid} exceeds the {profile.cores} AI cores")
    if config.working_set > profile.unified_buffer_bytes:
        ub = profile.unified_buffer_bytes
        problems.append(f"block working set {config.working_set} B exceeds the {ub} B Unified Buffer")
    if "num_warps" in config.options:
        problems.append("num_warps has no meaning on Ascend")
    return problems
