"""Fusion patterns: named rewrites proposing groups, built-in or written by users.

A pattern only *proposes*: `match(graph)` finds candidate node sets and `fuse(graph, match)`
turns one into the group to form. Every proposal goes through the same legality check as the
automatic strategy, so a user pattern that proposes an impossible group gets a reason code back
(in the report) instead of a broken graph.

    class AddRelu(graph_autofusion.Pattern):
        name = "add_relu"
        def match(self, graph):
            return [[a.name, r.name] for a, r in graph.chains(["Add", "Relu"])]

    fuser.register_pattern(AddRelu())
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import ClassVar

from ..config import PatternSpec
from ..hardware import HardwareProfile
from ..ir import Graph, Node
from ..ops import OpKind

Match = Sequence[str]  # node names


class Pattern:
    """Base class of fusion patterns. Subclasses set `name` and implement `match`."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""

    def match(self, graph: Graph) -> Iterable[Match]:
        raise NotImplementedError

    def fuse(self, graph: Graph, match: Match) -> Match:
        """The nodes to put in one kernel for `match` (by default: all of them)."""
        return match

    def label(self) -> str:
        return self.name or type(self).__name__

    def applies_to(self, hw: HardwareProfile) -> bool:
        """Whether the planner tries this pattern for the target `hw` describes (all by default)."""
        return True


# -- helpers ---------------------------------------------------------------------------------


def _epilogue_chain(graph: Graph, start: Node) -> list[Node]:
    """Elementwise/broadcast ops following `start` along single-consumer edges."""
    chain: list[Node] = []
    node = graph.sole_consumer(start)
    while node is not None and node.kind in (OpKind.ELEMENTWISE, OpKind.BROADCAST):
        chain.append(node)
        node = graph.sole_consumer(node)
    return chain


def _other_input(node: Node, value: str) -> str | None:
    others = [x for x in node.inputs if x and x != value]
    return others[0] if len(others) == 1 else None


# -- built-ins -------------------------------------------------------------------------------


class PointwiseChain(Pattern):
    name = "pointwise_chain"
    description = "chains of elementwise ops along single-consumer edges (e.g. add → relu → mul)"

    def match(self, graph: Graph) -> Iterable[Match]:
        out = []
        for node in graph:
            if node.kind not in (OpKind.ELEMENTWISE, OpKind.BROADCAST):
                continue
            producers = [
                p for p in graph.predecessors(node) if p.kind in (OpKind.ELEMENTWISE, OpKind.BROADCAST)
            ]
            if any(graph.sole_consumer(p) is node for p in producers):
                continue  # not the head of a chain
            chain = [node, *_epilogue_chain(graph, node)]
            if len(chain) > 1:
                out.append([n.name for n in chain])
        return out


class _AnchorEpilogue(Pattern):
    anchors: ClassVar[tuple[str, ...]] = ()

    def match(self, graph: Graph) -> Iterable[Match]:
        out = []
        for node in graph:
            if node.op_type in self.anchors:
                chain = _epilogue_chain(graph, node)
                if chain:
                    out.append([node.name, *(n.name for n in chain)])
        return out


class ConvEpilogue(_AnchorEpilogue):
    name = "conv_epilogue"
    description = "Conv with its bias, activation and residual add (conv → relu, conv → add → relu)"
    anchors = ("Conv", "ConvTranspose")


class MatMulEpilogue(_AnchorEpilogue):
    name = "matmul_epilogue"
    description = "MatMul/Gemm with bias, activation (incl. GELU) and residual add"
    anchors = ("MatMul", "Gemm")


class Gelu(Pattern):
    name = "gelu"
    description = "GELU written out by exporters: x·0.5·(1+erf(x/√2)) or the tanh approximation"
    _POINTWISE = (OpKind.ELEMENTWISE, OpKind.BROADCAST)

    def match(self, graph: Graph) -> Iterable[Match]:
        out = []
        for node in graph:
            if node.op_type not in ("Erf", "Tanh"):
                continue
            # The elementwise ops (at most 5 deep) that compute the erf/tanh argument.
            ancestors: dict[int, Node] = {}
            frontier = [(node, 0)]
            while frontier:
                n, depth = frontier.pop()
                for p in graph.predecessors(n):
                    if p.kind in self._POINTWISE and p.index not in ancestors and depth < 5:
                        ancestors[p.index] = p
                        frontier.append((p, depth + 1))
            tail = _epilogue_chain(graph, node)[:4]
            chosen = None
            for k, t in enumerate(tail):
                for x in graph.activation_inputs(t):
                    if x in t.inputs and x != (tail[k - 1].outputs[0] if k else node.outputs[0]):
                        body = self._body(graph, x, ancestors)
                        if body:
                            chosen = (k, body)
            if chosen is None:
                continue
            k, body = chosen
            members = body | {node.index} | {t.index for t in tail[: k + 1]}
            nxt = tail[k + 1] if k + 1 < len(tail) else None
            if nxt is not None and nxt.op_type == "Mul" and len(graph.activation_inputs(nxt)) == 1:
                members.add(nxt.index)  # the trailing ·0.5 of the erf form
            out.append([graph.nodes[i].name for i in sorted(members)])
        return out

    @staticmethod
    def _body(graph: Graph, x: str, ancestors: dict[int, Node]) -> set[int]:
        """Ancestors of erf/tanh that read x (directly or through each other)."""
        body: set[int] = set()
        changed = True
        while changed:
            changed = False
            for i, n in ancestors.items():
                if i in body:
                    continue
                if x in n.inputs or any(graph.values[v].producer in body for v in n.inputs if v):
                    body.add(i)
                    changed = True
        return body


class LayerNorm(Pattern):
    name = "layer_norm"
    description = (
        "LayerNormalization, or its decomposition ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add"
    )

    def match(self, graph: Graph) -> Iterable[Match]:
        out = []
        for node in graph:
            if node.op_type == "LayerNormalization":
                members = [node, *_epilogue_chain(graph, node)[:0]]
                prologue = _prologue_adds(graph, node)
                out.append([n.name for n in [*prologue, *members]])
            elif node.op_type == "ReduceMean":
                x = node.inputs[0]
                subs = [c for c in graph.consumers(node.outputs[0]) if c.op_type == "Sub" and x in c.inputs]
                if len(subs) != 1:
                    continue
                members = {node.index, subs[0].index}
                frontier = [subs[0]]
                while frontier:
                    n = frontier.pop()
                    for s in graph.successors(n):
                        if s.index in members or len(members) >= 10:
                            continue
                        if s.kind in (OpKind.ELEMENTWISE, OpKind.BROADCAST) or s.op_type == "ReduceMean":
                            members.add(s.index)
                            frontier.append(s)
                if not any(graph.nodes[i].op_type == "Sqrt" for i in members):
                    continue
                prologue = _prologue_adds(graph, node)
                out.append([graph.nodes[i].name for i in sorted(members | {p.index for p in prologue})])
        return out


def _prologue_adds(graph: Graph, node: Node) -> list[Node]:
    """A residual Add feeding a normalisation, when nothing else reads the sum."""
    p = graph.producer(node.inputs[0])
    if (
        p is not None
        and p.op_type == "Add"
        and all(
            c.index == node.index or c.op_type == "Sub" or c.index in {node.index}
            for c in graph.consumers(p.outputs[0])
        )
    ):
        return [p]
    return []


class Softmax(Pattern):
    name = "softmax"
    description = "Softmax with its scaling and mask prologue (or ReduceMax/Sub/Exp/ReduceSum/Div)"

    def match(self, graph: Graph) -> Iterable[Match]:
        out = []
        for node in graph:
            members: list[Node] = []
            if node.op_type in ("Softmax", "LogSoftmax"):
                members = [node]
            elif node.op_type == "ReduceMax":
                x = node.inputs[0]
                subs = [c for c in graph.consumers(node.outputs[0]) if c.op_type == "Sub" and x in c.inputs]
                exps = [graph.sole_consumer(s) for s in subs]
                if len(subs) != 1 or exps[0] is None or exps[0].op_type != "Exp":
                    continue
                e = exps[0]
                sums = [c for c in graph.consumers(e.outputs[0]) if c.op_type == "ReduceSum"]
                divs = [c for c in graph.consumers(e.outputs[0]) if c.op_type == "Div"]
                if len(sums) != 1 or len(divs) != 1:
                    continue
                members = [node, subs[0], e, sums[0], divs[0]]
            if not members:
                continue
            head = members[0]
            prologue: list[Node] = []
            p = graph.producer(head.inputs[0])
            while p is not None and p.kind in (OpKind.ELEMENTWISE, OpKind.BROADCAST) and len(prologue) < 4:
                consumers = {c.index for c in graph.consumers(p.outputs[0])}
                if not consumers <= {m.index for m in members} | {q.index for q in prologue}:
                    break
                prologue.append(p)
                p = graph.producer(p.inputs[0])
            out.append([n.name for n in [*reversed(prologue), *members]])
        return out


class ReductionFusion(Pattern):
    name = "reduction_fusion"
    description = "a reduction with its elementwise neighbours (batch_norm → mean → add)"

    def match(self, graph: Graph) -> Iterable[Match]:
        out = []
        for node in graph:
            if node.op_type not in (
                "ReduceMean",
                "ReduceSum",
                "GlobalAveragePool",
                "ReduceMax",
                "GlobalMaxPool",
            ):
                continue
            pre: list[Node] = []
            p = graph.producer(node.inputs[0])
            while (
                p is not None and p.kind in (OpKind.ELEMENTWISE, OpKind.BROADCAST) and graph.sole_consumer(p)
            ):
                pre.append(p)
                p = graph.producer(p.inputs[0])
            post = _epilogue_chain(graph, node)
            if pre or post:
                out.append([n.name for n in [*reversed(pre), node, *post]])
        return out


class Attention(Pattern):
    """Scaled dot-product attention as one kernel (plan/attention_match.py decides legality).

    On accelerators the scores never reach memory (the Triton kernel keeps a query block's row
    of them in registers with an online softmax). On the CPU (lower/attention.py) each head's K^T
    and V are packed once and a 64-row block of scores stays in L2 between its two products.
    It is formed for every profile, the cpu one included, unless `GRAPH_AUTOFUSION_ATTENTION=off`
    (or `disabled_patterns: ["attention"]`); `=on` is accepted too (the default).

    Why on for the cpu profile (2-vCPU AMD EPYC Zen 4, AVX-512, a shared and loaded host): the
    12 attention blocks of BERT-base, GPT-2 and ViT-B/16, fused against unfused (BLAS GEMM anchor
    kernels around a row-softmax kernel), each kernel at its fastest in 7 alternating rounds
    (`benchmarks/attention_speed.py --reps 7`, 2 threads): BERT 6.1-8.0 vs 7.8-9.1 ms, GPT-2
    (causal) 5.4-6.5 vs 9.1-9.8 ms, ViT 18.3-18.7 vs 19.5-20.0 ms; with one thread (kernel
    minima over 8 profiled runs, all 12 layers): BERT 8.1 vs 9.4 ms, GPT-2 7.2 vs 9.9, ViT 21.6
    vs 25.3. Longer sequences keep the lead where measured (one layer, one thread): GPT-2 at
    1024 tokens 30.6 vs 74.2 ms (keys past each row tile's diagonal skipped). Whole models move
    by less than this host's noise (one thread, process CPU time, medians of 6 alternating
    rounds: BERT 249 vs 247 ms, ViT 414 vs 403, minima 244 vs 243 and 384 vs 389): attention is
    2-5% of them. The first CPU kernel (an sgemm per 64-row block) lost on BERT (13.6 vs 10.1
    ms) and ViT (65 vs 23 ms) and stayed off by default. On AVX2 (2-vCPU AMD EPYC Zen 1, afa.c's
    AVX2 tiles) one layer on one thread, minima of 9 alternating rounds: ViT 5.0-5.1 vs 6.0-6.5
    ms, BERT 2.1 vs 4.6-4.7, GPT-2 1.3-1.4 vs 2.3-2.4; whole models at 2 threads
    (attention_speed.py --reps 5) fused/unfused 0.94 (ViT) and 0.82 (BERT)."""

    name = "attention"
    description = "QK^T, scale, mask, Softmax, V and the head split/merge views as one kernel"
    ENV = "GRAPH_AUTOFUSION_ATTENTION"

    def applies_to(self, hw: HardwareProfile) -> bool:
        return os.environ.get(self.ENV, "auto").strip().lower() not in ("off", "0", "false")

    def match(self, graph: Graph) -> Iterable[Match]:
        out = []
        for node in graph:
            if node.op_type != "Softmax":
                continue
            members = self._members(graph, node)
            if members:
                out.append([graph.nodes[i].name for i in sorted(members)])
        return out

    @staticmethod
    def _members(graph: Graph, softmax: Node) -> set[int] | None:
        members = {softmax.index}
        p = graph.producer(softmax.inputs[0])
        while p is not None and p.op_type in ("Mul", "Div", "Add", "Where"):
            members.add(p.index)
            # The scores: the input of the softmax's shape read by this op alone (not the mask).
            full = graph.shape(softmax.inputs[0])
            scores = [
                x for x in p.inputs
                if x and graph.producer(x) is not None and graph.shape(x) == full
                and len(graph.values[x].consumers) == 1
            ]  # fmt: skip
            if len(scores) != 1:
                return None
            p = graph.producer(scores[0])
        second = graph.sole_consumer(softmax)
        if p is None or p.op_type != "MatMul" or second is None or second.op_type != "MatMul":
            return None
        members |= {p.index, second.index}
        for x in (p.inputs[0], p.inputs[1], second.inputs[1]):
            n = graph.producer(x)
            while n is not None and (n.op_type in _VIEW_CHAIN or n.op_type in ("Mul", "Div")):
                if len(graph.consumers(x)) != 1 or graph.values[x].is_output:
                    break
                if n.op_type in ("Mul", "Div") and len(graph.activation_inputs(n)) != 1:
                    break
                members.add(n.index)
                x = graph.activation_inputs(n)[0] if n.op_type in ("Mul", "Div") else n.inputs[0]
                n = graph.producer(x)
        n = graph.sole_consumer(second)
        while n is not None and n.op_type in _VIEW_CHAIN - {"Slice", "Split"}:
            members.add(n.index)
            n = graph.sole_consumer(n)
        return members


_VIEW_CHAIN = frozenset(
    {"Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Slice", "Split"}
)


class MatMulChain(Pattern):
    name = "matmul_chain"
    description = "two linear layers back to back (linear → act → reshape → linear) as one kernel"

    def match(self, graph: Graph) -> Iterable[Match]:
        out = []
        for node in graph:
            if node.op_type not in ("MatMul", "Gemm"):
                continue
            chain = [node]
            n = graph.sole_consumer(node)
            while n is not None and n.kind in (OpKind.ELEMENTWISE, OpKind.BROADCAST, OpKind.VIEW):
                chain.append(n)
                n = graph.sole_consumer(n)
            if n is not None and n.op_type in ("MatMul", "Gemm") and n.inputs[0] == chain[-1].outputs[0]:
                chain.append(n)
                chain += _epilogue_chain(graph, n)
                out.append([c.name for c in chain])
        return out


_BUILTINS: tuple[Pattern, ...] = (
    Attention(),
    LayerNorm(),
    Softmax(),
    Gelu(),
    ConvEpilogue(),
    MatMulEpilogue(),
    ReductionFusion(),
    PointwiseChain(),
    MatMulChain(),
)


def builtin_patterns() -> list[Pattern]:
    """Built-in patterns in the order they are tried (most specific first)."""
    return list(_BUILTINS)


# -- declarative patterns ---------------------------------------------------------------------


class DeclarativePattern(Pattern):
    """A `PatternSpec` (JSON over the wire) matched as a producer→consumer chain of ops."""

    def __init__(self, spec: PatternSpec) -> None:
        self.spec = spec

    def label(self) -> str:
        return self.spec.name

    def match(self, graph: Graph) -> Iterable[Match]:
        out = []
        for chain in graph.chains([s.op for s in self.spec.sequence]):
            if all(self._fits(graph, n, s) for n, s in zip(chain, self.spec.sequence, strict=True)):
                out.append([n.name for n in chain])
        return out

    @staticmethod
    def _fits(graph: Graph, node: Node, step) -> bool:
        for key, want in step.attrs.items():
            have = node.attrs.get(key)
            if isinstance(have, bytes):
                have = have.decode()
            if isinstance(have, list | tuple):
                have = list(have)
            if have != want:
                return False
        if step.shape is not None:
            shape = graph.shape(node.outputs[0]) or ()
            size = 1
            for d in shape:
                size *= d
            c = step.shape
            if c.rank is not None and len(shape) != c.rank:
                return False
            if c.min_elements is not None and size < c.min_elements:
                return False
            if c.max_elements is not None and size > c.max_elements:
                return False
        return True
