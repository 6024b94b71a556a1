"""Valid example inputs for a zoo model, so callers need not know each model's input rules.

Token ids must stay below the model's vocabulary and attention masks must be 0/1, which random
tensors would not respect; the builder arguments recorded in the model's metadata say what
holds.  Symbolic dims take their value from `bind`, else the size the model was built with.
"""

from __future__ import annotations

import json

import numpy as np
import onnx

from .arguments import ZooArgumentError


def example_inputs(
    model: onnx.ModelProto, *, bind: dict[str, int] | None = None, seed: int = 0
) -> dict[str, np.ndarray]:
    """Inputs for every graph input of a zoo `model`: images ~ N(0, 1), ids in [0, vocab), masks.

    The attention mask is all ones except the last position of the last batch row, as in a
    padded batch, so the masking path computes something.
    """
    props = {p.key: p.value for p in model.metadata_props}
    if "graph_autofusion.zoo.args" not in props:
        raise ZooArgumentError(
            "model was not built by graph_autofusion.zoo (no recorded arguments)", argument="model"
        )
    args = json.loads(props["graph_autofusion.zoo.args"])
    sizes = {"batch": args.get("batch", 1), "sequence": args.get("seq_len", 1), **(bind or {})}
    rng = np.random.default_rng(seed)
    result: dict[str, np.ndarray] = {}
    for value in model.graph.input:
        dims = []
        for d in value.type.tensor_type.shape.dim:
            if d.HasField("dim_value"):
                dims.append(d.dim_value)
            elif d.dim_param in sizes:
                dims.append(int(sizes[d.dim_param]))
            else:
                raise ZooArgumentError(
                    f"no size for symbolic dim {d.dim_param!r}; pass bind=", argument="bind"
                )
        if value.type.tensor_type.elem_type == onnx.TensorProto.INT64:
            if "mask" in value.name:
                mask = np.ones(dims, np.int64)
                if mask.size:
                    mask[-1, -1] = 0
                result[value.name] = mask
            else:
                result[value.name] = rng.integers(0, args["vocab"], dims, dtype=np.int64)
        else:
            result[value.name] = rng.standard_normal(dims).astype(np.float32)
    return result
