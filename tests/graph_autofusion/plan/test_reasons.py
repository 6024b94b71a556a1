"""Every refusal reason code is produced by a concrete graph, with its code in the report."""

from __future__ import annotations

import numpy as np
import pytest
from graphs import Propose, model, node

import graph_autofusion as gaf
from graph_autofusion import FusionConfig


def refused(fused: gaf.FusedGraph, source: str | None = None) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in fused.report()["refused"]:
        if source is None or r["source"] == source:
            out.setdefault(r["code"], []).append(r)
    return out


def chain(n: int = 3, shape=(4, 8)):
    ops = ["Relu", "Neg", "Exp", "Abs", "Sqrt"]
    nodes = [node(ops[i % len(ops)], [f"v{i}"], [f"v{i + 1}"], f"n{i}") for i in range(n)]
    return model(nodes, [("v0", list(shape))], [f"v{n}"])


def test_nf001_no_shared_data() -> None:
    m = model(
        [node("Relu", ["a"], ["b"], "r1"), node("Neg", ["c"], ["d"], "r2")],
        [("a", [4]), ("c", [4])],
        ["b", "d"],
    )
    fused = gaf.fuse(m, patterns=[Propose(["r1", "r2"])])
    assert "NF001" in refused(fused, "pattern:propose")
    assert fused.get_kernel_count() == 2


def test_nf002_cycle() -> None:
    # x → A → Hardmax (opaque) → C, and A → C directly: fusing A with C would enclose the Hardmax.
    m = model(
        [
            node("Relu", ["x"], ["a"], "A"),
            node("Hardmax", ["a"], ["t"], "T"),
            node("Add", ["a", "t"], ["c"], "C"),
        ],
        [("x", [4, 8])],
        ["c"],
    )
    fused = gaf.fuse(m, FusionConfig(enable_auto_fusion=False), patterns=[Propose(["A", "C"])])
    codes = refused(fused, "pattern:propose")
    assert "NF002" in codes, fused.report()["refused"]


def test_nf003_peak_memory_grows() -> None:
    n = 1 << 20  # 4 MiB per tensor
    m = model(
        [
            node("ReduceSum", ["x"], ["s"], "S", keepdims=1),
            node("Tanh", ["x"], ["t"], "T"),
            node("Exp", ["t"], ["u"], "U"),
            node("Add", ["u", "s"], ["y"], "A"),
        ],
        [("x", [1, n])],
        ["y"],
    )
    fused = gaf.fuse(m, FusionConfig(enable_auto_fusion=False), patterns=[Propose(["S", "A"])])
    assert "NF003" in refused(fused, "pattern:propose"), fused.report()["refused"]


def test_nf004_size_cap() -> None:
    fused = gaf.fuse(chain(3), FusionConfig(max_fusion_size=2, enable_pattern_matching=False))
    assert fused.get_kernel_count() == 2
    assert "NF004" in refused(fused)


def test_nf005_input_cap() -> None:
    m = model(
        [node("Add", ["a", "b"], ["c"], "add"), node("Mul", ["c", "d"], ["e"], "mul")],
        [("a", [4]), ("b", [4]), ("d", [4])],
        ["e"],
    )
    fused = gaf.fuse(m, FusionConfig(max_inputs=2))
    assert "NF005" in refused(fused)
    assert gaf.fuse(m, FusionConfig(max_inputs=3)).get_kernel_count() == 1


def test_nf006_loop_domains_differ() -> None:
    """Rows of 8 summed, then the 4 sums reduced across rows: two domains, two kernels."""
    m = model(
        [
            node("Relu", ["x"], ["r"], "relu"),
            node("ReduceSum", ["r", "axes"], ["s"], "sum", keepdims=1),
            node("ReduceMax", ["s"], ["t"], "max", axes=[0], keepdims=1),
        ],
        [("x", [4, 8])],
        ["t"],
        inits=[("axes", np.array([1], dtype=np.int64))],
    )
    fused = gaf.fuse(m)
    assert "NF006" in refused(fused)
    assert fused.get_kernel_count() == 2


def test_nf007_two_anchors_under_compute_density() -> None:
    m = gaf.zoo.build("mlp", batch=64, hidden=(256, 256))
    fused = gaf.fuse(m, FusionConfig(cost_model="compute_density"))
    assert "NF007" in refused(fused)
    assert all(g["template"] != "anchor_chain" for g in fused.report()["groups"])


def test_nf008_cost_model_declines() -> None:
    # Big contractions are compute-bound: sharing one kernel lowers their efficiency more than the
    # saved traffic is worth, so the latency strategy declines the matmul chain.
    m = gaf.zoo.build("mlp", batch=64, hidden=(1024, 1024))
    fused = gaf.fuse(m, FusionConfig(cost_model="latency"))
    assert "NF008" in refused(fused)
    off = gaf.fuse(m, FusionConfig(cost_model="latency", enable_cost_model=False))
    assert "NF008" not in refused(off)
    assert off.get_kernel_count() < fused.get_kernel_count()


def test_nf009_disabled_by_config() -> None:
    fused = gaf.fuse(chain(2), FusionConfig(max_fusion_size=0))
    assert fused.get_kernel_count() == 2 and fused.get_fusion_count() == 0
    assert "NF009" in refused(fused)
    fused = gaf.fuse(chain(2), FusionConfig(disabled_patterns=["pointwise_chain"], enable_auto_fusion=False))
    assert [r["source"] for r in refused(fused)["NF009"]] == ["pattern:pointwise_chain"]


def test_nf010_opaque_op() -> None:
    m = model(
        [node("Relu", ["x"], ["r"], "relu"), node("Hardmax", ["r"], ["h"], "hm")], [("x", [4, 4])], ["h"]
    )
    fused = gaf.fuse(m)
    assert "NF010" in refused(fused)


@pytest.mark.parametrize("code", [f"NF{i:03d}" for i in range(1, 11)])
def test_every_code_has_a_title(code: str) -> None:
    from graph_autofusion.plan.reasons import REASONS

    assert REASONS[code]
