"""Which instruction-set level kernels are compiled for.

Kernels are built for a *named* level (x86-64-v2/v3/v4) rather than `-march=native`: an artifact
built on one worker must run on its peers, and the level is part of the cache key so a v2 and a v3
build of the same source never collide. The default is the best level the host supports, capped at
v3 (AVX2+FMA), because AVX-512 hosts are the exception in a worker pool and v4 rarely pays off for
memory-bound fused kernels. `AUTOFUSION_ISA` overrides the choice (`v1`..`v4`, `x86-64-vN`,
`generic`).

Non-x86 hosts get no ISA flags at all (the compiler's baseline for the target), never
`-mcpu=native`, for the same portability reason.
"""

from __future__ import annotations

import logging
import os
import platform
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from graph_autofusion.errors import InvalidConfigError

log = logging.getLogger(__name__)

ISA_ENV = "AUTOFUSION_ISA"
DEFAULT_CAP = 3  # x86-64-v3: AVX2 + FMA

# /proc/cpuinfo flag names that each level adds (psABI x86-64 microarchitecture levels).
_LEVEL_FLAGS: dict[int, frozenset[str]] = {
    2: frozenset({"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"}),
    3: frozenset({"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}),
    4: frozenset({"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}),
}

# Explicit -m flags per level, for compilers too old to know `-march=x86-64-vN` (gcc < 11,
# clang < 12). Cumulative: level N also takes the flags of every level below it.
_LEVEL_MFLAGS: dict[int, tuple[str, ...]] = {
    2: ("-mcx16", "-msahf", "-mpopcnt", "-msse3", "-msse4.1", "-msse4.2", "-mssse3"),
    3: ("-mavx", "-mavx2", "-mbmi", "-mbmi2", "-mf16c", "-mfma", "-mlzcnt", "-mmovbe", "-mxsave"),
    4: ("-mavx512f", "-mavx512bw", "-mavx512cd", "-mavx512dq", "-mavx512vl"),
}

_X86_MACHINES = frozenset({"x86_64", "amd64", "x64"})


@dataclass(frozen=True)
class IsaTarget:
    """The instruction set kernels are compiled for.

    `name` is what goes into the cache key and reports (`x86-64-v3`, `generic-aarch64`);
    `level` is the x86-64 level number (0 on other architectures).
    """

    arch: str
    level: int
    name: str

    def march_flags(self) -> list[str]:
        """The `-march` flags naming this level (the modern spelling)."""
        if self.arch != "x86_64":
            return []
        return ["-march=x86-64"] if self.level <= 1 else [f"-march=x86-64-v{self.level}"]

    def explicit_flags(self) -> list[str]:
        """The same level spelled as individual `-m` flags, for older compilers."""
        if self.arch != "x86_64":
            return []
        flags = ["-march=x86-64"]
        for level in range(2, self.level + 1):
            flags.extend(_LEVEL_MFLAGS[level])
        return flags


def machine() -> str:
    """The host architecture, normalised (`x86_64`, `aarch64`, ...)."""
    name = platform.machine().lower()
    return "x86_64" if name in _X86_MACHINES else name


def level_from_flags(flags: set[str] | frozenset[str]) -> int:
    """The highest x86-64 level whose flags (and all lower levels' flags) are all present."""
    level = 1
    for candidate in (2, 3, 4):
        if not _LEVEL_FLAGS[candidate] <= flags:
            break
        level = candidate
    return level


def _cpuinfo_flags(path: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


@lru_cache(maxsize=1)
def host_level() -> int:
    """The x86-64 level of this host from /proc/cpuinfo (0 off x86, 1 when flags are unreadable)."""
    if machine() != "x86_64":
        return 0
    return level_from_flags(_cpuinfo_flags())


def parse_level(text: str) -> int:
    """`v3`, `x86-64-v3`, `3`, `x86-64`, `v1`, `generic` → a level number; anything else is an error."""
    value = text.strip().lower()
    if value in {"generic", "baseline", "x86-64", "x86_64", "v1", "1"}:
        return 1
    for prefix in ("x86-64-v", "x86_64_v", "v", ""):
        if value.startswith(prefix) and value[len(prefix) :] in {"2", "3", "4"}:
            return int(value[len(prefix) :])
    raise InvalidConfigError(
        f"{ISA_ENV}={text!r} is not an ISA level; use one of v1, v2, v3, v4 (or x86-64-vN, generic).",
        code="invalid_isa",
        value=text,
    )


def target_isa(requested: str | None = None) -> IsaTarget:
    """The ISA kernels are built for: `requested`, else `$AUTOFUSION_ISA`, else min(host, v3).

    A requested level above the host's is honoured (a build host may prepare artifacts for
    stronger peers) but logged, because such kernels cannot run here.
    """
    arch = machine()
    if arch != "x86_64":
        return IsaTarget(arch=arch, level=0, name=f"generic-{arch}")
    requested = requested if requested is not None else os.environ.get(ISA_ENV) or None
    host = host_level()
    if requested is None:
        level = min(host, DEFAULT_CAP)
    else:
        level = parse_level(requested)
        if level > host:
            log.warning(
                "building kernels for x86-64-v%d on a x86-64-v%d host: they cannot run here", level, host
            )
    name = "x86-64" if level <= 1 else f"x86-64-v{level}"
    return IsaTarget(arch=arch, level=level, name=name)
