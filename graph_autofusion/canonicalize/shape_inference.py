"""Pass `shape_inference`: a static shape and element type for every tensor of the main graph.

ONNX shape inference (strict, with data propagation so Shape→Gather→Concat chains resolve) runs on a
light copy of the model, so it costs milliseconds even for a model with hundreds of MB of weights.
Tensors it cannot resolve (outputs of ops without a schema, data-dependent ops) get one more chance:
onnxruntime runs the model once on all-ones and once on all-zeros inputs of the bound shapes and we
read the shapes off — accepted only when both runs agree, since a disagreement means the shape
depends on the data and no static shape exists.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TypeProto, helper

from ..errors import InvalidModelError, UnsupportedModelError
from ..onnx_utils import static_shape
from ._graph import WorkGraph


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


def _replaceable(old: TypeProto) -> bool:
    """Whether an inferred type may replace `old`: anything but a complete static type may go."""
    old_static = static_shape(old) is not None and bool(old.tensor_type.elem_type)
    return not old_static


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
