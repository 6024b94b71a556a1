"""Pass `shape_inference`: a static shape and element type for every tensor of the main graph.

ONNX shape inference (strict, with data propagation so Shape→Gather→Concat chains resolve) runs on a
light copy of the model, so it costs milliseconds even for a model with hundreds of MB of weights.
Tensors it cannot resolve (outputs of ops without a schema, data-dependent ops) get one more chance:
onnxruntime runs the model once on all-ones and once on all-zeros inputs of the bound shapes and we
read the shapes off — accepted only when both runs agree, since a disagreement means the shape
depends on the data and no static shape exists.

`infer_node` types a single node the same way, for constant folding to call as it sweeps: ONNX
inference reads the *values* of some inputs (Slice starts/ends, Expand and Tile targets, Range
bounds) only from initializers, not from data propagation, so a whole-graph run stops at the first
such node fed by a not-yet-folded Shape chain.  In a transformer that is every layer's causal-mask
Slice, and each whole-graph run would get exactly one layer further.  Inferring node by node while
folding in topological order gets past all of them in one sweep.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import onnx
from onnx import NodeProto, TensorProto, TypeProto, helper

from ..errors import InvalidModelError, UnsupportedModelError
from ..onnx_utils import LIGHT_MAX_BYTES, has_subgraph, static_shape, tensor_nbytes
from ._graph import DEFAULT_DOMAINS, WorkGraph


def infer_shapes(work: WorkGraph) -> None:
    """Run ONNX shape inference and record every inferred type in `work.types`."""
    light = work.to_model(light=True)
    try:
        inferred = onnx.shape_inference.infer_shapes(light, check_type=True, strict_mode=True, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as exc:
        raise InvalidModelError(
            f"ONNX shape inference rejects the model: {str(exc).strip()}",
            code="invalid_graph",
        ) from exc
    for info in list(inferred.graph.value_info) + list(inferred.graph.output):
        known = work.types.get(info.name)
        if known is None or _replaceable(known):
            work.types[info.name] = info.type


def infer_node(work: WorkGraph, node: NodeProto) -> int:
    """Record static types for the outputs of one node of the default domain; returns how many.

    Only worth calling, and only attempted, when every input has a static type and some output
    lacks one.  Constant inputs up to LIGHT_MAX_BYTES are handed over as values, as the light model
    of `infer_shapes` would.  Anything ONNX cannot type here is left to `infer_shapes`, which also
    re-checks what this records against the declared outputs.
    """
    if node.domain not in DEFAULT_DOMAINS or has_subgraph(node):
        return 0
    if all(_is_static(work.types.get(name)) for name in node.output if name):
        return 0
    input_types: dict[str, TypeProto] = {}
    input_data: dict[str, TensorProto] = {}
    for name in node.input:
        if not name:
            continue
        type_proto = work.types.get(name)
        if not _is_static(type_proto):
            return 0
        input_types[name] = type_proto
        if work.is_constant(name) and tensor_nbytes(work.initializers[name]) <= LIGHT_MAX_BYTES:
            input_data[name] = work.initializers[name]
    schema = _schema(node.op_type, work.opset)
    if schema is None:
        return 0
    try:
        inferred = onnx.shape_inference.infer_node_outputs(
            schema,
            node,
            input_types,
            input_data,
            opset_imports=[helper.make_opsetid("", work.opset)],
            ir_version=work.ir_version,
        )
    except Exception:  # onnx raises several untyped errors; the whole-graph run reports real faults
        return 0
    recorded = 0
    for name, type_proto in inferred.items():
        known = work.types.get(name)
        if _is_static(type_proto) and (known is None or _replaceable(known)):
            work.types[name] = type_proto
            recorded += 1
    return recorded


@lru_cache(maxsize=1024)
def _schema(op_type: str, opset: int) -> onnx.defs.OpSchema | None:
    """The default-domain schema in force at `opset`, if it has an inference function."""
    try:
        schema = onnx.defs.get_schema(op_type, opset, "")
    except onnx.defs.SchemaError:
        return None
    return schema if schema.has_type_and_shape_inference_function else None


def _is_static(type_proto: TypeProto | None) -> bool:
    """A tensor type with an element type and fully known dims."""
    if type_proto is None or not type_proto.tensor_type.elem_type:
        return False
    return static_shape(type_proto) is not None


def _replaceable(old: TypeProto) -> bool:
    """Whether an inferred type may replace `old`: anything but a complete static type may go."""
    return not _is_static(old)


def unknown_tensors(work: WorkGraph) -> list[str]:
    """Names of main-graph tensors still lacking a static shape or element type (in node order).

    Non-tensor values (sequences, optionals, maps) have no shape to speak of and are left alone.
    """
    missing = []
    for node in work.nodes:
        for name in node.output:
            if not name:
                continue
            type_proto = work.types.get(name)
            if type_proto is not None and type_proto.WhichOneof("value") not in (None, "tensor_type"):
                continue
            if type_proto is None or not type_proto.tensor_type.elem_type or static_shape(type_proto) is None:
                missing.append(name)
    return missing


def shapes_from_onnxruntime(work: WorkGraph, names: list[str]) -> int:
    """Fill the types of `names` by running onnxruntime on ones and zeros; returns how many were set.

    Raises `UnsupportedModelError(code="unknown_shape")` naming a tensor it cannot resolve.
    """
    import onnxruntime as ort  # deferred: only models with ops ONNX cannot infer pay for it

    model = work.to_model()
    graph = model.graph
    declared = set(work.output_names)
    for name in names:
        if name not in declared:
            graph.output.add().name = name
    del graph.value_info[:]
    feeds_ones, feeds_zeros = {}, {}
    for info in work.inputs:
        if info.name in work.initializers:
            continue
        shape = static_shape(info.type) or ()
        dtype = helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type)
        feeds_ones[info.name] = np.ones(shape, dtype=dtype)
        feeds_zeros[info.name] = np.zeros(shape, dtype=dtype)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    try:
        session = ort.InferenceSession(
            model.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"]
        )
        wanted = [o.name for o in session.get_outputs()]
        ones = dict(zip(wanted, session.run(wanted, feeds_ones), strict=True))
        zeros = dict(zip(wanted, session.run(wanted, feeds_zeros), strict=True))
    except Exception as exc:  # onnxruntime raises its own untyped errors for many reasons
        raise UnsupportedModelError(
            f"the shape of tensor {names[0]!r} cannot be inferred statically and onnxruntime could not "
            f"run the model to measure it ({str(exc).strip().splitlines()[0][:300]}).",
            code="unknown_shape",
            tensor=names[0],
        ) from exc
    for name in names:
        a, b = ones.get(name), zeros.get(name)
        if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray) or a.shape != b.shape:
            raise UnsupportedModelError(
                f"tensor {name!r} has no static shape: its shape depends on the input values "
                "(a data-dependent op such as NonZero); such models cannot be fused.",
                code="unknown_shape",
                tensor=name,
            )
        work.types[name] = helper.make_tensor_type_proto(helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
    return len(names)
