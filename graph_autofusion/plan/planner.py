"""Planning: patterns first, then the strategy's greedy merging, every step through legality.

Output is a `Plan`: the groups in a valid execution order with their template and cost, how often
each pattern matched and applied, and every refused candidate with its reason code.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..config import FusionConfig
from ..errors import InvalidConfigError
from ..hardware import HardwareProfile
from ..ir import Graph
from ..ops import OpKind
from .cost import KernelCost, group_boundary, kernel_cost
from .legality import Legality
from .memory import live_profile
from .partition import Partition
from .patterns import Pattern, builtin_patterns
from .reasons import ACCEPT, Verdict, refuse
from .strategies import Candidate, Strategy, get_strategy
from .templates import classify, row_stages

VIEW_PRIORITY = 1e30  # absorbing a view costs nothing: try those merges first
RECOMPUTE_MAX_INPUT_BYTES = 64 * 1024  # inputs this small stay cache-resident when re-read
RECOMPUTABLE = {OpKind.VIEW, OpKind.ELEMENTWISE, OpKind.BROADCAST}
# A reader iterates its whole domain; recomputing a producer of a much smaller (broadcast) domain
# inside it repeats the producer's work that many times and, measured on BERT's attention mask,
# costs more than the separate kernel it saves (the row loops also stop vectorizing).
RECOMPUTE_MAX_REDUNDANCY = 4


@dataclass
class PlannedGroup:
    members: list[int]  # node indices, topological
    template: str
    patterns: list[str]
    cost: KernelCost
    private: frozenset[int] = frozenset()  # members recomputed here and in other kernels

    @property
    def is_kernel(self) -> bool:
        return self.cost.is_kernel

    @property
    def fused(self) -> bool:
        return len(self.members) > 1


@dataclass
class Refusal:
    code: str
    title: str
    detail: str
    source: str  # "pattern:<name>" or "strategy:<name>"
    nodes: list[list[str]]  # node names of each group involved

    def to_dict(self) -> dict[str, object]:
        return {
            "code": self.code,
            "reason": self.title,
            "detail": self.detail,
            "source": self.source,
            "groups": self.nodes,
        }


@dataclass
class Plan:
    graph: Graph
    groups: list[PlannedGroup]
    strategy: Strategy
    refused: list[Refusal] = field(default_factory=list)
    pattern_stats: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def kernels(self) -> list[PlannedGroup]:
        return [g for g in self.groups if g.is_kernel]

    def objective(self) -> float:
        return self.strategy.objective([g.cost for g in self.kernels])


class Planner:
    def __init__(
        self,
        graph: Graph,
        config: FusionConfig,
        hw: HardwareProfile,
        user_patterns: Sequence[Pattern] = (),
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.graph = graph
        self.config = config
        self.hw = hw
        self.strategy = get_strategy(config.cost_model, hw)
        self.part = Partition(graph)
        baseline = [frozenset({i}) for i in range(len(graph.nodes))]
        self.legality = Legality(
            graph,
            config,
            live_profile(graph, baseline),
            self.strategy.allow_anchor_chains,
            row_stages(hw),
        )
        self.user_patterns = list(user_patterns)
        self.verdicts: dict[tuple[int, int], tuple[Verdict, str]] = {}
        self.refused: list[Refusal] = []
        self.stats: dict[str, dict[str, int]] = {}

    # -- evaluation ------------------------------------------------------------------------
    def _judge(self, gids: Sequence[int]) -> Verdict:
        verdict, _ = self.legality.check(self.part, gids)
        if not verdict:
            return verdict
        parts = tuple(self.part.cost(g) for g in gids)
        if not all(p.is_kernel for p in parts) or not self.config.enable_cost_model:
            return ACCEPT
        union = self._union_cost(gids)
        return self.strategy.decide(Candidate(parts, union))

    def _union_cost(self, gids: Sequence[int]) -> KernelCost:
        return kernel_cost(self.graph, self.part.union_members(gids))

    def _score(self, a: int, b: int) -> float:
        pa, pb = self.part.cost(a), self.part.cost(b)
        if not (pa.is_kernel and pb.is_kernel):
            return VIEW_PRIORITY
        return self.strategy.score(Candidate((pa, pb), self._union_cost((a, b))))

    def _names(self, gid: int) -> list[str]:
        return [self.graph.nodes[i].name for i in sorted(self.part.members[gid])]

    # -- phases ----------------------------------------------------------------------------
    def run(self) -> Plan:
        if self.config.enable_pattern_matching:
            self._patterns()
        if self.config.enable_auto_fusion and self.config.max_fusion_size > 0:
            self._auto()
        return self._finish()

    def _patterns(self) -> None:
        ordered = sorted(self.user_patterns, key=lambda p: -getattr(getattr(p, "spec", None), "priority", 0))
        for pattern in [*ordered, *builtin_patterns()]:
            if not pattern.applies_to(self.hw):
                continue
            label = pattern.label()
            stats = self.stats.setdefault(label, {"matched": 0, "applied": 0, "refused": 0})
            matches = list(pattern.match(self.graph))
            stats["matched"] += len(matches)
            disabled = label in self.config.disabled_patterns
            if disabled:
                stats["disabled"] = 1
            for match in matches:
                names = list(pattern.fuse(self.graph, match))
                try:
                    nodes = [self.graph.node(n).index for n in names]
                except KeyError as missing:
                    raise InvalidConfigError(
                        f"pattern {label!r} proposed node {missing} which is not in the graph",
                        code="invalid_pattern",
                    ) from None
                gids = sorted({self.part.group_of[i] for i in nodes})
                if len(gids) < 2:
                    continue
                if disabled:
                    verdict = refuse("NF009", f"pattern {label!r} is in disabled_patterns")
                else:
                    verdict = self._judge(gids)
                if verdict:
                    self.part.merge(gids, label)
                    stats["applied"] += 1
                else:
                    stats["refused"] += 1
                    self.refused.append(
                        Refusal(
                            verdict.code,
                            verdict.title,
                            verdict.detail,
                            f"pattern:{label}",
                            [self._names(g) for g in gids],
                        )
                    )

    def _auto(self) -> None:
        tie = itertools.count()
        for _ in range(self.config.max_rounds):
            heap: list[tuple[float, int, int, int]] = []

            def push(a: int, b: int, heap: list[tuple[float, int, int, int]] = heap) -> None:
                a, b = min(a, b), max(a, b)
                if (a, b) in self.verdicts:
                    return
                heapq.heappush(heap, (-self._score(a, b), next(tie), a, b))

            for a, b in self.part.edges():
                push(a, b)
            merged = 0
            while heap:
                _, _, a, b = heapq.heappop(heap)
                if a not in self.part.members or b not in self.part.members:
                    continue
                verdict = self._judge((a, b))
                if not verdict:
                    self.verdicts[(a, b)] = (verdict, "")
                    continue
                new = self.part.merge((a, b), "auto")
                merged += 1
                for n in self.part.neighbours(new):
                    push(new, n)
            if not merged:
                break

    def _finish(self) -> Plan:
        part = self.part
        for a, b in sorted(part.edges()):
            found = self.verdicts.get((a, b))
            if found is None and self.config.enable_auto_fusion and self.config.max_fusion_size > 0:
                continue
            verdict = found[0] if found else self.legality.check(part, (a, b))[0]
            if verdict:
                continue
            self.refused.append(
                Refusal(
                    verdict.code,
                    verdict.title,
                    verdict.detail,
                    f"strategy:{self.strategy.name}",
                    [self._names(a), self._names(b)],
                )
            )
        groups = []
        for gid in _schedule(part):
            members = sorted(part.members[gid])
            template, why = classify(self.graph, members)
            assert template is not None, why
            patterns = part.patterns[gid]
            groups.append(PlannedGroup(members, template, patterns, part.cost(gid)))
        if self.config.enable_auto_fusion and self.config.max_fusion_size > 0:
            groups = self._recompute_cheap_producers(groups)
        return Plan(self.graph, groups, self.strategy, self.refused, self.stats)

    def _recompute_cheap_producers(self, groups: list[PlannedGroup]) -> list[PlannedGroup]:
        """Inline a cheap pointwise kernel into every kernel that reads it (as Inductor inlines
        pointwise producers): its inputs are small enough to stay in cache, so recomputing it in
        each consumer costs less than writing its output and launching it. A node then belongs to
        several kernels — the only place the plan stops being a partition."""
        g = self.graph
        owner: dict[int, int] = {i: k for k, grp in enumerate(groups) for i in grp.members}
        dropped: set[int] = set()
        for k, grp in enumerate(groups):
            if grp.template not in ("pointwise", "single") or not grp.is_kernel:
                continue
            if any(g.nodes[i].kind not in RECOMPUTABLE for i in grp.members):
                continue
            inputs, outputs = group_boundary(g, grp.members)
            if any(g.values[o].is_output for o in outputs):
                continue
            if sum(g.values[x].nbytes for x in inputs) > RECOMPUTE_MAX_INPUT_BYTES:
                continue
            readers = sorted({owner[c] for o in outputs for c in g.values[o].consumers} - {k})
            if not readers or any(groups[r].template == "view" for r in readers):
                continue
            produced = max(_numel(g.values[o].shape) for o in outputs)
            if any(_domain(g, groups[r].members) > RECOMPUTE_MAX_REDUNDANCY * produced for r in readers):
                continue  # a broadcast producer would be recomputed for every element of a far larger domain
            merged = []
            for r in readers:
                members = sorted(set(groups[r].members) | set(grp.members))
                private = groups[r].private | frozenset(grp.members)
                template, _ = classify(g, members, private=private)
                acts = [x for x in group_boundary(g, members, private)[0] if not g.values[x].is_const]
                if (
                    template is None
                    or len(acts) > self.config.max_inputs
                    or len(members) > self.config.max_fusion_size
                ):
                    break
                merged.append((r, members, template, private))
            else:
                for r, members, template, private in merged:
                    old = groups[r]
                    patterns = old.patterns if "recompute" in old.patterns else [*old.patterns, "recompute"]
                    cost = kernel_cost(g, members, private)
                    groups[r] = PlannedGroup(members, template, patterns, cost, private)
                dropped.add(k)
                self.stats.setdefault("recompute", {"matched": 0, "applied": 0, "refused": 0})
                self.stats["recompute"]["matched"] += 1
                self.stats["recompute"]["applied"] += 1
        return [grp for k, grp in enumerate(groups) if k not in dropped]


def _numel(shape: tuple[int, ...] | None) -> int:
    n = 1
    for d in shape or ():
        n *= d
    return n


def _domain(graph: Graph, members: Sequence[int]) -> int:
    """Elements of the largest value a kernel computes: the size of its loop domain."""
    return max(_numel(graph.values[o].shape) for i in members for o in graph.nodes[i].outputs if o)


def _schedule(part: Partition) -> list[int]:
    """Groups in a topological order (Kahn), ties broken by original position."""
    g = part.graph
    indeg: dict[int, int] = dict.fromkeys(part.members, 0)
    succ: dict[int, set[int]] = {gid: set() for gid in part.members}
    for node in g.nodes:
        a = part.group_of[node.index]
        for s in g.successors(node):
            b = part.group_of[s.index]
            if a != b and b not in succ[a]:
                succ[a].add(b)
                indeg[b] += 1
    ready = [(min(part.members[gid]), gid) for gid, d in indeg.items() if d == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, gid = heapq.heappop(ready)
        order.append(gid)
        for b in succ[gid]:
            indeg[b] -= 1
            if indeg[b] == 0:
                heapq.heappush(ready, (min(part.members[b]), b))
    assert len(order) == len(part.members), "cycle among groups: legality must have prevented it"
    return order


def plan(graph: Graph, config: FusionConfig, hw: HardwareProfile, patterns: Sequence[Pattern] = ()) -> Plan:
    return Planner(graph, config, hw, patterns).run()


__all__ = ["OpKind", "Plan", "PlannedGroup", "Planner", "Refusal", "plan"]
