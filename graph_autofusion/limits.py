"""Resource guards that need the canonical graph's static shapes: refuse before allocating.

The loader refuses on bytes and node counts (what can be judged before parsing); what a model will
*allocate* is only known once every tensor has a static shape, i.e. after canonicalization binds
`input_shapes` and infers the rest. `check_activation_bytes` runs right there, before planning,
compiling, verification or any runtime arena, so a model that asks for 200 GiB of activations is a
`model_too_large` refusal rather than an out-of-memory kill of a worker. One part is checked even
earlier: `check_input_bytes` judges the inputs' bound sizes before canonicalization, which may run
the model in onnxruntime to measure shapes ONNX cannot infer.

The measure is the peak of live activation bytes when the canonical graph runs one node at a time
in graph order (`plan.memory.live_profile`, the report's `peak_memory_bytes.before`): that is what
the unfused reference run needs, and fusion only lowers it. Weights are excluded (the loader's
`max_model_bytes` bounds them).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from .config import FusionConfig
from .errors import ModelTooLargeError
from .ir import Graph
from .plan.memory import live_profile


def check_input_bytes(model: onnx.ModelProto, config: FusionConfig) -> int:
    """Refuse inputs that alone exceed the limit, before canonicalization runs anything.

    Canonicalization may execute the model in onnxruntime to measure shapes ONNX cannot infer,
    which allocates at least the inputs; so the inputs' bound sizes are checked first. Inputs
    whose dims stay unknown here are left to `bind_shapes` (which refuses them precisely).
    """
    inits = {t.name for t in model.graph.initializer}
    inputs = [vi for vi in model.graph.input if vi.name not in inits and vi.type.HasField("tensor_type")]
    symbols: dict[str, int] = {}
    for vi in inputs:
        dims = vi.type.tensor_type.shape.dim
        bound = config.input_shapes.get(vi.name)
        if bound is not None and len(bound) == len(dims):
            symbols.update({d.dim_param: v for d, v in zip(dims, bound, strict=True) if d.dim_param})
    total = 0
    biggest: tuple[str, list[int], str, int] = ("", [], "", 0)  # name, shape, dtype, bytes
    for vi in inputs:
        tensor = vi.type.tensor_type
        shape = config.input_shapes.get(vi.name) or [
            d.dim_value if d.HasField("dim_value") else symbols.get(d.dim_param, 0) for d in tensor.shape.dim
        ]
        if any(d <= 0 for d in shape) or tensor.elem_type == onnx.TensorProto.UNDEFINED:
            continue  # unknown dims: bind_shapes refuses them (unbound_dimension)
        dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
        total += nbytes
        if nbytes > biggest[3]:
            biggest = (vi.name, list(shape), dtype.name, nbytes)
    limit = config.max_activation_bytes
    if total > limit:
        name, shape, dtype_name, nbytes = biggest
        raise ModelTooLargeError(
            f"the model's inputs alone need {_gib(total)} ({total:,} bytes), over the limit of "
            f"{_gib(limit)} ({limit:,} bytes, config.max_activation_bytes); the largest is {name!r} "
            f"{shape} {dtype_name}, {_gib(nbytes)}. Bind smaller input shapes (input_shapes) or raise "
            "the limit.",
            code="model_too_large",
            activation_bytes=total,
            limit=limit,
            tensor=name,
            tensor_shape=shape,
            tensor_bytes=nbytes,
        )
    return total


def _gib(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB" if n >= 1024**3 else f"{n / 1024**2:.1f} MiB"


def check_activation_bytes(graph: Graph, config: FusionConfig) -> int:
    """Return the peak activation bytes, or raise `model_too_large` naming the biggest tensor."""
    schedule = [frozenset({i}) for i in range(len(graph.nodes))]
    live = live_profile(graph, schedule) if schedule else np.zeros(1, dtype=np.int64)
    inputs = sum(graph.values[n].nbytes for n in graph.inputs)
    peak = max(int(live.max()), inputs)
    limit = config.max_activation_bytes
    if peak <= limit:
        return peak
    activations = [v for v in graph.values.values() if v.is_activation and v.shape is not None]
    big = max(activations, key=lambda v: v.nbytes)
    dtype = helper.tensor_dtype_to_np_dtype(big.elem_type).name if big.elem_type else "?"
    step = int(live.argmax())
    at = graph.nodes[step].name if graph.nodes else "(inputs)"
    raise ModelTooLargeError(
        f"the model's activations need {_gib(peak)} ({peak:,} bytes) at their peak (at node {at!r}, "
        f"unfused, graph order), over the limit of {_gib(limit)} ({limit:,} bytes, "
        f"config.max_activation_bytes); the largest tensor is {big.name!r} {list(big.shape)} {dtype}, "
        f"{_gib(big.nbytes)}. Bind smaller input shapes (input_shapes) or raise the limit.",
        code="model_too_large",
        activation_bytes=peak,
        limit=limit,
        tensor=big.name,
        tensor_shape=list(big.shape),
        tensor_bytes=big.nbytes,
    )
