"""A small autotune on a real device: each launch tries a few block sizes on its first run and
keeps the fastest; the winners are stored beside the kernel's source (`<digest>.tune.json`, keyed
by hardware profile), so later processes and workers skip the search.

Under the interpreter nothing is tuned (times there say nothing of a device). Candidates stay
within the target's constraints: `blocks.configure` holds every candidate to the Ascend Unified
Buffer and the grid to the AI cores.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ...hardware import HardwareProfile
from ...lower.values import Unsupported
from .blocks import LaunchConfig, configure
from .render import Launch

CANDIDATES = {"flat": (256, 512, 1024, 2048), "row": (64, 128, 256, 512, 1024), "gemm": (32, 64, 128)}
REPEATS = 3


def tune_file(source_path: Path) -> Path:
    return source_path.with_suffix(".tune.json")


def load_tuned(
    source_path: Path, profile: HardwareProfile, launches: Sequence[Launch]
) -> list[LaunchConfig] | None:
    """The stored winners for `profile`, or None when this kernel was not tuned there yet."""
    try:
        stored = json.loads(tune_file(source_path).read_text())[profile.name]
    except (OSError, ValueError, KeyError):
        return None
    if len(stored) != len(launches):
        return None
    try:
        return [configure(launch, profile, block=int(b)) for launch, b in zip(launches, stored, strict=True)]
    except Unsupported:
        return None


def autotune(
    launches: Sequence[Launch],
    configs: list[LaunchConfig],
    profile: HardwareProfile,
    run: Callable[[Launch, LaunchConfig], None],
    synchronize: Callable[[], Any],
    source_path: Path,
) -> list[LaunchConfig]:
    """The fastest candidate of each launch (`run` launches it once), stored beside the source."""
    chosen: list[LaunchConfig] = []
    blocks: list[int] = []
    for launch, default in zip(launches, configs, strict=True):
        kind = (
            launch.kind if launch.kind != "row" or launch.row_blocks else ""
        )  # a row without chunks: nothing
        best, best_time, best_block = default, float("inf"), 0
        for block in CANDIDATES.get(kind, ()):
            try:
                config = configure(launch, profile, block=block)
            except Unsupported:
                continue
            run(launch, config)  # compile and warm up
            synchronize()
            times = []
            for _ in range(REPEATS):
                started = time.perf_counter()
                run(launch, config)
                synchronize()
                times.append(time.perf_counter() - started)
            if min(times) < best_time:
                best, best_time, best_block = config, min(times), block
        chosen.append(best)
        blocks.append(best_block)
    path = tune_file(source_path)
    try:
        stored = json.loads(path.read_text()) if path.exists() else {}
        stored[profile.name] = blocks
        path.write_text(json.dumps(stored))
    except (OSError, ValueError):
        pass  # an unwritable cache only costs a search next time
    return chosen
