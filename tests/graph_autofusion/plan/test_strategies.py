"""The three strategies really differ, and each plan is best under its own objective."""

from __future__ import annotations

import pytest

import graph_autofusion as gaf
from graph_autofusion import FusionConfig
from graph_autofusion.hardware import get_profile
from graph_autofusion.plan.strategies import STRATEGIES, get_strategy

NAMES = sorted(STRATEGIES)


@pytest.fixture(scope="module")
def plans() -> dict[str, gaf.FusedGraph]:
    model = gaf.zoo.build("mlp", batch=64, hidden=(1024, 1024))
    return {name: gaf.fuse(model, FusionConfig(cost_model=name)) for name in NAMES}


def _signature(fused: gaf.FusedGraph) -> list[tuple[str, ...]]:
    return sorted(tuple(g["members"]) for g in fused.report()["groups"])


def test_strategies_give_different_plans(plans: dict[str, gaf.FusedGraph]) -> None:
    signatures = {name: tuple(_signature(f)) for name, f in plans.items()}
    assert signatures["memory_bandwidth"] != signatures["latency"]
    assert signatures["memory_bandwidth"] != signatures["compute_density"]


@pytest.mark.parametrize("own", NAMES)
def test_each_plan_is_best_under_its_own_objective(plans: dict[str, gaf.FusedGraph], own: str) -> None:
    strategy = get_strategy(own, get_profile("cpu"))
    scores = {name: strategy.objective([g.cost for g in f.plan.kernels]) for name, f in plans.items()}
    assert scores[own] == min(scores.values()), scores


def test_strategy_is_reported(plans: dict[str, gaf.FusedGraph]) -> None:
    for name, fused in plans.items():
        report = fused.report()
        assert report["strategy"] == name
        assert report["estimates"]["objective"]["name"] == name


def test_ascend_profile_plans_too() -> None:
    fused = gaf.fuse(gaf.zoo.build("mlp"), FusionConfig(hardware="ascend910", cost_model="latency"))
    assert fused.report()["hardware"]["name"] == "ascend910"
    assert "Hot Chips" in fused.report()["hardware"]["source"]
    with pytest.raises(gaf.InvalidConfigError) as err:
        gaf.fuse(gaf.zoo.build("mlp"), FusionConfig(hardware="tpu9"))
    assert err.value.code == "unknown_hardware"
