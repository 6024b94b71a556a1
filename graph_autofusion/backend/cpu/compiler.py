"""The compiler driver: C kernel sources in, cached shared objects out.

Usage (what the code generators and the runtime call)::

    from graph_autofusion.backend.cpu.compiler import KernelSource, compile_kernels

    arts = compile_kernels(
        [KernelSource("add_relu_0", c1), KernelSource("gemm_1", c2, uses_blas=True, prelude=BLAS_PREAMBLE)],
        jobs=2, progress=lambda done, total: ..., combine=True,
    )
    lib = arts[0].load()          # ctypes.CDLL; BLAS is loaded single-threaded first when needed
    arts[0].digest, arts[0].path, arts[0].cached

* `KernelSource(name, source, uses_blas=False, uses_openmp=True, prelude="")`: one complete C
  translation unit (`prelude + source`; it may export several functions). `name` must be a C
  identifier; it names the kernel in errors and the temporary source file, so compiler messages
  read `add_relu_0.c:12:3: error: ...`. Kernels calling BLAS include `blas.BLAS_PREAMBLE` and call
  `AF_SGEMM(...)`. Put includes and helpers shared by many kernels in `prelude`: when kernels are
  combined, each distinct prelude is emitted once.
* `compile_kernels(sources, cache=None, jobs=None, progress=None, combine=False)` →
  `list[Artifact]` in input order. Identical kernels (same digest) compile once per call and once
  per cache; misses compile in parallel (threads running compiler processes; `jobs` defaults to the
  usable cores); `progress(done, total)` counts unique kernels. The first failure (in input
  order) is raised as `CompilationError` once the running compilations finish; nothing
  half-written is left behind.
* `combine=True` (use it for a whole model): the misses are compiled as at most `jobs` combined
  translation units instead of one compiler run per kernel, several times faster cold (measured
  for 50 small kernels on 2 cores: ~25 ms per kernel combined vs ~170 ms per kernel apart; the
  fixed cost is the compiler, assembler and linker start-up per shared object). Each member
  is still cached under its own digest (an alias of the unit), so later lookups of any single
  kernel hit. Exported function names must be unique across the kernels of one call, and
  `static` helpers must either live in the shared `prelude` or carry a kernel-unique name; a
  unit that fails for any reason falls back to one build per member, so a clash only costs time
  and an error still names the broken kernel.
* `Artifact(digest, path, name, cached, uses_blas, isa)`: `cached` is True for a cache hit (including
  one another process produced while this one waited). Several artifacts may share a path
  (combined units; identical kernels); `dlopen` loads a shared object once per process. `path`
  is always the real shared object (`<its digest>.so`): anything that copies artifacts (a bundle)
  should copy each distinct `path` once, named by `path.name`, not once per kernel digest.
* `kernel_digest(src)` / `kernel_flags(src)`: the cache key and the exact command-line flags.
* `simd_math_preamble()`: put it in the prelude of kernels whose `#pragma omp simd` loops call
  expf/tanhf/erff/logf/powf/...: on x86-64-v3/v4 with glibc's libmvec they then vectorize (AVX2 or
  AVX-512 variants, within a few ulp; measured max relative error 2e-7 for expf), elsewhere it is empty
  and the loops stay scalar. Without it such loops never vectorize (no -ffast-math).
* `compiler_identity()` → `CompilerInfo(path, version, target, command)`: `$AUTOFUSION_CC` (may
  carry arguments, e.g. `"ccache gcc"`), else `cc`; cached per process.
* Cache: `cache.KernelCache(root=None, max_bytes=2 GiB)`, default root `$AUTOFUSION_CACHE_DIR` or
  `~/.cache/graph_autofusion/kernels`; `cache.default_cache()` is the per-process instance used
  when `cache=None`, so its `stats` (hits, misses, evictions, bytes) accumulate for reports and
  `/metrics`.
* Threads: every OpenMP unit is linked with the thread pool's entry shim (`threadpool.entry_source()`,
  `threadpool.link_flags()`: its libgomp calls are wrapped), and `Artifact.load` attaches the process's
  pool, so its parallel regions run there (threadpool/__init__.py says why).
  `threads.configure_kernel_threads(n)` before running kernels from a thread (OpenMP
  gets n threads, BLAS 1); `threads.set_omp_threads(n)` is per calling thread, and
  `blas.set_blas_threads(n)` process-wide (kernels expect 1, which `blas.load_blas()` sets).
  libgomp is not fork-safe: a process forked after OpenMP was loaded runs kernels on one thread
  (see threads.py); load kernels in worker processes, after the fork.

Flags, and why: `-O3 -fPIC -shared -std=c11 -ffp-contract=off -fno-math-errno -fno-trapping-math
-fno-semantic-interposition -fopenmp`, plus the ISA (`isa.target_isa()`, the host's own by default;
isa.py says why). Results must match onnxruntime to about 1e-5 relative, so there is no
`-ffast-math` (it reorders sums and assumes no NaN/Inf); contraction into FMA is off so builds of the
generated code for v2, v3 and v4 give bit-identical arithmetic (libm calls aside). The contraction
library's sums are not identical across builds: its micro-kernels use FMA on v3 and v4 and
multiply-add in the portable build, and some of its depth blocks differ by ISA (AFC_INPLACE_KC), so
a conv or GEMM differs in the last bits (`benchmarks/anchor_ab.py --baseline-isa v3`: up to 1e-5
on ResNet-50's 1x1 convs, outputs of order 10). `-fno-math-errno` lets
`sqrtf` etc. inline and vectorize and `-fno-trapping-math` allows if-conversion; neither changes a
value. Reductions are vectorized where the generated code says it is safe, with `#pragma omp simd
reduction(+:acc)` (honoured under `-fopenmp`, or `-fopenmp-simd` for `uses_openmp=False` kernels).
`-std=c11` is strict ISO C: define constants such as pi yourself (`M_PI` is not declared). Undefined
symbols and implicit declarations are errors at build time (`-Wl,--no-undefined`), so a typo fails
here, naming the kernel, instead of at `dlopen` in another process.

Debug builds: `AUTOFUSION_DEBUG_SANITIZE` adds `-fsanitize=...` (sanitize.py says how such kernels
load and what the runtime then checks); the flags are in the key, so the two builds never mix.

Cache key: sha256 over (source, compiler version line and target triple, every flag, ISA name,
host architecture). Because BLAS flags carry the library path (rpath), a moved installation
rebuilds rather than loading a kernel that points at a vanished library.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import logging
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from graph_autofusion.backend.cpu import blas, sanitize, threadpool
from graph_autofusion.backend.cpu.cache import KernelCache, default_cache
from graph_autofusion.backend.cpu.isa import IsaTarget, host_isa, target_isa
from graph_autofusion.backend.cpu.threads import available_cpus
from graph_autofusion.errors import CompilationError, IsaMismatchError

log = logging.getLogger(__name__)

CC_ENV = "AUTOFUSION_CC"
CC_TIMEOUT_ENV = "AUTOFUSION_CC_TIMEOUT"
DEFAULT_TIMEOUT_S = 300.0
KEY_VERSION = 1  # bump when the key's composition or the build recipe changes meaning

BASE_FLAGS: tuple[str, ...] = (
    "-O3",
    "-fPIC",
    "-shared",
    "-std=c11",
    "-ffp-contract=off",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-fno-semantic-interposition",
    "-pipe",
    "-Werror=implicit-function-declaration",
    "-Werror=implicit-int",
    "-Werror=return-type",
)
LINK_FLAGS: tuple[str, ...] = ("-Wl,--no-undefined", "-lm")

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_MAX_STDERR_CHARS = 4000
_MAX_STDERR_LINES = 60


@dataclass(frozen=True)
class KernelSource:
    """One C translation unit to compile (see the module docstring)."""

    name: str
    source: str
    uses_blas: bool = False
    uses_openmp: bool = True
    prelude: str = ""  # includes/helpers shared by kernels; emitted once per combined unit

    def __post_init__(self) -> None:
        if not _IDENTIFIER.match(self.name):
            raise ValueError(f"kernel name must be a C identifier of at most 128 characters: {self.name!r}")

    @property
    def text(self) -> str:
        """The translation unit as compiled on its own: prelude, then source."""
        return f"{self.prelude}\n{self.source}" if self.prelude else self.source


@dataclass(frozen=True)
class Artifact:
    """A compiled kernel in the cache."""

    digest: str
    path: Path
    name: str
    cached: bool
    uses_blas: bool = False
    isa: IsaTarget | None = None  # what it was built for

    def load(self) -> ctypes.CDLL:
        """`dlopen` the shared object; a BLAS kernel gets the BLAS loaded (single-threaded) first.

        A kernel built for an ISA this host lacks is refused (`isa_mismatch`): whoever loads it
        means to call it, and the call would die of SIGILL.
        """
        missing = self.isa.missing_on(host_isa()) if self.isa is not None else []
        if missing:
            raise IsaMismatchError(
                f"kernel {self.name} was built for {self.isa}; this host lacks {', '.join(missing)}",
                kernel=self.name,
                isa=str(self.isa),
            )
        if self.uses_blas:
            blas.load_blas()
        lib = ctypes.CDLL(str(self.path))
        threadpool.attach(lib)
        return lib


@dataclass(frozen=True)
class CompilerInfo:
    """Which C compiler builds the kernels; `version` and `target` go into every cache key."""

    path: str
    version: str  # first line of `cc --version`
    target: str  # `cc -dumpmachine`, e.g. x86_64-linux-gnu
    command: tuple[str, ...] = field(default=())  # argv prefix (wrapper + compiler)


def compiler_identity() -> CompilerInfo:
    """The configured compiler (`$AUTOFUSION_CC` or `cc`), probed once per process."""
    return _identity_for(os.environ.get(CC_ENV) or "cc")


@lru_cache(maxsize=8)
def _identity_for(spec: str) -> CompilerInfo:
    argv = shlex.split(spec)
    resolved = shutil.which(argv[0]) if argv else None
    if resolved is None:
        raise CompilationError(
            f"no C compiler found: {spec!r} is not on PATH; install gcc or clang, or set {CC_ENV}.",
            code="compiler_not_found",
            compiler=spec,
        )
    command = (resolved, *argv[1:])
    version = _probe(command, "--version").splitlines()
    target = _probe(command, "-dumpmachine").strip()
    return CompilerInfo(
        path=os.path.realpath(shutil.which(argv[-1]) or argv[-1]),  # the compiler behind any wrapper
        version=version[0].strip() if version else "unknown",
        target=target or platform.machine(),
        command=command,
    )


def _probe(command: tuple[str, ...], *args: str) -> str:
    try:
        proc = subprocess.run(
            [*command, *args], capture_output=True, text=True, timeout=30, check=False, env=_c_locale()
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CompilationError(
            f"the C compiler {command[0]!r} does not run: {exc}",
            code="compiler_not_found",
            compiler=command[0],
        ) from exc
    if proc.returncode != 0:
        raise CompilationError(
            f"the C compiler {command[0]!r} failed on {' '.join(args)}: {proc.stderr.strip()[:500]}",
            code="compiler_not_found",
            compiler=command[0],
        )
    return proc.stdout


@lru_cache(maxsize=16)
def _isa_flags(info: CompilerInfo, isa: IsaTarget) -> tuple[str, ...]:
    """`-march=x86-64-vN` when the compiler knows it (gcc >= 11, clang >= 12), else explicit -m flags."""
    flags = isa.march_flags()
    if not flags:
        return ()
    proc = subprocess.run(
        [*info.command, *flags, "-x", "c", "-fsyntax-only", "-"],
        input="int af_probe;\n",
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return tuple(flags if proc.returncode == 0 else isa.explicit_flags())


def kernel_flags(
    src: KernelSource, *, info: CompilerInfo | None = None, isa: IsaTarget | None = None
) -> list[str]:
    """Every flag the kernel is compiled and linked with, in command-line order (minus -o/source)."""
    info = info or compiler_identity()
    isa = isa or target_isa()
    flags = [*BASE_FLAGS, *_isa_flags(info, isa)]
    flags.append("-fopenmp" if src.uses_openmp else "-fopenmp-simd")
    flags.extend(sanitize.compile_flags(sanitize.sanitize_mode()))  # in the cache key with the rest
    if src.uses_blas:
        flags.extend(blas.compile_flags())
    return flags


def _link_flags(
    src: KernelSource, info: CompilerInfo | None = None, isa: IsaTarget | None = None
) -> list[str]:
    info = info or compiler_identity()
    isa = isa or target_isa()
    vector_math = ["-lmvec"] if _simd_math_ok(info, isa) else []
    sanitizers = sanitize.compile_flags(sanitize.sanitize_mode())
    entry = threadpool.link_flags() if src.uses_openmp else []
    return [*(blas.link_flags() if src.uses_blas else ()), *vector_math, *sanitizers, *entry, *LINK_FLAGS]


# Vector variants that glibc's libmvec provides for AVX2 and AVX-512 (`_ZGVdN8v_expf`, ...; glibc >= 2.35
# for the full list), each within a few ulp. gcc only calls them for `#pragma omp simd` loops
# when the function is declared `omp declare simd`, which <math.h> does only under -ffast-math.
SIMD_MATH_UNARY = (
    "expf", "exp2f", "expm1f", "logf", "log2f", "log10f", "log1pf", "tanhf", "erff", "erfcf",
    "sinf", "cosf", "tanf", "asinf", "acosf", "atanf", "sinhf", "coshf", "asinhf", "acoshf",
    "atanhf", "cbrtf",
)  # fmt: skip
SIMD_MATH_BINARY = ("powf", "atan2f", "hypotf")


# The libmvec variant each x86-64 level calls: (ISA letter of the vector ABI, lanes).
_SIMD_MATH_VARIANT = {3: ("d", 8), 4: ("e", 16)}


def _simd_math_text(lanes: int) -> str:
    lines = [
        "/* vector math: glibc libmvec variants (a few ulp), so `#pragma omp simd` loops",
        "   calling these functions vectorize without -ffast-math */",
        "#include <math.h>",
    ]
    for fn in SIMD_MATH_UNARY:
        lines += [f"#pragma omp declare simd simdlen({lanes}) notinbranch", f"float {fn}(float);"]
    for fn in SIMD_MATH_BINARY:
        lines += [f"#pragma omp declare simd simdlen({lanes}) notinbranch", f"float {fn}(float, float);"]
    return "\n".join(lines) + "\n"


@lru_cache(maxsize=8)
def _simd_math_ok(info: CompilerInfo, isa: IsaTarget) -> bool:
    """Whether the vector-math declarations link and load here: an x86-64-v3 or v4 target, a
    libmvec with every variant that level calls, and one the linker finds (`cc -print-file-name`)."""
    if isa.arch != "x86_64" or isa.level not in _SIMD_MATH_VARIANT:
        return False
    try:
        libmvec = ctypes.CDLL("libmvec.so.1")
    except OSError:
        return False
    letter, lanes = _SIMD_MATH_VARIANT[isa.level]
    names = [f"_ZGV{letter}N{lanes}v_{fn}" for fn in SIMD_MATH_UNARY]
    names += [f"_ZGV{letter}N{lanes}vv_{fn}" for fn in SIMD_MATH_BINARY]
    if not all(hasattr(libmvec, name) for name in names):
        return False
    try:
        found = _probe(info.command, "-print-file-name=libmvec.so").strip()
    except CompilationError:
        return False
    return os.path.isabs(found) and os.path.exists(found)


def simd_math_preamble() -> str:
    """C text that lets `#pragma omp simd` loops over expf/tanhf/erff/... vectorize.

    Put it in a kernel's `prelude` (after nothing that includes <math.h> differently). It is
    empty where it would not link (not x86-64-v3/v4, no libmvec), and the loops then simply stay
    scalar, so generated code can include it unconditionally.
    """
    isa = target_isa()
    if not _simd_math_ok(compiler_identity(), isa):
        return ""
    return _simd_math_text(_SIMD_MATH_VARIANT[isa.level][1])


def kernel_digest(
    src: KernelSource, *, info: CompilerInfo | None = None, isa: IsaTarget | None = None
) -> str:
    """The artifact key: sha256 of everything that determines the shared object's bytes.

    The kernel's `name` is not part of it: two groups with the same code share one artifact.
    """
    info = info or compiler_identity()
    isa = isa or target_isa()
    material = {
        "key_version": KEY_VERSION,
        "compiler": info.version,
        "target": info.target,
        "flags": kernel_flags(src, info=info, isa=isa),
        "link": _link_flags(src, info, isa),
        "isa": isa.name,
        "machine": platform.machine(),
        "source": src.text,
        "entry": threadpool.entry_source() if src.uses_openmp else "",
    }
    blob = json.dumps(material, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def _c_locale() -> dict[str, str]:
    # Plain ASCII diagnostics (no typographic quotes), identical on every worker.
    return {**os.environ, "LC_ALL": "C"}


def _timeout() -> float:
    try:
        return float(os.environ.get(CC_TIMEOUT_ENV, DEFAULT_TIMEOUT_S))
    except ValueError:
        return DEFAULT_TIMEOUT_S


def _trim(text: str) -> str:
    lines = text.strip().splitlines()
    if len(lines) > _MAX_STDERR_LINES:
        lines = [*lines[:_MAX_STDERR_LINES], f"... ({len(lines) - _MAX_STDERR_LINES} more lines)"]
    out = "\n".join(lines)
    return out if len(out) <= _MAX_STDERR_CHARS else out[:_MAX_STDERR_CHARS] + "\n... (truncated)"


def _build(src: KernelSource, info: CompilerInfo, isa: IsaTarget, output: Path) -> None:
    """Run the compiler once, writing the shared object at `output`."""
    with tempfile.TemporaryDirectory(prefix="autofusion-cc-") as workdir:
        source_file = Path(workdir) / f"{src.name}.c"
        source_file.write_text(src.text, encoding="utf-8")
        files = [source_file.name]
        if src.uses_openmp:  # its libgomp calls go through the entry shim (threadpool/__init__.py)
            entry_file = Path(workdir) / "af_pool_entry.c"
            entry_file.write_text(threadpool.entry_source(), encoding="utf-8")
            files.append(entry_file.name)
        cmd = [
            *info.command,
            *kernel_flags(src, info=info, isa=isa),
            "-o",
            str(output),
            *files,
            *_link_flags(src, info, isa),
        ]
        # Its own process group, so a timeout kills cc1/as/ld too, not only the driver.
        proc = subprocess.Popen(
            cmd,
            cwd=workdir,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_c_locale(),
            start_new_session=True,
        )
        try:
            _, raw_stderr = proc.communicate(timeout=_timeout())
        except subprocess.TimeoutExpired as exc:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise CompilationError(
                f"kernel '{src.name}' did not compile within {exc.timeout:.0f} s.",
                code="compilation_timeout",
                kernel=src.name,
                timeout_s=exc.timeout,
            ) from exc
        except BaseException:  # interrupted: leave no compiler running behind
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        if proc.returncode != 0:
            stderr = _trim(raw_stderr.replace(workdir + os.sep, ""))
            errors = [
                line
                for line in stderr.splitlines()
                if "error" in line.lower() or "undefined reference" in line
            ][:3]
            summary = "; ".join(errors) or (stderr.splitlines() or ["no message"])[0]
            raise CompilationError(
                f"kernel '{src.name}' failed to compile ({Path(info.path).name}): {summary}",
                kernel=src.name,
                stderr=stderr,
                returncode=proc.returncode,
                compiler=info.version,
                command=shlex.join(str(c) for c in cmd),
            )


def _combined_unit(members: Sequence[tuple[str, KernelSource]]) -> KernelSource:
    """One translation unit holding several kernels: each distinct prelude once, then the bodies.

    The text depends only on the members' code (kernels are marked by digest, not by name), so
    the same kernels form the same unit, and the same cache entry, whatever they are called.
    """
    preludes = list(dict.fromkeys(src.prelude for _, src in members if src.prelude))
    parts = [f"/* combined unit of {len(members)} kernels */", *preludes]
    parts += [f"/* ---- kernel {digest[:16]} ---- */\n{src.source}" for digest, src in members]
    first = members[0][1]
    return KernelSource(
        name=f"unit_{first.name}"[:128],
        source="\n".join(parts) + "\n",
        uses_blas=first.uses_blas,
        uses_openmp=first.uses_openmp,
    )


def _plan_units(misses: list[str], unique: dict[str, KernelSource], workers: int) -> list[list[str]]:
    """Split the kernels to build into at most `workers` combined units per flag set.

    Units only mix kernels whose flags are identical (so a member inside a unit is exactly the
    binary it would be alone), and the split is deterministic (sorted by digest), so two
    processes compiling the same model form the same units and the unit lock dedupes them.
    """
    groups: dict[tuple[bool, bool], list[str]] = {}
    for digest in sorted(misses):
        src = unique[digest]
        groups.setdefault((src.uses_blas, src.uses_openmp), []).append(digest)
    units: list[list[str]] = []
    for digests in groups.values():
        count = max(1, min(workers, len(digests)))
        units.extend(digests[i::count] for i in range(count))
    return units


def compile_kernels(
    sources: Sequence[KernelSource],
    *,
    cache: KernelCache | None = None,
    jobs: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    combine: bool = False,
    isa: IsaTarget | None = None,
) -> list[Artifact]:
    """Compile (or find in the cache) every kernel; artifacts come back in input order.

    See the module docstring for the contract. `progress` is called from the calling thread.
    With `combine=True` the kernels that miss the cache are compiled as at most `jobs` combined
    translation units (one shared object each, every member aliased under its own digest), which
    is several times faster than one compiler run per kernel; a unit that fails to compile (a
    clash of names between kernels, or a broken kernel) falls back to one build per member, so
    errors still name the kernel at fault. `isa` defaults to `isa.target_isa()`.
    """
    cache = cache if cache is not None else default_cache()
    info = compiler_identity()
    isa = isa or target_isa()
    digests = [kernel_digest(src, info=info, isa=isa) for src in sources]
    unique: dict[str, KernelSource] = {}
    for digest, src in zip(digests, sources, strict=True):
        unique.setdefault(digest, src)

    total = len(unique)
    results: dict[str, tuple[Path, bool]] = {}
    keep: set[str] = set(unique)
    misses: list[str] = []
    for digest in unique:
        real = cache.resolve(digest) if cache.get(digest) is not None else None
        if real is None:
            misses.append(digest)
        else:
            results[digest] = (real, True)
            keep.add(real.stem)  # the unit behind an alias must survive this batch too
    if progress is not None:
        progress(len(results), total)
    if misses:
        workers = max(1, min(jobs or available_cpus(), len(misses)))
        started = time.perf_counter()
        _build_misses(misses, unique, cache, info, isa, workers, combine, keep, results, progress, total)
        log.info(
            "compiled %d of %d unique kernels in %.2f s (%d jobs, %d shared objects, %s)",
            len(misses),
            total,
            time.perf_counter() - started,
            workers,
            len({results[d][0] for d in misses}),
            isa.name,
        )

    return [
        Artifact(
            digest=digest,
            path=results[digest][0],
            name=src.name,
            cached=results[digest][1],
            uses_blas=src.uses_blas,
            isa=isa,
        )
        for digest, src in zip(digests, sources, strict=True)
    ]


def _build_misses(
    misses: list[str],
    unique: dict[str, KernelSource],
    cache: KernelCache,
    info: CompilerInfo,
    isa: IsaTarget,
    workers: int,
    combine: bool,
    keep: set[str],
    results: dict[str, tuple[Path, bool]],
    progress: Callable[[int, int], None] | None,
    total: int,
) -> None:
    """Compile the misses in a thread pool, filling `results`; raise the first failure.

    A combined unit that fails is split in two and retried (down to single kernels), so one
    broken kernel among n costs about 2*log2(n) extra unit builds rather than n separate ones,
    and the error that is finally raised comes from the kernel's own build.
    """
    Result = dict[str, tuple[Path, bool]]
    units: dict[str, tuple[KernelSource, list[str]]] = {}

    def build_one(digest: str, keep_now: frozenset[str]) -> Result:
        src = unique[digest]
        path, created = cache.put(
            digest, lambda out: _build(src, info, isa, out), source=src.text, keep=keep_now
        )
        return {digest: (path, not created)}

    def build_unit(unit_digest: str, keep_now: frozenset[str]) -> Result:
        unit, members = units[unit_digest]
        path, created = cache.put(
            unit_digest, lambda out: _build(unit, info, isa, out), source=unit.source, keep=keep_now
        )
        for member in members:
            cache.alias(member, unit_digest)
        return {member: (path, not created) for member in members}

    failures: dict[str, BaseException] = {}
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="autofusion-cc") as pool:
        jobs: dict[Future[Result], tuple[str, str]] = {}

        def submit(members: list[str]) -> Future[Result]:
            # Workers read `keep` while this thread grows it: hand each job a frozen copy.
            if len(members) == 1:
                fut = pool.submit(build_one, members[0], frozenset(keep))
                jobs[fut] = ("one", members[0])
                return fut
            unit = _combined_unit([(d, unique[d]) for d in members])
            unit_digest = kernel_digest(unit, info=info, isa=isa)
            units[unit_digest] = (unit, members)
            keep.add(unit_digest)
            fut = pool.submit(build_unit, unit_digest, frozenset(keep))
            jobs[fut] = ("unit", unit_digest)
            return fut

        plan = _plan_units(misses, unique, workers) if combine else [[d] for d in misses]
        pending = {submit(members) for members in plan}
        while pending:
            finished, pending = wait(pending, return_when=FIRST_EXCEPTION)
            for fut in finished:
                if fut.cancelled():
                    continue
                kind, key = jobs[fut]
                exc = fut.exception()
                if exc is None:
                    results.update(fut.result())
                    if progress is not None:
                        progress(len(results), total)
                elif kind == "unit" and isinstance(exc, CompilationError) and not failures:
                    members = units[key][1]
                    half = len(members) // 2
                    pending |= {submit(members[:half]), submit(members[half:])}
                else:
                    failures[key] = exc
            if failures:
                # Stop queued work; compilers already running finish (their temp files are
                # cleaned by the cache) so nothing is left half-written.
                for fut in pending:
                    fut.cancel()
    if failures:
        order = [d for d in unique if d in failures] or list(failures)
        error = failures[order[0]]
        if isinstance(error, CompilationError) and len(order) > 1:
            error.details["failed_kernels"] = [unique[d].name for d in order if d in unique]
        raise error
