"""The target registry: which targets exist and what a worker does for each.

A target names a queue (`fuse.<name>`), the hardware profile the cost model plans for, and whether
this code base can compile kernels for it. The API accepts jobs for registered targets even while
no worker serves them (they wait, and say so); other names are rejected as `unknown_target`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    hardware: str
    compiles: bool


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("cpu", "x86-64/aarch64 CPU: plan, export, compile C kernels and verify", "cpu", True),
        Target(
            "ascend910", "Ascend 910 cost model: plan and export (no kernel backend yet)", "ascend910", False
        ),
    )
}


def get_target(name: str) -> Target | None:
    return TARGETS.get(name)
