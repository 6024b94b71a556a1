"""Resource guards that need the canonical graph's static shapes: refuse before allocating.

The loader refuses on bytes and node counts (what can be judged before parsing); what a model will
*allocate* is only known once every tensor has a static shape, i.e. after canonicalization binds
`input_shapes` and infers the rest. `check_activation_bytes` runs right there, before planning,
compiling, verification or any runtime arena, so a model that asks for 200 GiB of activations is a
`model_too_large` refusal rather than an out-of-memory kill of a worker.

The measure is the peak of live activation bytes when the canonical graph runs one node at a time
in graph order (`plan.memory.live_profile`, the report's `peak_memory_bytes.before`): that is what
the unfused reference run needs, and fusion only lowers it. Weights are excluded (the loader's
`max_model_bytes` bounds them).
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from .config import FusionConfig
from .errors import ModelTooLargeError
from .ir import Graph
from .plan.memory import live_profile


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
