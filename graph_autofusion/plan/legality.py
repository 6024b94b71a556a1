"""May these groups become one kernel?  One function answering yes or a stable reason.

Checks run cheapest first. The strategy's own cost judgement (NF008) is not here: legality says
what is *possible*, the strategy decides what is *worth it*.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np

from ..config import FusionConfig
from ..ir import Graph
from ..ops import OpKind
from .attention_match import looks_like_attention
from .cost import group_boundary
from .partition import Partition
from .reasons import ACCEPT, Verdict, refuse
from .templates import classify


class Legality:
    def __init__(
        self,
        graph: Graph,
        config: FusionConfig,
        baseline_live: np.ndarray,
        allow_chains: bool,
        row_stages: bool = True,
    ) -> None:
        self.graph = graph
        self.row_stages = row_stages  # anchors may normalise / pool rows (templates.row_stages)
        self.config = config
        self.live = baseline_live
        self.peak = int(baseline_live.max()) if len(baseline_live) else 0
        self.allow_chains = allow_chains
        self.last_use = self._last_uses()

    def _last_uses(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for name, v in self.graph.values.items():
            if v.consumers:
                out[name] = max(v.consumers)
            if v.is_output:
                out[name] = len(self.graph.nodes)
        return out

    def check(self, part: Partition, gids: Collection[int]) -> tuple[Verdict, str | None]:
        """(verdict, template) for merging the groups `gids` of `part`."""
        g = self.graph
        cfg = self.config
        if cfg.max_fusion_size == 0:
            return refuse("NF009", "fusion is disabled (max_fusion_size = 0)"), None
        members = part.union_members(gids)
        real = [i for i in members if g.nodes[i].kind != OpKind.VIEW]
        if len(real) > cfg.max_fusion_size:
            return refuse("NF004", f"{len(real)} ops exceed max_fusion_size = {cfg.max_fusion_size}"), None
        if not self._connected(part, gids):
            return refuse("NF001", "the groups neither feed each other nor read a common tensor"), None
        opaque = [g.nodes[i] for i in members if g.nodes[i].kind == OpKind.OPAQUE]
        if opaque:
            n = opaque[0]
            return refuse("NF010", f"{n.op_type} '{n.name}' is opaque: it runs as a kernel of its own"), None
        anchors = [g.nodes[i] for i in members if g.nodes[i].kind == OpKind.ANCHOR]
        # Attention's two contractions share a kernel under every strategy: its scores never
        # reach memory, which is the point of forming it (plan/attention_match.py).
        attention = looks_like_attention([g.nodes[i].op_type for i in members])
        if len(anchors) > 1 and not self.allow_chains and not attention:
            return refuse(
                "NF007", f"{anchors[0].name} and {anchors[1].name} are both compute-bound anchors"
            ), None
        if part.creates_cycle(members):
            return refuse("NF002", "another kernel depends on one group and feeds the other"), None
        template, why = classify(g, members, row_stages=self.row_stages)
        if template is None:
            code = "NF007" if len(anchors) > 2 else "NF006"
            return refuse(code, why), None
        inputs, _ = group_boundary(g, members)
        activations = [x for x in inputs if not g.values[x].is_const]
        if len(activations) > cfg.max_inputs:
            return refuse(
                "NF005", f"{len(activations)} external inputs exceed max_inputs = {cfg.max_inputs}"
            ), None
        grows = self._peak_grows(members, activations)
        if grows:
            return refuse("NF003", grows), None
        return ACCEPT, template

    def _connected(self, part: Partition, gids: Collection[int]) -> bool:
        gids = list(gids)
        if len(gids) < 2:
            return True
        reached = {gids[0]}
        frontier = [gids[0]]
        wanted = set(gids)
        while frontier:
            gid = frontier.pop()
            near = part.neighbours(gid) | self._siblings(part, gid)
            for other in near & wanted:
                if other not in reached:
                    reached.add(other)
                    frontier.append(other)
        return reached == wanted

    def _siblings(self, part: Partition, gid: int) -> set[int]:
        g = self.graph
        out: set[int] = set()
        for i in part.members[gid]:
            for x in g.activation_inputs(g.nodes[i]):
                out |= {part.group_of[c] for c in g.values[x].consumers}
        out.discard(gid)
        return out

    def _peak_grows(self, members: frozenset[int], activations: list[str]) -> str:
        """Running the merged kernel at its last member keeps its inputs alive until then, while
        its internal intermediates never reach memory; refuse if that lifts the peak."""
        g = self.graph
        run_at = max(members)
        extend = [
            (self.last_use[x], g.values[x].nbytes)
            for x in activations
            if self.last_use.get(x, run_at) < run_at
        ]
        if not extend:
            return ""
        start = min(t for t, _ in extend)
        window = self.live[start : run_at + 1].astype(np.int64).copy()
        for last, nbytes in extend:
            window[last - start + 1 :] += nbytes
        for i in members:
            for o in g.nodes[i].outputs:
                v = g.values.get(o) if o else None
                if v is None or v.is_output or not v.consumers or any(c not in members for c in v.consumers):
                    continue
                lo, hi = max(i, start), min(max(v.consumers), run_at)
                if lo <= hi:
                    window[lo - start : hi - start + 1] -= v.nbytes
        grown = int(window.max())
        if grown > self.peak:
            extra = sum(b for _, b in extend)
            return (
                f"keeping {extra} bytes of inputs alive longer raises peak activation memory "
                f"to {grown} bytes (from {self.peak})"
            )
        return ""
