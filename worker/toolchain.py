"""What a worker checks before it serves a target: its toolchain and its device.

A worker that took jobs for a target it cannot compile for would fail every one of them, after
each had waited in the queue; one that refuses to start fails once, at deploy time, where an
operator sees it (a crash-looping pod, a container that exits). So `autofusion worker --targets
cuda` first looks for triton and torch, the `ptxas` Triton compiles cubins with, and a GPU that
torch sees; `--targets ascend910` for CANN, torch_npu, triton-ascend and an NPU. What is missing
is said in one line, and the worker exits with `EXIT_TOOLCHAIN` (3), not a traceback.

`--interpret` (or `AUTOFUSION_TRITON_INTERPRET=1`) runs the Triton targets' kernels in Triton's
CPU interpreter: no device is needed, only triton and torch. Triton binds its language functions
to the interpreter or the compiler when it is first imported, so the interpreter must be asked
for (`TRITON_INTERPRET=1`) before that: the worker puts it into its environment before anything
imports triton, and the job processes it forks inherit both.

Each check returns what it found (versions, the device's name), which the worker logs at start.
The device itself is probed in a child process (`probe_device`), so that the worker never
initializes CUDA or the NPU before Celery forks its job processes.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from autofusion_core.targets import Target, get_target

#: Exit status of a worker whose target's toolchain or device is missing.
EXIT_TOOLCHAIN = 3

#: Where CANN's toolkit is looked for when no environment variable names it (its installer's default).
CANN_DEFAULT = Path("/usr/local/Ascend/ascend-toolkit/latest")
#: The environment variables CANN's `set_env.sh` exports for its toolkit root.
CANN_VARIABLES = ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH")
#: triton-ascend lowers through this compiler of CANN's BiSheng toolchain.
ASCEND_COMPILER = "bishengir-compile"
#: Seconds the device probe (a Python process importing torch) may take.
PROBE_TIMEOUT_S = 120


class ToolchainMissing(Exception):
    """A target's toolchain or device is missing; the message is one line, for an operator."""

    def __init__(self, target: str, message: str) -> None:
        super().__init__(f"target {target}: {message}")
        self.target = target


def interpret_requested(flag: bool) -> bool:
    """Whether the Triton targets interpret: asked for by the worker's setting, or by the engine's
    own switch already in the environment (then the engine interprets whatever the worker says)."""
    return flag or os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def check_targets(targets: Iterable[str], *, interpret: bool) -> dict[str, dict[str, str]]:
    """Check every target; raise `ToolchainMissing` for the first one that cannot be served.
    Returns, per target, what was found (component → version or name)."""
    found = {}
    for name in targets:
        target = get_target(name)
        if target is None:
            raise ToolchainMissing(name, "not a registered target")
        found[name] = check_target(target, interpret=interpret)
    return found


def check_target(target: Target, *, interpret: bool) -> dict[str, str]:
    if target.backend != "triton":
        return {}  # the C backend's compiler is checked by the engine on its first kernel
    if interpret and not target.interpretable:
        raise ToolchainMissing(target.name, "cannot run in Triton's interpreter")
    found = _triton_and_torch(target, interpret)
    if interpret:
        found["mode"] = "interpret"
        return found
    if target.name == "cuda":
        found.update(_cuda(target))
    elif target.name == "ascend910":
        found.update(_ascend(target))
    found["mode"] = "device"
    return found


def _version(module: Any) -> str:
    return str(getattr(module, "__version__", "unknown"))


def _import(target: Target, module: str, why: str) -> Any:
    try:
        return importlib.import_module(module)
    except Exception as exc:  # ImportError, or a broken install raising something else on import
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ToolchainMissing(target.name, f"{why} ({module} does not import: {reason})") from None


def _triton_and_torch(target: Target, interpret: bool) -> dict[str, str]:
    if interpret and "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"  # before the import below (see the module docstring)
    need = f"needs {target.toolchain}" if not interpret else "needs triton and torch to interpret"
    triton = _import(target, "triton", need)
    torch = _import(target, "torch", need)
    return {"triton": _version(triton), "torch": _version(torch)}


def _cuda(target: Target) -> dict[str, str]:
    try:
        from triton import knobs

        ptxas = knobs.nvidia.ptxas  # TRITON_PTXAS_PATH, else the binary the triton wheel ships
    except Exception as exc:
        raise ToolchainMissing(
            target.name, f"Triton cannot find ptxas ({exc}); reinstall triton or set TRITON_PTXAS_PATH"
        ) from None
    return {**probe_device(target), "ptxas": f"{ptxas.path} ({ptxas.version})"}


def probe_device(target: Target) -> dict[str, str]:
    """The device check, in a process of its own: asking torch for a GPU's name initializes CUDA,
    and a process that did cannot fork job processes that use it (Celery's prefork pool: "Cannot
    re-initialize CUDA in forked subprocess"; torch_npu likewise). The probe prints one JSON object."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "autofusion_worker.toolchain", target.name],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise ToolchainMissing(target.name, f"the device probe hung for {PROBE_TIMEOUT_S} s") from None
    lines = done.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        answer = {}
    if "error" in answer:
        raise ToolchainMissing(target.name, str(answer["error"]))
    if done.returncode != 0 or not answer:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ToolchainMissing(target.name, f"the device probe failed ({tail})")
    return {str(k): str(v) for k, v in answer.items()}


def _cuda_device(target: Target) -> dict[str, str]:
    import torch

    if not torch.cuda.is_available():
        raise ToolchainMissing(
            target.name,
            f"needs {target.device}, but torch.cuda.is_available() is False (no GPU, no driver, or a "
            "CPU-only torch); run on a GPU host, or pass --interpret to run the kernels in Triton's "
            "CPU interpreter",
        )
    major, minor = torch.cuda.get_device_capability(0)
    return {
        "device": f"{torch.cuda.get_device_name(0)} (sm_{major}{minor}, {torch.cuda.device_count()} visible)",
        "cuda": str(torch.version.cuda),
    }


def cann_home() -> Path | None:
    """CANN's toolkit root: the variable its `set_env.sh` exports, else the installer's default."""
    for variable in CANN_VARIABLES:
        value = os.environ.get(variable)
        if value and Path(value).is_dir():
            return Path(value)
    return CANN_DEFAULT if CANN_DEFAULT.is_dir() else None


def _ascend(target: Target) -> dict[str, str]:
    home = cann_home()
    if home is None:
        raise ToolchainMissing(
            target.name,
            f"needs CANN, but neither {' nor '.join(CANN_VARIABLES)} names a toolkit and {CANN_DEFAULT} "
            "does not exist; source CANN's set_env.sh (docs/deploy.md, the Ascend host recipe)",
        )
    compiler = shutil.which(ASCEND_COMPILER)
    if compiler is None:
        raise ToolchainMissing(
            target.name,
            f"CANN at {home} has no {ASCEND_COMPILER} on PATH (triton-ascend compiles with it); "
            "source CANN's set_env.sh",
        )
    if importlib.util.find_spec("triton.backends.ascend") is None:
        raise ToolchainMissing(
            target.name, "the installed triton has no Ascend backend; install triton-ascend instead of triton"
        )
    return {"cann": str(home), "compiler": compiler, **probe_device(target)}


def _npu_device(target: Target) -> dict[str, str]:
    torch_npu = _import(target, "torch_npu", f"needs {target.toolchain}")
    import torch

    npu = getattr(torch, "npu", None)
    if npu is None or not npu.is_available():
        raise ToolchainMissing(
            target.name,
            f"needs {target.device}, but torch.npu.is_available() is False (no NPU or no driver); pass "
            "--interpret to run the kernels in Triton's CPU interpreter",
        )
    return {
        "torch_npu": _version(torch_npu),
        "device": f"{npu.get_device_name(0)} ({npu.device_count()} visible)",
    }


_DEVICE_CHECKS = {"cuda": _cuda_device, "ascend910": _npu_device}


def _probe_main(argv: list[str]) -> int:
    """`python -m autofusion_worker.toolchain TARGET`: the device check of `probe_device`."""
    target = get_target(argv[0]) if argv else None
    if target is None or target.name not in _DEVICE_CHECKS:
        print(json.dumps({"error": f"no device check for {argv[:1]}"}))
        return 2
    try:
        print(json.dumps(_DEVICE_CHECKS[target.name](target)))
    except ToolchainMissing as exc:
        print(json.dumps({"error": str(exc).removeprefix(f"target {target.name}: ")}))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_probe_main(sys.argv[1:]))
