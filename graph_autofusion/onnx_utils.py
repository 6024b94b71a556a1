"""Small ONNX helpers shared by the pipeline stages.

They exist because the obvious `onnx` calls are too slow or too blunt for models with large
weights: with the upb protobuf runtime, serializing (or even `ByteSize()` of) a 400 MB model takes
seconds, and `onnx.checker` / `onnx.shape_inference` serialize their argument.  So stages run the
checker and shape inference on a *light* copy of the model whose large initializers are turned into
graph inputs of the same type and shape — structurally the same graph, a few kilobytes to serialize.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
from google.protobuf.message import Message
from onnx import AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto, TypeProto, helper

from .errors import InvalidModelError

#: Initializers at most this large stay in the light model (shape inference needs the values of
#: small constants such as Reshape targets; it never needs the values of weights).
LIGHT_MAX_BYTES = 64 * 1024

_GRAPH_ATTRS = (AttributeProto.GRAPH, AttributeProto.GRAPHS)


def subgraphs(node: NodeProto) -> Iterator[GraphProto]:
    """The graphs held by a node's attributes (the branches of If, the bodies of Loop and Scan)."""
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == AttributeProto.GRAPHS:
            yield from attr.graphs


def has_subgraph(node: NodeProto) -> bool:
    return any(attr.type in _GRAPH_ATTRS for attr in node.attribute)


def iter_graphs(graph: GraphProto) -> Iterator[GraphProto]:
    """`graph` and every graph nested in it, depth first."""
    yield graph
    for node in graph.node:
        for sub in subgraphs(node):
            yield from iter_graphs(sub)


def iter_tensors(model: ModelProto) -> Iterator[TensorProto]:
    """Every TensorProto a model holds: initializers and tensor attributes, in all graphs and functions."""

    def from_nodes(nodes: Iterable[NodeProto]) -> Iterator[TensorProto]:
        for node in nodes:
            for attr in node.attribute:
                if attr.type == AttributeProto.TENSOR:
                    yield attr.t
                elif attr.type == AttributeProto.TENSORS:
                    yield from attr.tensors
                elif attr.type == AttributeProto.SPARSE_TENSOR:
                    yield attr.sparse_tensor.values
                    yield attr.sparse_tensor.indices

    for graph in iter_graphs(model.graph):
        yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield sparse.values
            yield sparse.indices
        yield from from_nodes(graph.node)
    for function in model.functions:
        yield from from_nodes(function.node)
        for node in function.node:
            for sub in subgraphs(node):
                for graph in iter_graphs(sub):
                    yield from graph.initializer
                    yield from from_nodes(graph.node)


def count_nodes(graph: GraphProto) -> int:
    """Nodes of `graph` and of every nested subgraph."""
    return sum(len(g.node) for g in iter_graphs(graph))


def outer_scope_inputs(node: NodeProto) -> set[str]:
    """Names a node's subgraphs read from the enclosing scope (ONNX's implicit inputs)."""
    needed: set[str] = set()
    for graph in subgraphs(node):
        defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
        defined |= {t.values.name for t in graph.sparse_initializer}
        for inner in graph.node:
            needed.update(n for n in inner.input if n and n not in defined)
            needed.update(n for n in outer_scope_inputs(inner) if n not in defined)
            defined.update(inner.output)
        needed.update(o.name for o in graph.output if o.name not in defined)
    return needed


def node_inputs(node: NodeProto) -> list[str]:
    """Every name a node reads: its explicit non-empty inputs plus its subgraphs' outer references."""
    names = [n for n in node.input if n]
    if has_subgraph(node):
        names.extend(sorted(outer_scope_inputs(node) - set(names)))
    return names


def topological_order(nodes: Sequence[NodeProto]) -> list[int]:
    """Indices of `nodes` in a topological order that keeps the given order where it is free to.

    Names nobody produces (graph inputs, initializers, or undefined names the checker reports) count
    as available.  A cycle raises `InvalidModelError(code="graph_cycle")` naming a node on it.
    """
    producer: dict[str, int] = {}
    for index, node in enumerate(nodes):
        for name in node.output:
            if name:
                producer.setdefault(name, index)
    preds: list[set[int]] = []
    succs: list[list[int]] = [[] for _ in nodes]
    for index, node in enumerate(nodes):
        mine = {producer[n] for n in node_inputs(node) if n in producer}
        preds.append(mine)
        for p in mine:
            succs[p].append(index)
    waiting = [len(p) for p in preds]
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for s in succs[index]:
            waiting[s] -= 1
            if waiting[s] == 0:
                heapq.heappush(ready, s)
    if len(order) < len(nodes):
        stuck = next(i for i, w in enumerate(waiting) if w > 0)
        # Every stuck node waits on another stuck node, so walking predecessors must revisit one:
        # that node lies on a cycle (the first stuck node may merely sit downstream of it).
        seen: list[int] = []
        while stuck not in seen:
            seen.append(stuck)
            stuck = next(p for p in preds[stuck] if waiting[p] > 0)
        cycle = seen[seen.index(stuck) :]
        names = [describe_node(nodes[i], i) for i in cycle]
        raise InvalidModelError(
            f"the graph has a cycle: node {names[0]} depends on its own output through "
            f"{' -> '.join(names)}; ONNX graphs must be acyclic, so re-export the model.",
            code="graph_cycle",
            node=nodes[cycle[0]].name,
        )
    return order


def describe_node(node: NodeProto, index: int) -> str:
    """A short human name for a node: its name if it has one, else op type and position."""
    return repr(node.name) if node.name else f"#{index} ({node.op_type})"


def static_shape(type_proto: TypeProto) -> tuple[int, ...] | None:
    """The concrete dims of a tensor type, or None when the rank or any dim is unknown."""
    if type_proto.WhichOneof("value") != "tensor_type" or not type_proto.tensor_type.HasField("shape"):
        return None
    dims = []
    for dim in type_proto.tensor_type.shape.dim:
        if not dim.HasField("dim_value") or dim.dim_value < 0:
            return None
        dims.append(dim.dim_value)
    return tuple(dims)


def tensor_nbytes(tensor: TensorProto) -> int:
    """Size of a tensor's data, from its dims and type when possible.

    Reading `raw_data` copies the bytes (upb hands out a new bytes object each time), so it is
    only consulted for types without a fixed item size.
    """
    expected = expected_nbytes(tensor)
    if expected is not None:
        return expected
    if tensor.HasField("raw_data"):
        return len(tensor.raw_data)
    return sum(len(s) for s in tensor.string_data)


def expected_nbytes(tensor: TensorProto) -> int | None:
    """Bytes a raw_data tensor must hold for its dims and type, or None for strings and packed types."""
    if tensor.data_type == TensorProto.STRING:
        return None
    try:
        dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
        storage = helper.tensor_dtype_to_np_dtype(
            helper.tensor_dtype_to_storage_tensor_dtype(tensor.data_type)
        )
    except (KeyError, TypeError, ValueError):
        return None
    if dtype.itemsize != storage.itemsize or tensor.data_type in _PACKED_TYPES:
        return None
    count = int(np.prod(tensor.dims, dtype=np.int64)) if tensor.dims else 1
    return count * dtype.itemsize


_PACKED_TYPES = {
    getattr(TensorProto, n)
    for n in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2", "FLOAT6E2M3", "FLOAT6E3M2")
    if hasattr(TensorProto, n)
}


def copy_fields(source: object, target: object, skip: Iterable[str]) -> None:
    """Copy every set field of one protobuf message into another of the same type, bar `skip`.

    Used to rebuild a model or graph around new nodes and initializers without copying the weights
    twice (CopyFrom of the whole message would copy them, then we would replace them).
    """
    skipped = set(skip)
    for field, value in source.ListFields():  # type: ignore[attr-defined]
        if field.name in skipped:
            continue
        if field.is_repeated and field.type == field.TYPE_MESSAGE:
            copy_messages(value, getattr(target, field.name))
        elif field.is_repeated:
            getattr(target, field.name).extend(value)
        elif field.type == field.TYPE_MESSAGE:
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)


def copy_messages(messages: Iterable[Message], target: Any) -> None:
    """Append copies of `messages` to a repeated message field.

    `add().CopyFrom()` is several times faster than `extend()`/`append()` with the upb runtime
    (0.25 s instead of ~1 s for BERT-base's 440 MB of weights).
    """
    for message in messages:
        target.add().CopyFrom(message)


def light_model(model: ModelProto, max_bytes: int = LIGHT_MAX_BYTES) -> tuple[ModelProto, int]:
    """A copy of `model` whose initializers over `max_bytes` became graph inputs of the same type.

    Returns the light model and the number of data bytes left out.  The checker and shape inference
    see the same graph structure and every tensor type; only the weight values are missing, which
    neither needs.  Subgraph and function contents are copied as they are.
    """
    light = ModelProto()
    copy_fields(model, light, skip=("graph",))
    graph = light.graph
    copy_fields(model.graph, graph, skip=("initializer",))
    input_names = {i.name for i in model.graph.input}
    left_out = 0
    for tensor in model.graph.initializer:
        size = tensor_nbytes(tensor)
        if size <= max_bytes:
            graph.initializer.add().CopyFrom(tensor)
            continue
        left_out += size
        if tensor.name not in input_names:
            graph.input.append(helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims))
    return light, left_out


def unique_name(base: str, taken: set[str]) -> str:
    """`base`, or `base_1`, `base_2`, … — the first not in `taken`, which it is added to."""
    name, i = base, 0
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    taken.add(name)
    return name


def default_opset(model: ModelProto) -> int | None:
    """The model's opset of the default ONNX domain ('' or 'ai.onnx'), or None if it has none."""
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            return opset.version
    return None
