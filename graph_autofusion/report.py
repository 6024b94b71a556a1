"""The fusion report: a JSON-serializable account of what was fused, what was not and why,
and what it is estimated to buy on the chosen hardware profile.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from . import __version__
from .config import FusionConfig
from .hardware import HardwareProfile
from .ir import Graph
from .plan import Plan
from .plan.cost import group_boundary, kernel_cost
from .plan.memory import peak_memory


def build_report(
    *,
    original_nodes: int,
    graph: Graph,
    plan: Plan,
    config: FusionConfig,
    hw: HardwareProfile,
    canonicalize_counts: dict[str, int],
    timings: dict[str, float],
    host_ops: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """`host_ops`: the ops the CPU backend runs through onnx.reference rather than as generated
    kernels, each with `node`, `op_type`, a stable `code` and a `reason` (never silent)."""
    singles = [frozenset({i}) for i in range(len(graph.nodes))]
    unfused_costs = [kernel_cost(graph, s) for s in singles]
    unfused_kernels = [c for c in unfused_costs if c.is_kernel]
    fused_costs = [g.cost for g in plan.kernels]
    schedule = [frozenset(g.members) for g in plan.groups]
    groups = []
    for k, g in enumerate(g for g in plan.groups if len(g.members) > 1):
        inputs, outputs = group_boundary(graph, g.members, g.private)
        parts_bytes = sum(unfused_costs[i].bytes for i in g.members)
        groups.append(
            {
                "name": f"fused_{k}",
                "pattern": "+".join(g.patterns) or "auto",
                "template": g.template,
                "members": [graph.nodes[i].name for i in g.members],
                "op_types": [graph.nodes[i].op_type for i in g.members],
                "inputs": inputs,
                "outputs": outputs,
                "bytes": g.cost.bytes,
                "bytes_saved": parts_bytes - g.cost.bytes,
                "flops": g.cost.flops,
                "estimated_us": round(g.cost.time(hw) * 1e6, 3),
            }
        )
    refused = [r.to_dict() for r in plan.refused]
    kernels_after = len(plan.kernels)
    return {
        "engine": {"name": "graph_autofusion", "version": __version__},
        "config": config.model_dump(mode="json"),
        "hardware": _hardware(hw),
        "strategy": plan.strategy.name,
        "operators": {"original": original_nodes, "canonical": len(graph.nodes)},
        "kernels": {"before": len(unfused_kernels), "after": kernels_after},
        "fusions": len(groups),
        "canonicalize": canonicalize_counts,
        "groups": groups,
        "templates": dict(Counter(g.template for g in plan.kernels)),
        "patterns": plan.pattern_stats,
        "refused": refused,
        "refused_by_code": dict(sorted(Counter(r["code"] for r in refused).items())),
        "host_ops": list(host_ops or []),
        "estimates": {
            "profile": hw.name,
            "bytes_moved": {
                "before": sum(c.bytes for c in unfused_kernels),
                "after": sum(c.bytes for c in fused_costs),
            },
            "peak_memory_bytes": {
                "before": peak_memory(graph, singles),
                "after": peak_memory(graph, schedule),
            },
            "latency_us": {
                "before": round(sum(c.time(hw) for c in unfused_kernels) * 1e6, 3),
                "after": round(sum(c.time(hw) for c in fused_costs) * 1e6, 3),
            },
            "objective": {"name": plan.strategy.name, "value": plan.objective()},
        },
        "timings_ms": {k: round(v * 1e3, 3) for k, v in timings.items()},
    }


def _hardware(hw: HardwareProfile) -> dict:
    """The profile, plus for the host CPU the ISA its kernels are compiled for (`isa` is what the
    host offers; the two differ when `AUTOFUSION_ISA` asks for another)."""
    out = hw.model_dump()
    if hw.name == "cpu":
        from .backend.cpu.isa import target_isa

        out["kernel_isa"] = target_isa().name
    return out
