"""The three fusion strategies: how candidates are ranked and which legal fusions are declined.

- `memory_bandwidth` ranks by bytes of memory traffic saved (as Inductor and CANN autofuse do) and
  declines a fusion that saves none.
- `latency` ranks by estimated time saved — launch overhead plus roofline time (as XLA's priority
  fusion does) — and declines a fusion the cost model predicts to be slower, e.g. two contractions
  whose shared kernel runs at lower efficiency than the traffic it saves is worth.
- `compute_density` lets anchors take their epilogues, never puts two compute-bound anchors in one
  kernel, ranks by memory-bound time removed, and declines a fusion that turns a compute-bound
  kernel into a memory-bound one (the roofline gate).

Each strategy also defines the objective its plans minimise, so plans can be compared.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..hardware import HardwareProfile
from .cost import KernelCost
from .reasons import ACCEPT, Verdict, refuse


@dataclass(frozen=True)
class Candidate:
    parts: tuple[KernelCost, ...]
    union: KernelCost

    def saved(self, metric) -> float:
        return sum(metric(p) for p in self.parts) - metric(self.union)


class Strategy:
    name = ""
    allow_anchor_chains = True

    def __init__(self, hw: HardwareProfile) -> None:
        self.hw = hw

    def metric(self, cost: KernelCost) -> float:
        raise NotImplementedError

    def score(self, cand: Candidate) -> float:
        return cand.saved(self.metric)

    def decide(self, cand: Candidate) -> Verdict:
        saved = self.score(cand)
        if saved <= 0:
            return refuse("NF008", f"{self.name}: fusing saves nothing ({self._describe(saved)})")
        return ACCEPT

    def _describe(self, saved: float) -> str:
        return f"{saved:.3g}"

    def objective(self, kernels: list[KernelCost]) -> float:
        return sum(self.metric(k) for k in kernels)


class MemoryBandwidth(Strategy):
    name = "memory_bandwidth"

    def metric(self, cost: KernelCost) -> float:
        return float(cost.bytes)

    def _describe(self, saved: float) -> str:
        return f"{saved:+.0f} bytes of traffic"


class Latency(Strategy):
    name = "latency"

    def metric(self, cost: KernelCost) -> float:
        return cost.time(self.hw)

    def _describe(self, saved: float) -> str:
        return f"estimated {saved * 1e6:+.2f} µs"


class ComputeDensity(Strategy):
    name = "compute_density"
    allow_anchor_chains = False

    def metric(self, cost: KernelCost) -> float:
        return cost.memory_bound_time(self.hw)

    def decide(self, cand: Candidate) -> Verdict:
        if any(p.compute_bound(self.hw) and p.anchors for p in cand.parts) and not cand.union.compute_bound(
            self.hw
        ):
            return refuse(
                "NF008", "compute_density: the fused kernel would turn memory-bound (roofline gate)"
            )
        return super().decide(cand)

    def _describe(self, saved: float) -> str:
        return f"memory-bound time {saved * 1e6:+.2f} µs"

    def objective(self, kernels: list[KernelCost]) -> float:
        """Memory-bound time, with two anchors in one kernel infeasible (its defining constraint)."""
        if any(k.anchors > 1 for k in kernels):
            return float("inf")
        return super().objective(kernels)


STRATEGIES: dict[str, type[Strategy]] = {s.name: s for s in (MemoryBandwidth, Latency, ComputeDensity)}


def get_strategy(name: str, hw: HardwareProfile) -> Strategy:
    return STRATEGIES[name](hw)
