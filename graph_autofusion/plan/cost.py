"""Roofline cost of a kernel: max(flops / peak, bytes / bandwidth) + launch overhead.

A kernel's memory traffic is what crosses its boundary — the activations and weights it reads and
the tensors it writes for others — so fusion's gain is exactly the traffic of the intermediates it
keeps inside. Views cost nothing: they alias a buffer.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from ..hardware import HardwareProfile
from ..ir import Graph
from ..ops import OpKind


@dataclass(frozen=True)
class KernelCost:
    flops: int
    bytes: int
    anchors: int
    is_kernel: bool

    def compute_time(self, hw: HardwareProfile) -> float:
        if not self.is_kernel:
            return 0.0
        eff = 1.0
        if self.anchors:
            eff = hw.anchor_efficiency * (hw.chain_efficiency if self.anchors > 1 else 1.0)
        return self.flops / (hw.peak_flops * eff)

    def memory_time(self, hw: HardwareProfile) -> float:
        return self.bytes / hw.memory_bandwidth if self.is_kernel else 0.0

    def time(self, hw: HardwareProfile) -> float:
        if not self.is_kernel:
            return 0.0
        return max(self.compute_time(hw), self.memory_time(hw)) + hw.launch_overhead

    def memory_bound_time(self, hw: HardwareProfile) -> float:
        """Time the kernel waits on memory beyond its compute: what `compute_density` minimises."""
        if not self.is_kernel:
            return 0.0
        return max(0.0, self.memory_time(hw) - self.compute_time(hw)) + hw.launch_overhead

    def compute_bound(self, hw: HardwareProfile) -> bool:
        return self.compute_time(hw) >= self.memory_time(hw)


def group_boundary(
    graph: Graph, members: Collection[int], private: Collection[int] = ()
) -> tuple[list[str], list[str]]:
    """External inputs (activations and weights, first-use order) and outputs of a node set.

    Values of `private` members (recomputed here and in each other kernel that reads them) are
    never outputs."""
    inputs: dict[str, None] = {}
    outputs: dict[str, None] = {}
    for i in sorted(members):
        node = graph.nodes[i]
        for x in node.inputs:
            if not x:
                continue
            p = graph.values[x].producer
            if p is None or p not in members:
                inputs.setdefault(x)
        if i in private:
            continue
        for o in node.outputs:
            if not o:
                continue
            v = graph.values[o]
            if v.is_output or any(c not in members for c in v.consumers):
                outputs.setdefault(o)
    return list(inputs), list(outputs)


def kernel_cost(graph: Graph, members: Collection[int], private: Collection[int] = ()) -> KernelCost:
    nodes = [graph.nodes[i] for i in members]
    is_kernel = any(n.kind != OpKind.VIEW for n in nodes)
    inputs, outputs = group_boundary(graph, members, private)
    traffic = sum(graph.values[x].nbytes for x in inputs) + sum(graph.values[x].nbytes for x in outputs)
    return KernelCost(
        flops=sum(n.cost.flops for n in nodes),
        bytes=traffic if is_kernel else 0,
        anchors=sum(1 for n in nodes if n.kind == OpKind.ANCHOR),
        is_kernel=is_kernel,
    )
