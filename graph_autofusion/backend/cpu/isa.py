"""Which instruction set kernels are compiled for, and whether this host can run a given one.

Why the host's own ISA by default: fused kernels earn their keep by streaming memory at full
width and by running contractions near peak, and the peers we are measured against (onnxruntime's
MLAS, OpenVINO's oneDNN) dispatch at run time to the widest vectors the host has. Capping kernels
at x86-64-v3 (AVX2+FMA) on an AVX-512 host halves the vector width of every loop gcc vectorizes
(gcc 12 uses 512-bit registers for `-march=x86-64-v4`) and of every libmvec call (expf, tanhf,
erff, ... have 16-lane AVX-512 variants). Our machines change from day to day between AMD EPYC
hosts with AVX2 only and Intel Ice Lake / AMD EPYC hosts with AVX-512, so the level is detected,
not assumed.

Why a *named* ISA rather than `-march=native`: the name (`x86-64-v4+avx512bf16+avx512vnni`,
`x86-64-v3`, `aarch64+sve`) is part of every kernel's cache key and of a bundle's manifest, so two
builds for different ISAs never collide and a loader can tell, before mapping anything, whether
this host can run a bundle. `-march=native` would also tune for the build host's
micro-architecture, a property no name captures and no peer could check.

What is detected (from /proc/cpuinfo, where Linux lists the CPU's flags and hwcaps):

- x86-64: the psABI level (v2: SSE4.2/POPCNT, v3: AVX2+FMA+BMI, v4: AVX-512 F/BW/CD/DQ/VL), plus
  the AVX-512 extensions that change what gcc can emit for our kernels: VNNI (int8/int16 dot
  products, `vpdpbusd`) and BF16 (`vcvtneps2bf16`, `vdpbf16ps`). They only count on a v4 host.
- aarch64: NEON (Advanced SIMD) is the baseline of the architecture, so `aarch64` alone means
  NEON; SVE, SVE2, dot product, fp16 and bf16 arithmetic and int8 matrix multiply are extensions
  (`-march=armv8-a+sve+...`).
- other architectures: no flags at all (the compiler's baseline for the target).

A finer name splits the kernel cache and the bundles of a worker pool: a bundle built on a host
with BF16 does not run (it recompiles, see bundle.py) on an AVX-512 host without it. A pool of
mixed AVX-512 hosts that wants one artifact for all sets `AUTOFUSION_ISA=v4` (no extensions).

`AUTOFUSION_ISA` overrides the default: `host` (the default, spelled out), `v1`..`v4` or
`x86-64-vN` or `generic`, each optionally followed by `+extension` (`v4+avx512vnni`); on aarch64
`aarch64` or `generic`, optionally with extensions (`aarch64+sve+dotprod`). A level above the
host's is honoured (a build host may prepare bundles for stronger peers) but such kernels cannot
run here: the runtime refuses to call them (`isa_mismatch`) rather than dying of SIGILL.
"""

from __future__ import annotations

import logging
import os
import platform
from collections.abc import Collection
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from graph_autofusion.errors import InvalidConfigError

log = logging.getLogger(__name__)

ISA_ENV = "AUTOFUSION_ISA"
CPUINFO = Path("/proc/cpuinfo")

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


@dataclass(frozen=True)
class _Extension:
    cpuinfo: str  # the flag /proc/cpuinfo shows
    flag: str  # the compiler flag (x86) or -march modifier (aarch64)
    level: int = 0  # the x86-64 level it needs (its instructions use EVEX encodings)


# Extension name (as it appears in an ISA name) → how to detect and enable it.
_EXTENSIONS: dict[str, dict[str, _Extension]] = {
    "x86_64": {
        "avx512vnni": _Extension("avx512_vnni", "-mavx512vnni", 4),
        "avx512bf16": _Extension("avx512_bf16", "-mavx512bf16", 4),
    },
    "aarch64": {
        "sve": _Extension("sve", "+sve"),
        "sve2": _Extension("sve2", "+sve2"),
        "dotprod": _Extension("asimddp", "+dotprod"),
        "fp16": _Extension("asimdhp", "+fp16"),
        "bf16": _Extension("bf16", "+bf16"),
        "i8mm": _Extension("i8mm", "+i8mm"),
    },
}

_X86_MACHINES = frozenset({"x86_64", "amd64", "x64"})
_ARM64_MACHINES = frozenset({"aarch64", "arm64"})


@dataclass(frozen=True)
class IsaTarget:
    """The instruction set kernels are compiled for (or that a host offers).

    `level` is the x86-64 level (1-4; 0 on other architectures), `extensions` the sorted
    extension names on top of it. `name` is what goes into cache keys, manifests and reports.
    """

    arch: str
    level: int
    extensions: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        if self.arch == "x86_64":
            base = "x86-64" if self.level <= 1 else f"x86-64-v{self.level}"
        else:
            base = self.arch
        return "+".join([base, *self.extensions])

    def __str__(self) -> str:
        return self.name

    def march_flags(self) -> list[str]:
        """The compiler flags naming this ISA (the modern `-march=x86-64-vN` spelling on x86)."""
        if self.arch == "x86_64":
            base = ["-march=x86-64"] if self.level <= 1 else [f"-march=x86-64-v{self.level}"]
            return base + self._extension_flags()
        if self.arch == "aarch64":
            return ["-march=armv8-a" + "".join(self._extension_flags())]
        return []

    def explicit_flags(self) -> list[str]:
        """The same ISA spelled as individual `-m` flags, for compilers without `x86-64-vN`."""
        if self.arch != "x86_64":
            return self.march_flags()
        flags = ["-march=x86-64"]
        for level in range(2, self.level + 1):
            flags.extend(_LEVEL_MFLAGS[level])
        return flags + self._extension_flags()

    def _extension_flags(self) -> list[str]:
        table = _EXTENSIONS.get(self.arch, {})
        return [table[ext].flag for ext in self.extensions]

    def missing_on(self, host: IsaTarget) -> list[str]:
        """What `host` lacks to run code built for this ISA (empty: it runs there)."""
        if host.arch != self.arch:
            return [f"the {self.arch} architecture (the host is {host.arch})"]
        missing = []
        if host.level < self.level:
            missing.append(IsaTarget(self.arch, self.level).name)
        missing += [ext for ext in self.extensions if ext not in host.extensions]
        return missing

    def runs_on(self, host: IsaTarget) -> bool:
        """Whether code built for this ISA runs on `host` (same architecture, nothing missing)."""
        return not self.missing_on(host)


def normalise_machine(name: str) -> str:
    """An architecture name as `platform.machine()` spells it on some OS → `x86_64`, `aarch64`, ..."""
    name = name.strip().lower()
    if name in _X86_MACHINES:
        return "x86_64"
    return "aarch64" if name in _ARM64_MACHINES else name


def machine() -> str:
    """The host architecture, normalised (`x86_64`, `aarch64`, ...)."""
    return normalise_machine(platform.machine())


def level_from_flags(flags: Collection[str]) -> int:
    """The highest x86-64 level whose flags (and all lower levels' flags) are all present."""
    present = frozenset(flags)
    level = 1
    for candidate in (2, 3, 4):
        if not _LEVEL_FLAGS[candidate] <= present:
            break
        level = candidate
    return level


def isa_from_flags(arch: str, flags: Collection[str]) -> IsaTarget:
    """The ISA a CPU with these /proc/cpuinfo flags (x86 `flags`, aarch64 `Features`) offers."""
    present = frozenset(flags)
    level = level_from_flags(present) if arch == "x86_64" else 0
    extensions = tuple(
        sorted(
            name
            for name, ext in _EXTENSIONS.get(arch, {}).items()
            if ext.cpuinfo in present and level >= ext.level
        )
    )
    return IsaTarget(arch, level, extensions)


def cpuinfo_flags(path: Path = CPUINFO) -> frozenset[str]:
    """The first CPU's feature flags (`flags` on x86, `Features` on arm), empty when unreadable."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in {"flags", "Features"}:
            return frozenset(value.split())
    return frozenset()


@lru_cache(maxsize=1)
def host_isa() -> IsaTarget:
    """The ISA this host offers (x86-64 level 1 when its flags cannot be read)."""
    return isa_from_flags(machine(), cpuinfo_flags())


def parse_isa(text: str, arch: str | None = None) -> IsaTarget:
    """`AUTOFUSION_ISA`'s spellings → an `IsaTarget` for `arch` (the host's by default).

    `host`/`native` → the host's ISA; x86: `v3`, `x86-64-v3`, `3`, `x86-64`, `v1`, `generic`;
    aarch64: `aarch64`, `generic`; each optionally with `+extension`s. Anything else, or an
    ISA of another architecture, is an `invalid_isa` config error.
    """
    arch = arch or machine()
    base, *extras = [part.strip() for part in text.strip().lower().split("+")]
    if base in {"host", "native"} and not extras:
        return host_isa() if arch == machine() else IsaTarget(arch, 1 if arch == "x86_64" else 0)
    level = _parse_base(base, arch, text)
    table = _EXTENSIONS.get(arch, {})
    unknown = [ext for ext in extras if ext not in table or table[ext].level > level]
    if unknown:
        known = ", ".join(sorted(table)) or "none"
        raise _invalid(
            text, f"extension {unknown[0]!r} is not one of {arch}'s ({known}; AVX-512 ones need v4)"
        )
    return IsaTarget(arch, level, tuple(sorted(set(extras))))


def _parse_base(base: str, arch: str, text: str) -> int:
    if base in {"generic", "baseline"}:
        return 1 if arch == "x86_64" else 0
    if arch == "x86_64":
        if base in {"x86-64", "x86_64", "v1", "1"}:
            return 1
        for prefix in ("x86-64-v", "x86_64_v", "v", ""):
            if base.startswith(prefix) and base[len(prefix) :] in {"2", "3", "4"}:
                return int(base[len(prefix) :])
    elif base == arch:
        return 0
    spellings = "v1, v2, v3, v4 (or x86-64-vN, generic)" if arch == "x86_64" else f"{arch}, generic"
    raise _invalid(text, f"use host, or one of {spellings} for this {arch} host")


def _invalid(text: str, why: str) -> InvalidConfigError:
    return InvalidConfigError(f"{ISA_ENV}={text!r} is not an ISA: {why}.", code="invalid_isa", value=text)


def target_isa(requested: str | None = None) -> IsaTarget:
    """The ISA kernels are built for: `requested`, else `$AUTOFUSION_ISA`, else the host's.

    An ISA this host cannot run is honoured (a build host may prepare bundles for stronger peers)
    but logged, because such kernels cannot run here.
    """
    requested = requested if requested is not None else os.environ.get(ISA_ENV) or None
    host = host_isa()
    if requested is None:
        return host
    target = parse_isa(requested)
    if not target.runs_on(host):
        _warn_foreign(target, host)
    return target


@lru_cache(maxsize=8)
def _warn_foreign(target: IsaTarget, host: IsaTarget) -> None:
    log.warning("building kernels for %s on a %s host: they cannot run here", target.name, host.name)
