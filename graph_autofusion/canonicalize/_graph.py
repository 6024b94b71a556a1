"""The mutable graph the canonicalization passes share.

Why not edit a `ModelProto` in place: deleting from a protobuf repeated field is O(n) per call, and
every copy or serialization of a model drags its weights along (seconds for a BERT-base with the
upb runtime).  So the passes work on plain Python lists and dicts — nodes are small copies, while
initializers stay the *source* model's TensorProtos (never mutated) until `to_model` writes the
result once.  New constants are stored as TensorProtos too; numpy views are made only on demand.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import TypeVar

import numpy as np
from onnx import (
    GraphProto,
    ModelProto,
    NodeProto,
    TensorProto,
    TypeProto,
    ValueInfoProto,
    helper,
    numpy_helper,
)

from ..onnx_utils import (
    LIGHT_MAX_BYTES,
    copy_fields,
    copy_messages,
    default_opset,
    iter_graphs,
    node_inputs,
    subgraphs,
    tensor_nbytes,
    unique_name,
)

_Message = TypeVar("_Message", NodeProto, ValueInfoProto, TypeProto)

DEFAULT_DOMAINS = ("", "ai.onnx")


def _copy(message: _Message) -> _Message:
    duplicate = type(message)()
    duplicate.CopyFrom(message)
    return duplicate


class WorkGraph:
    """Nodes, graph inputs/outputs, constants and known tensor types of the model being rewritten."""

    def __init__(self, model: ModelProto) -> None:
        self.source = model
        graph = model.graph
        self.ir_version = model.ir_version
        self.initializers: dict[str, TensorProto] = {t.name: t for t in graph.initializer}
        self.source_initializers = frozenset(self.initializers)
        inputs = list(graph.input)
        if self.ir_version < 4:
            # Before IR 4 every initializer had to be listed as an input too; that listing did not
            # make it overridable, so drop it (and write IR 4) to let those weights fold.
            inputs = [i for i in inputs if i.name not in self.initializers]
            self.ir_version = 4
        self.inputs: list[ValueInfoProto] = [_copy(i) for i in inputs]
        self.input_names = frozenset(i.name for i in self.inputs)  # the inputs never change names
        self.outputs: list[ValueInfoProto] = [_copy(o) for o in graph.output]
        self.nodes: list[NodeProto] = [_copy(n) for n in graph.node]
        self.opset = default_opset(model) or 0
        self.opset_imports = [(o.domain, o.version) for o in model.opset_import]
        self.types: dict[str, TypeProto] = {}
        for info in graph.value_info:
            self.types[info.name] = _copy(info.type)
        for info in self.inputs:
            self.types[info.name] = _copy(info.type)
        for tensor in self.initializers.values():
            self.types[tensor.name] = helper.make_tensor_type_proto(tensor.data_type, tensor.dims)
        self._arrays: dict[str, np.ndarray] = {}
        self._added: list[str] = []  # initializer names created by passes, in creation order
        self._taken: set[str] | None = None

    # -- names ----------------------------------------------------------------------------------

    @property
    def output_names(self) -> list[str]:
        return [o.name for o in self.outputs]

    def fresh_name(self, base: str) -> str:
        """A tensor name used nowhere in the graph yet."""
        if self._taken is None:
            taken = set(self.initializers) | self.input_names | set(self.output_names)
            for node in self.nodes:
                taken.update(node.input)
                taken.update(node.output)
                for sub in subgraphs(node):  # ONNX forbids shadowing outer names in subgraphs
                    for graph in iter_graphs(sub):
                        taken.update(i.name for i in graph.input)
                        taken.update(t.name for t in graph.initializer)
                        for inner in graph.node:
                            taken.update(inner.output)
            self._taken = taken
        return unique_name(base, self._taken)

    def forget_names(self) -> None:
        """Drop the cache of taken names (after replacing nodes wholesale)."""
        self._taken = None

    def set_default_opset(self, version: int) -> None:
        """Declare the default domain at `version` (after a pass rewrote the nodes to it)."""
        others = [(d, v) for d, v in self.opset_imports if d not in DEFAULT_DOMAINS]
        self.opset_imports = [("", version), *others]
        self.opset = version

    # -- constants ------------------------------------------------------------------------------
    def is_constant(self, name: str) -> bool:
        """True for initializers that a caller cannot override by feeding a graph input."""
        return name in self.initializers and name not in self.input_names

    def array(self, name: str) -> np.ndarray:
        """The value of a constant as a read-only numpy array (cached, made once)."""
        value = self._arrays.get(name)
        if value is None:
            value = numpy_helper.to_array(self.initializers[name])
            self._arrays[name] = value
        return value

    def set_constant(self, name: str, value: np.ndarray | TensorProto) -> None:
        """Make `name` an initializer holding `value` (an array, or a tensor to copy under that name)."""
        if isinstance(value, TensorProto):
            tensor = TensorProto()
            tensor.CopyFrom(value)
            tensor.name = name
        else:
            value = np.asarray(value, order="C")  # not ascontiguousarray: it makes scalars 1-D
            tensor = numpy_helper.from_array(value, name)
            self._arrays[name] = value
        if name not in self.initializers:
            self._added.append(name)
        if isinstance(value, TensorProto):
            self._arrays.pop(name, None)
        self.initializers[name] = tensor
        self.types[name] = helper.make_tensor_type_proto(tensor.data_type, tensor.dims)

    def drop_initializer(self, name: str) -> None:
        self.initializers.pop(name, None)
        self._arrays.pop(name, None)

    # -- structure ------------------------------------------------------------------------------
    def replace_each(self, op_type: str, rewrite: Callable[[NodeProto], list[NodeProto] | None]) -> int:
        """Offer every default-domain `op_type` node to `rewrite`, splicing in the nodes it returns
        (None keeps the node); returns how many were replaced.

        The one driver of the local-rewrite passes, so each pass states only its rule. Nodes are
        visited in order and a replacement keeps its predecessor's place, so topological order holds.
        """
        nodes: list[NodeProto] = []
        replaced = 0
        for node in self.nodes:
            found = rewrite(node) if node.op_type == op_type and node.domain in DEFAULT_DOMAINS else None
            if found is None:
                nodes.append(node)
                continue
            nodes.extend(found)
            replaced += 1
        self.nodes = nodes
        return replaced

    def producers(self) -> dict[str, NodeProto]:
        return {out: node for node in self.nodes for out in node.output if out}

    def consumers(self) -> dict[str, list[NodeProto]]:
        """Readers of each name, counting subgraph references from the outer scope."""
        readers: dict[str, list[NodeProto]] = defaultdict(list)
        for node in self.nodes:
            for name in node_inputs(node):
                readers[name].append(node)
        return readers

    # -- output ---------------------------------------------------------------------------------
    def to_model(self, *, light: bool = False, final: bool = False) -> ModelProto:
        """Write the graph as a ModelProto.

        `light`: initializers over LIGHT_MAX_BYTES become typed graph inputs (for the checker and
        shape inference).  `final`: graph outputs and value_info take the inferred static types;
        otherwise outputs keep their declared types, so inference checks them against its own.
        """
        model = ModelProto()
        copy_fields(self.source, model, skip=("graph", "opset_import"))
        model.opset_import.extend(helper.make_opsetid(d, v) for d, v in self.opset_imports)
        model.ir_version = self.ir_version
        graph: GraphProto = model.graph
        copy_fields(self.source.graph, graph, skip=("node", "input", "output", "initializer", "value_info"))
        copy_messages(self.nodes, graph.node)
        copy_messages(self.inputs, graph.input)
        for output in self.outputs:
            info = graph.output.add()
            info.CopyFrom(output)
            if final and output.name in self.types:
                info.type.CopyFrom(self.types[output.name])
        outputs = set(self.output_names)
        for node in self.nodes:
            for name in node.output:
                if name and name not in outputs and name in self.types:
                    info = graph.value_info.add()
                    info.name = name
                    info.type.CopyFrom(self.types[name])
        for name in self._initializer_order():
            tensor = self.initializers[name]
            if light and tensor_nbytes(tensor) > LIGHT_MAX_BYTES:
                if name not in self.input_names:
                    graph.input.append(helper.make_tensor_value_info(name, tensor.data_type, tensor.dims))
            else:
                graph.initializer.add().CopyFrom(tensor)
        return model

    def _initializer_order(self) -> list[str]:
        added = set(self._added)
        order = [t.name for t in self.source.graph.initializer if t.name in self.initializers]
        order = [n for n in order if n not in added]
        order.extend(n for n in self._added if n in self.initializers)
        return order


def rename_in_graph(graph: GraphProto, old: str, new: str) -> None:
    """Rename outer-scope reads of `old` inside a subgraph (stopping where the subgraph shadows it)."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    if old in defined:
        return
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new
        for sub in subgraphs(node):
            rename_in_graph(sub, old, new)
        if old in node.output:
            return
    for output in graph.output:
        if output.name == old:
            output.name = new


def transpose_perm(layout: NodeProto, rank: int) -> list[int]:
    """A Transpose's permutation; without `perm` it reverses the axes."""
    for attr in layout.attribute:
        if attr.name == "perm":
            return [int(p) for p in attr.ints]
    return list(reversed(range(rank)))
