"""The sanitizer debug build: kernels under AddressSanitizer/UBSan, an arena that fails loudly.

    AUTOFUSION_DEBUG_SANITIZE=1          address + undefined (needs the ASan runtime preloaded)
    AUTOFUSION_DEBUG_SANITIZE=undefined  UBSan alone (works in any process)
    AUTOFUSION_DEBUG_SANITIZE=0 / unset  the normal build

Why each part:

* Flags. `-fsanitize=... -fno-sanitize-recover=all` make the first out-of-bounds access or
  undefined operation abort with a report naming the kernel's source line (`-g`). They are
  kernel flags, so they enter the kernel cache key: a sanitized and a normal build never share
  an artifact.
* Preloading. An ASan-instrumented shared object cannot be `dlopen`ed into a Python that did
  not start with the ASan runtime ("ASan runtime does not come first in initial library list",
  and the process exits). So ASan runs in a process started with
  `LD_PRELOAD="$(cc -print-file-name=libasan.so) $(cc -print-file-name=libstdc++.so.6)"`;
  `subprocess_env()` builds that environment and
  `compile_model` refuses (code `sanitizer_runtime_missing`) rather than kill the process. UBSan
  needs no preloading (measured: a UBSan kernel loads and aborts on a bad shift in-process).
* The arena. ASan only knows allocations it made; the arena is one numpy allocation, so inside
  it a kernel reading past its tensor reads its neighbour, silently. In this mode the runtime
  gives every buffer a redzone (`REDZONE_BYTES`, never shared with a buffer live at the same
  time), calls kernels one at a time, and before each poisons the whole arena and unpoisons the
  buffers live at that step: a read past a tensor, or of a tensor outside its lifetime (an arena
  reuse bug), is then an ASan report. Weights and scratch are numpy allocations, which the
  preloaded ASan `malloc` already surrounds with redzones. Independently of ASan, every run
  first fills the arena with a different byte pattern (`CompiledModel.poison`), so a read of
  memory no kernel wrote gives NaN or an answer that changes between identical runs.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping
from functools import lru_cache

from ...errors import FusionError

ENV = "AUTOFUSION_DEBUG_SANITIZE"
ADDRESS, UNDEFINED = "address,undefined", "undefined"
REDZONE_BYTES = 64  # after every arena buffer; a multiple of ASan's 8-byte shadow granule
ASAN_OPTIONS = "detect_leaks=0:abort_on_error=1:halt_on_error=1:detect_odr_violation=0"
UBSAN_OPTIONS = "print_stacktrace=1:halt_on_error=1"


class SanitizerError(FusionError):
    code = "sanitizer_runtime_missing"


def sanitize_mode(value: str | None = None) -> str:
    """ "" (off), `UNDEFINED` or `ADDRESS` from `value`, else from the environment variable."""
    raw = (os.environ.get(ENV, "") if value is None else value).strip().lower()
    if raw in ("", "0", "off", "false", "no"):
        return ""
    if raw in ("undefined", "ubsan", "ub"):
        return UNDEFINED
    return ADDRESS  # "1", "address", "asan", "address,undefined", ...


def compile_flags(mode: str) -> tuple[str, ...]:
    """The extra compile-and-link flags of `mode` (empty when off)."""
    if not mode:
        return ()
    return (f"-fsanitize={mode}", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g")


@lru_cache(maxsize=1)
def _asan() -> ctypes.CDLL | None:
    process = ctypes.CDLL(None)
    return process if hasattr(process, "__asan_poison_memory_region") else None


def asan_loaded() -> bool:
    """Whether this process runs with the ASan runtime (it was preloaded at start)."""
    return _asan() is not None


def require_runtime(mode: str) -> None:
    """Refuse, with the command to use, a mode this process cannot load kernels of."""
    if mode == ADDRESS and not asan_loaded():
        raise SanitizerError(
            f"{ENV} asks for AddressSanitizer kernels, but this process was not started with the "
            "ASan runtime; run it as LD_PRELOAD=$(cc -print-file-name=libasan.so) "
            f"ASAN_OPTIONS={ASAN_OPTIONS} (sanitize.subprocess_env() builds that environment), "
            f"or set {ENV}=undefined for UBSan alone",
            mode=mode,
        )


def poison(address: int, nbytes: int) -> None:
    """Mark [address, address + nbytes) unaddressable (a no-op without the ASan runtime)."""
    asan = _asan()
    if asan is not None and nbytes > 0:
        asan.__asan_poison_memory_region(ctypes.c_void_p(address), ctypes.c_size_t(nbytes))


def unpoison(address: int, nbytes: int) -> None:
    """Mark [address, address + nbytes) addressable again (a no-op without the ASan runtime)."""
    asan = _asan()
    if asan is not None and nbytes > 0:
        asan.__asan_unpoison_memory_region(ctypes.c_void_p(address), ctypes.c_size_t(nbytes))


def asan_libraries() -> list[str]:
    """What LD_PRELOAD must name: the compiler's libasan, then libstdc++.

    libstdc++ too because ASan resolves its `__cxa_throw` interceptor at start-up: in a Python
    (a C program) libstdc++ is not loaded yet, and the first C++ exception thrown later (an
    onnxruntime error during shape inference) aborts with "CHECK failed: real___cxa_throw".
    """
    from .compiler import _probe, compiler_identity

    command = compiler_identity().command
    found = [_probe(command, f"-print-file-name={lib}").strip() for lib in ("libasan.so", "libstdc++.so.6")]
    return [path for path in found if os.path.isabs(path)]


def subprocess_env(base: Mapping[str, str] | None = None, mode: str = ADDRESS) -> dict[str, str]:
    """An environment for a child Python that builds and runs kernels in `mode`."""
    env = dict(os.environ if base is None else base)
    env[ENV] = mode
    env["UBSAN_OPTIONS"] = UBSAN_OPTIONS
    if mode == ADDRESS:
        env["LD_PRELOAD"] = " ".join(p for p in (*asan_libraries(), env.get("LD_PRELOAD", "")) if p)
        env["ASAN_OPTIONS"] = ASAN_OPTIONS
    return env
