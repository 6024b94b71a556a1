"""`GraphBuilder`: the shared machinery every zoo model is written against.

It holds what differs between the two exporter styles the zoo imitates, so model code reads like
the PyTorch module it mirrors and says each op once:

- constants: the TorchScript exporter emits `Constant` nodes for small constants; the dynamo
  exporter (after its optimizer) turns every constant into an initializer;
- reshape targets: TorchScript computes them from `Shape → Gather → Unsqueeze → Concat` chains
  (what an export with dynamic axes keeps); dynamo uses a constant shape initializer, or
  `Shape(start, end)` slices of a graph input concatenated with constants when a dim is symbolic;
- naming: `/scope/Op_k` nodes with `..._output_0` tensors for TorchScript, `node_op_k` for dynamo;
- the finished model: IR 8 without value_info (TorchScript), IR 10 with value_info for every
  intermediate (dynamo).

Weights come from one `numpy.random.default_rng(seed)` drawn in program order, so the same
arguments give a byte-identical model.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .arguments import Style

PRODUCER_NAME = "graph_autofusion.zoo"
#: Bumped whenever a builder changes the graphs it emits (recorded as the producer version).
ZOO_VERSION = "1"

#: One entry of a reshape target: a constant size, or (symbol, axis of the reshaped tensor that
#: holds it) for a dim that tracks the input (batch, sequence).
DimSpec = int | tuple[str, int]
ShapeSpec = Sequence[int | str]

_DTYPES = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.bool_): TensorProto.BOOL,
}


class GraphBuilder:
    """Accumulates nodes, initializers and graph inputs/outputs for one model."""

    def __init__(self, *, style: Style, opset: int, seed: int, sizes: dict[str, int], dynamic: Sequence[str]):
        self.style = style
        self.opset = opset
        self.rng = np.random.default_rng(seed)
        #: concrete size of each symbolic dim ("batch", "sequence"), used when it is not dynamic
        self.sizes = dict(sizes)
        #: the symbols that become `dim_param`s in the graph inputs
        self.dynamic = frozenset(dynamic)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._taken: set[str] = set()
        self._counts: Counter[str] = Counter()
        self._scope: list[str] = []
        self._dim_sources: dict[str, tuple[str, int]] = {}
        self._dynamo_dims: dict[str, str] = {}
        self._dynamo_shapes: dict[tuple[DimSpec, ...], str] = {}

    @property
    def torchscript(self) -> bool:
        return self.style == "torchscript"

    # -- naming ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[None]:
        """Name the nodes created inside after a module path, as exporters do (`/layers.0/attn/...`)."""
        self._scope.append(name)
        try:
            yield
        finally:
            self._scope.pop()

    def param(self, local: str) -> str:
        """A parameter's name from the module path of the current scope, e.g. `h.0.attn.c_attn.weight`."""
        return ".".join([*self._scope, local])

    def unique(self, base: str) -> str:
        """A tensor/node name not used before in this graph."""
        name = base
        while name in self._taken:
            self._counts[base] += 1
            name = f"{base}_{self._counts[base]}"
        self._taken.add(name)
        return name

    def _node_names(self, op_type: str, n_outputs: int) -> tuple[str, list[str]]:
        if self.torchscript:
            prefix = "/" + "/".join(self._scope) + "/" if self._scope else "/"
            node = self.unique(f"{prefix}{op_type}")
            return node, [self.unique(f"{node}_output_{i}") for i in range(n_outputs)]
        stem = "_".join([*(s.replace(".", "_") for s in self._scope), op_type.lower()])
        node = self.unique(f"node_{stem}")
        base = node[len("node_") :]
        outs = [self.unique(base if i == 0 else f"{base}_{i}") for i in range(n_outputs)]
        return node, outs

    # -- nodes ----------------------------------------------------------------------------------

    def node(self, op_type: str, inputs: Sequence[str], *, outputs: int = 1, **attrs: Any) -> list[str]:
        """Append one node (attributes given as None are left out) and return its output names."""
        name, outs = self._node_names(op_type, outputs)
        attrs = {k: v for k, v in attrs.items() if v is not None}
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=name, **attrs))
        return outs

    def op(self, op_type: str, *inputs: str, **attrs: Any) -> str:
        """Append a single-output node and return its output's name."""
        return self.node(op_type, inputs, **attrs)[0]

    # -- data -----------------------------------------------------------------------------------

    def initializer(self, name: str, value: np.ndarray) -> str:
        name = self.unique(name)
        array = np.asarray(value)
        if not array.flags.c_contiguous:  # transposed or broadcast views of a drawn weight
            array = array.copy(order="C")
        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def normal(self, shape: Sequence[int], std: float) -> np.ndarray:
        """fp32 N(0, std²) draws from the model's generator."""
        values = self.rng.standard_normal(tuple(shape), dtype=np.float32)
        values *= np.float32(std)
        return values

    def uniform(self, shape: Sequence[int], low: float, high: float) -> np.ndarray:
        return self.rng.uniform(low, high, tuple(shape)).astype(np.float32)

    def weight(self, name: str, shape: Sequence[int], std: float) -> str:
        """A random fp32 parameter initializer named like the module attribute it stands for."""
        return self.initializer(name, self.normal(shape, std))

    def const(self, value: Any, dtype: Any = np.float32) -> str:
        """A small constant: a `Constant` node (TorchScript) or an initializer (dynamo)."""
        array = np.asarray(value, dtype=dtype)
        if self.torchscript:
            name, (out,) = self._node_names("Constant", 1)
            tensor = numpy_helper.from_array(array, f"{out}_value")
            self.nodes.append(helper.make_node("Constant", [], [out], name=name, value=tensor))
            return out
        return self.initializer("val", array)

    def ints(self, values: Sequence[int] | int) -> str:
        """An int64 constant (a 1-D list, or a scalar when given a bare int)."""
        return self.const(values, np.int64)

    # -- graph inputs/outputs -------------------------------------------------------------------

    def _dims(self, dims: ShapeSpec) -> list[int | str]:
        return [d if isinstance(d, int) or d in self.dynamic else self.sizes[d] for d in dims]

    def add_input(self, name: str, dtype: Any, dims: ShapeSpec) -> str:
        """A graph input; string dims are symbols (dim_param when dynamic, else their size)."""
        for axis, d in enumerate(dims):
            if isinstance(d, str):
                self._dim_sources.setdefault(d, (name, axis))
        self._taken.add(name)
        elem = _DTYPES[np.dtype(dtype)]
        self.inputs.append(helper.make_tensor_value_info(name, elem, self._dims(dims)))
        return name

    def add_output(self, tensor: str, name: str, dtype: Any, dims: ShapeSpec) -> None:
        """Make `tensor` a graph output called `name` (renaming it where it is produced and read)."""
        if tensor != name:
            self._taken.add(name)
            for node in self.nodes:
                for field in (node.input, node.output):
                    for i, value in enumerate(field):
                        if value == tensor:
                            field[i] = name
        elem = _DTYPES[np.dtype(dtype)]
        self.outputs.append(helper.make_tensor_value_info(name, elem, self._dims(dims)))

    # -- shape arithmetic -----------------------------------------------------------------------

    def dim(self, symbol: str) -> str:
        """dynamo only: a 1-element int64 tensor holding a symbolic dim, read once from an input."""
        if symbol not in self._dynamo_dims:
            source, axis = self._dim_sources[symbol]
            self._dynamo_dims[symbol] = self.op("Shape", source, start=axis, end=axis + 1)
        return self._dynamo_dims[symbol]

    def shape_of(self, x: str, target: Sequence[DimSpec]) -> str:
        """The int64 shape tensor for `target`; (symbol, axis) entries copy axis `axis` of `x`.

        Only TorchScript reads the dims from `x` itself; dynamo reads symbolic dims from the graph
        input that introduced them, or uses constants when the dims are static.
        """
        if self.torchscript:
            parts = []
            for entry in target:
                if isinstance(entry, tuple):
                    size = self.op("Gather", self.op("Shape", x), self.ints(entry[1]), axis=0)
                    parts.append(self.op("Unsqueeze", size, self.ints([0])))
                else:
                    parts.append(self.ints([entry]))
            return self.op("Concat", *parts, axis=0)
        key = tuple(target)
        if key in self._dynamo_shapes:
            return self._dynamo_shapes[key]
        if not any(isinstance(e, tuple) and e[0] in self.dynamic for e in target):
            shape = self.ints([self.sizes[e[0]] if isinstance(e, tuple) else e for e in target])
        else:
            parts, consts = [], []
            for entry in target:
                if isinstance(entry, tuple) and entry[0] in self.dynamic:
                    if consts:
                        parts.append(self.ints(consts))
                        consts = []
                    parts.append(self.dim(entry[0]))
                else:
                    consts.append(self.sizes[entry[0]] if isinstance(entry, tuple) else entry)
            if consts:
                parts.append(self.ints(consts))
            shape = self.op("Concat", *parts, axis=0)
        self._dynamo_shapes[key] = shape
        return shape

    def reshape(self, x: str, target: Sequence[DimSpec], *, like: str | None = None) -> str:
        """`x.view(*target)` as the exporter writes it; symbolic dims are read from `like` or `x`."""
        return self.reshape_to(x, self.shape_of(like or x, target))

    def reshape_to(self, x: str, shape: str) -> str:
        """Reshape by a shape tensor; `allowzero` exists from opset 14 (dynamo sets it to 1)."""
        allowzero = None if self.opset < 14 else (0 if self.torchscript else 1)
        return self.op("Reshape", x, shape, allowzero=allowzero)

    def expand_shape(self, shape: str) -> str:
        """TorchScript's lowering of a `expand(*sizes)` target: -1 entries become 1 via Where.

        Reshape(shape, [-1]), ConstantOfShape(1), Mul(-1), Equal, Where — kept even when no entry
        is -1, as the exporter does; dynamo passes the shape straight to Expand.
        """
        if not self.torchscript:
            return shape
        flat = self.reshape_to(shape, self.ints([-1]))
        ones = self.op(
            "ConstantOfShape", self.op("Shape", flat), value=numpy_helper.from_array(np.ones(1, np.int64))
        )
        is_minus_one = self.op("Equal", flat, self.op("Mul", ones, self.ints(-1)))
        return self.op("Where", is_minus_one, ones, flat)

    def alias(self, tensor: str) -> str:
        """An Identity, as TorchScript emits for a parameter it deduplicated against another."""
        return self.op("Identity", tensor) if self.torchscript else tensor

    def unsqueeze(self, x: str, axes: Sequence[int]) -> str:
        return self.op("Unsqueeze", x, self.ints(list(axes)))

    def squeeze(self, x: str, axes: Sequence[int]) -> str:
        return self.op("Squeeze", x, self.ints(list(axes)))

    def reduce_mean(self, x: str, axes: Sequence[int], keepdims: int = 1) -> str:
        """ReduceMean with `axes` as an attribute before opset 18 and as an input from 18 on."""
        if self.opset < 18:
            return self.op("ReduceMean", x, axes=list(axes), keepdims=keepdims)
        return self.op("ReduceMean", x, self.ints(list(axes)), keepdims=keepdims, noop_with_empty_axes=0)

    # -- the model ------------------------------------------------------------------------------

    def build(self, graph_name: str, metadata: dict[str, Any]) -> onnx.ModelProto:
        """Assemble the model; dynamo-style models also get value_info for every intermediate."""
        # Filled in place: make_graph + make_model would copy every weight twice.
        model = helper.make_model(
            helper.make_graph([], graph_name, [], []),
            opset_imports=[helper.make_opsetid("", self.opset)],
            producer_name=PRODUCER_NAME,
            producer_version=ZOO_VERSION,
            ir_version=8 if self.torchscript else 10,
            doc_string=f"{graph_name}: random weights, {self.style}-style export at opset {self.opset}",
        )
        graph = model.graph
        graph.node.extend(self.nodes)
        graph.input.extend(self.inputs)
        graph.output.extend(self.outputs)
        graph.initializer.extend(self.initializers)
        helper.set_model_props(
            model,
            {
                "graph_autofusion.zoo.model": graph_name,
                "graph_autofusion.zoo.args": json.dumps(metadata, sort_keys=True, separators=(",", ":")),
            },
        )
        if not self.torchscript:
            model.graph.value_info.extend(self._infer_value_info())
        return model

    def _infer_value_info(self) -> list[onnx.ValueInfoProto]:
        """Shapes of every intermediate, inferred on a weightless copy of the graph.

        Large initializers are declared as inputs instead (inference needs only their shapes), so
        a full-size model is not serialized for it; small ones stay, as shape data propagation
        reads their values (reshape targets).
        """
        small, weights = [], []
        for tensor in self.initializers:
            if int(np.prod(tensor.dims)) <= 64:
                small.append(tensor)
            else:
                weights.append(
                    helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims))
                )
        graph = helper.make_graph(self.nodes, "shapes", [*self.inputs, *weights], self.outputs, small)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)], ir_version=10)
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
        return list(inferred.graph.value_info)
