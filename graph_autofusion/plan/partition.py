"""A partition of the graph's nodes into groups (future kernels), merged monotonically."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from ..ir import Graph
from .cost import KernelCost, kernel_cost


class Partition:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.group_of: list[int] = list(range(len(graph.nodes)))
        self.members: dict[int, frozenset[int]] = {i: frozenset({i}) for i in range(len(graph.nodes))}
        self.patterns: dict[int, list[str]] = {i: [] for i in range(len(graph.nodes))}
        self._next = itertools.count(len(graph.nodes))
        self._cost: dict[int, KernelCost] = {}

    def groups(self) -> list[int]:
        return sorted(self.members, key=lambda g: min(self.members[g]))

    def cost(self, gid: int) -> KernelCost:
        found = self._cost.get(gid)
        if found is None:
            found = self._cost[gid] = kernel_cost(self.graph, self.members[gid])
        return found

    def union_members(self, gids: Iterable[int]) -> frozenset[int]:
        out: set[int] = set()
        for g in gids:
            out |= self.members[g]
        return frozenset(out)

    def merge(self, gids: Iterable[int], pattern: str) -> int:
        gids = sorted(set(gids))
        new = next(self._next)
        members = self.union_members(gids)
        patterns: list[str] = []
        for g in gids:
            patterns += [p for p in self.patterns.pop(g) if p not in patterns]
            del self.members[g]
            self._cost.pop(g, None)
        if pattern and pattern not in patterns:
            patterns.append(pattern)
        self.members[new] = members
        self.patterns[new] = patterns
        for i in members:
            self.group_of[i] = new
        return new

    def neighbours(self, gid: int) -> set[int]:
        """Groups connected to `gid` by a producer→consumer edge, either direction."""
        g = self.graph
        out: set[int] = set()
        for i in self.members[gid]:
            node = g.nodes[i]
            for n in g.successors(node):
                out.add(self.group_of[n.index])
            for n in g.predecessors(node):
                out.add(self.group_of[n.index])
        out.discard(gid)
        return out

    def edges(self) -> set[tuple[int, int]]:
        pairs: set[tuple[int, int]] = set()
        for node in self.graph.nodes:
            a = self.group_of[node.index]
            for s in self.graph.successors(node):
                b = self.group_of[s.index]
                if a != b:
                    pairs.add((min(a, b), max(a, b)))
        return pairs

    def creates_cycle(self, members: frozenset[int]) -> bool:
        """True if some path leaves `members` and comes back: the merged kernel could not be scheduled."""
        g = self.graph
        limit = max(members)
        stack = [s.index for i in members for s in g.successors(g.nodes[i]) if s.index not in members]
        seen: set[int] = set()
        while stack:
            i = stack.pop()
            if i in seen or i > limit:
                continue
            seen.add(i)
            for s in g.successors(g.nodes[i]):
                if s.index in members:
                    return True
                if s.index not in seen and s.index <= limit:
                    stack.append(s.index)
        return False
