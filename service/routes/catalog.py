"""`GET /targets` (what live workers serve) and `GET /patterns` (what the engine fuses by name)."""

from __future__ import annotations

import importlib
from datetime import UTC, datetime

from fastapi import APIRouter

from autofusion_core.targets import get_target

from ..deps import State, Tenant
from ..problems import problem_responses
from ..schemas import PatternInfo, PatternList, TargetInfo, TargetList

router = APIRouter(tags=["catalog"])


@router.get(
    "/targets",
    response_model=TargetList,
    summary="Targets served by live workers, with what each compiles",
    responses=problem_responses(401, 503),
)
def list_targets(state: State, tenant: Tenant) -> TargetList:
    by_target: dict[str, list[float]] = {}
    modes: dict[str, dict[str, int]] = {}
    for worker in state.store.workers():
        for target in worker.targets:
            by_target.setdefault(target, []).append(worker.last_seen)
            mode = worker.modes.get(target, "device")
            counts = modes.setdefault(target, {})
            counts[mode] = counts.get(mode, 0) + 1
    return TargetList(targets=[_info(name, seen, modes[name]) for name, seen in sorted(by_target.items())])


def _info(name: str, seen: list[float], modes: dict[str, int]) -> TargetInfo:
    """A served target with what the catalogue says of it (a worker may serve a target this API's
    catalogue does not know yet, during a rolling upgrade: then only its name and workers)."""
    last_seen = datetime.fromtimestamp(max(seen), tz=UTC)
    target = get_target(name)
    if target is None:
        return TargetInfo(name=name, workers=len(seen), last_seen=last_seen, modes=modes)
    return TargetInfo(
        name=name,
        workers=len(seen),
        last_seen=last_seen,
        description=target.description,
        compiles=target.compiles,
        backend=target.backend,
        toolchain=target.toolchain,
        device=target.device,
        modes=modes,
    )


def builtin_patterns() -> list[PatternInfo]:
    """The engine's built-in patterns, as the engine lists them (empty if it lists none yet)."""
    try:
        module = importlib.import_module("graph_autofusion.plan.patterns")
    except ImportError:
        return []
    listing = getattr(module, "builtin_patterns", None)
    if listing is None:
        return []
    found = []
    for item in listing():
        if isinstance(item, dict):
            name, description = item.get("name"), item.get("description", "")
        else:
            name, description = getattr(item, "name", None), getattr(item, "description", "") or ""
        if name:
            found.append(PatternInfo(name=str(name), description=str(description)))
    return found


@router.get(
    "/patterns",
    response_model=PatternList,
    summary="Built-in fusion patterns",
    responses=problem_responses(401),
)
def list_patterns(tenant: Tenant) -> PatternList:
    return PatternList(patterns=builtin_patterns())
