"""The planner's read-only view of a canonical ONNX graph.

Canonicalization guarantees static shapes for every tensor, so this view resolves each node's op
registry entry, kind and cost once, and indexes producers and consumers. Patterns (built-in and
user-written) match against it; the planner never mutates it — fusion decisions live in a
separate partition, and the exporter writes a new model.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .onnx_utils import node_inputs
from .ops import OpCost, OpDef, OpKind, lookup
from .ops.registry import NodeShapes, numel

Shape = tuple[int, ...]


@dataclass
class Value:
    name: str
    shape: Shape | None
    elem_type: int
    producer: int | None = None  # node index, None for graph inputs and constants
    consumers: list[int] = field(default_factory=list)
    is_const: bool = False
    is_input: bool = False
    is_output: bool = False

    @property
    def itemsize(self) -> int:
        if self.elem_type == onnx.TensorProto.UNDEFINED:
            return 4
        return np.dtype(helper.tensor_dtype_to_np_dtype(self.elem_type)).itemsize

    @property
    def nbytes(self) -> int:
        return numel(self.shape) * self.itemsize if self.shape is not None else 0

    @property
    def is_activation(self) -> bool:
        """Produced or fed at run time (not a weight): what a kernel reads or writes in memory."""
        return not self.is_const


@dataclass
class Node:
    index: int
    proto: onnx.NodeProto
    opdef: OpDef
    attrs: dict[str, object]
    cost: OpCost

    @property
    def name(self) -> str:
        return self.proto.name

    @property
    def op_type(self) -> str:
        return self.proto.op_type

    @property
    def domain(self) -> str:
        return self.proto.domain

    @property
    def kind(self) -> OpKind:
        return self.opdef.kind

    @property
    def inputs(self) -> list[str]:
        return list(self.proto.input)

    @property
    def outputs(self) -> list[str]:
        return list(self.proto.output)

    def __repr__(self) -> str:
        return f"Node({self.index}, {self.op_type}, {self.name!r})"


class Graph:
    """Nodes in topological order with their values; `graph.node(name)` and edges by index."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        g = model.graph
        self.values: dict[str, Value] = {}
        for init in g.initializer:
            self.values[init.name] = Value(init.name, tuple(init.dims), init.data_type, is_const=True)
        for vi in [*g.input, *g.value_info, *g.output]:
            if vi.name in self.values:
                continue
            t = vi.type.tensor_type
            shape = tuple(d.dim_value for d in t.shape.dim) if t.HasField("shape") else None
            self.values[vi.name] = Value(vi.name, shape, t.elem_type)
        for vi in g.input:
            if not self.values[vi.name].is_const:
                self.values[vi.name].is_input = True
        for vi in g.output:
            self.values[vi.name].is_output = True
        self.inputs = [vi.name for vi in g.input if not self.values[vi.name].is_const]
        self.outputs = [vi.name for vi in g.output]
        self.initializers = {init.name: init for init in g.initializer}
        self.nodes: list[Node] = []
        self._by_name: dict[str, Node] = {}
        for i, proto in enumerate(g.node):
            for out in proto.output:
                if out and out not in self.values:
                    self.values[out] = Value(out, None, onnx.TensorProto.UNDEFINED)
                if out:
                    self.values[out].producer = i
            # Outer-scope reads of If/Loop/Scan bodies count as uses: a fused group must not
            # hide a value a subgraph reads, nor be ordered after the node that reads it.
            for inp in node_inputs(proto):
                if inp:
                    self.values.setdefault(
                        inp, Value(inp, None, onnx.TensorProto.UNDEFINED)
                    ).consumers.append(i)
            attrs = {a.name: helper.get_attribute_value(a) for a in proto.attribute}
            opdef = lookup(proto.op_type, proto.domain)
            shapes = NodeShapes(
                inputs=[self.values[x].shape if x else None for x in proto.input],
                outputs=[self.values[x].shape or () for x in proto.output if x],
                itemsizes_in=[self.values[x].itemsize if x else 0 for x in proto.input],
                itemsizes_out=[self.values[x].itemsize for x in proto.output if x],
                attrs=attrs,
            )
            node = Node(i, proto, opdef, attrs, opdef.cost(shapes))
            self.nodes.append(node)
            self._by_name[proto.name] = node

    # -- navigation -------------------------------------------------------------------------
    def node(self, name: str) -> Node:
        return self._by_name[name]

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def producer(self, value: str) -> Node | None:
        v = self.values.get(value)
        return self.nodes[v.producer] if v is not None and v.producer is not None else None

    def consumers(self, value: str) -> list[Node]:
        v = self.values.get(value)
        return [self.nodes[i] for i in v.consumers] if v is not None else []

    def successors(self, node: Node) -> list[Node]:
        seen: dict[int, Node] = {}
        for out in node.outputs:
            for c in self.consumers(out):
                seen.setdefault(c.index, c)
        return list(seen.values())

    def predecessors(self, node: Node) -> list[Node]:
        seen: dict[int, Node] = {}
        for inp in node_inputs(node.proto):
            p = self.producer(inp)
            if p is not None:
                seen.setdefault(p.index, p)
        return list(seen.values())

    def activation_inputs(self, node: Node) -> list[str]:
        return [x for x in node.inputs if x and not self.values[x].is_const]

    def const_value(self, name: str) -> np.ndarray | None:
        init = self.initializers.get(name)
        return numpy_helper.to_array(init) if init is not None else None

    def shape(self, value: str) -> Shape | None:
        return self.values[value].shape

    def sole_consumer(self, node: Node) -> Node | None:
        """The single consumer of a single-output node whose output is not a graph output."""
        outs = [o for o in node.outputs if o]
        if len(outs) != 1 or self.values[outs[0]].is_output:
            return None
        cons = self.values[outs[0]].consumers
        return self.nodes[cons[0]] if len(cons) == 1 else None

    def chains(self, op_types: Iterable[str]) -> list[list[Node]]:
        """All producer→consumer chains matching `op_types` along single-consumer edges."""
        wanted = list(op_types)
        found: list[list[Node]] = []
        for start in self.nodes:
            if wanted[0] not in ("*", start.op_type):
                continue
            chain = [start]
            for op in wanted[1:]:
                nxt = self.sole_consumer(chain[-1])
                if nxt is None or op not in ("*", nxt.op_type):
                    break
                chain.append(nxt)
            if len(chain) == len(wanted):
                found.append(chain)
        return found

    @cached_property
    def kernel_count(self) -> int:
        """Kernels when every non-view op runs alone: the unfused baseline."""
        return sum(1 for n in self.nodes if n.kind != OpKind.VIEW)
