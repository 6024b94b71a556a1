"""The target registry: which targets exist and what a worker does for each.

A target names a queue (`fuse.<name>`), the hardware profile the cost model plans for, whether
this code base can compile kernels for it, and — for those that compile — the kernel backend, the
toolchain a worker needs and the device it runs the kernels on (what `GET /targets` shows, and what
`autofusion worker` checks before it takes a job: see `autofusion_worker.toolchain`). The API
accepts jobs for registered targets even while no worker serves them (they wait, and say so);
other names are rejected as `unknown_target`. This is the one catalogue: the API, the workers, the
deploy checks and the docs read it from here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    hardware: str
    compiles: bool
    #: the engine's kernel backend for this target: `c` (generated C) or `triton`; None: plan only
    backend: str | None = None
    #: what a worker host needs installed, in words (checked at worker start)
    toolchain: str = ""
    #: the device the kernels run on, in words (checked at worker start unless interpreting)
    device: str = ""
    #: whether `--interpret` (Triton's CPU interpreter) can stand in for the device
    interpretable: bool = False


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(
            "cpu",
            "x86-64/aarch64 CPU: plan, export, compile C kernels for the host's ISA and verify",
            "cpu",
            True,
            backend="c",
            toolchain="a C compiler (AUTOFUSION_CC, default cc)",
            device="the host CPU",
        ),
        Target(
            "cuda",
            "NVIDIA GPU: plan, export, compile Triton kernels (cubins ahead of time) and verify on the GPU",
            "cuda",
            True,
            backend="triton",
            toolchain="triton and torch (ptxas from the triton wheel)",
            device="an NVIDIA GPU visible to torch.cuda",
            interpretable=True,
        ),
        Target(
            "ascend910",
            "Ascend 910 NPU: plan, export, compile Triton kernels (triton-ascend) and verify on the NPU",
            "ascend910",
            True,
            backend="triton",
            toolchain="CANN, torch_npu and triton-ascend",
            device="an Ascend NPU visible to torch_npu",
            interpretable=True,
        ),
    )
}


def get_target(name: str) -> Target | None:
    return TARGETS.get(name)
