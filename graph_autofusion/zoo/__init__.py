"""The model zoo: ONNX models that look like `torch.onnx.export` output, built offline.

    from graph_autofusion import zoo
    model = zoo.build("bert_base", num_layers=2, hidden=64, heads=4, seq_len=16)
    model = zoo.build("gpt2", **zoo.TINY["gpt2"])             # the small variant tests use
    model = zoo.build("resnet50", style="dynamo", dynamic_batch=True)
    inputs = zoo.example_inputs(model, bind={"batch": 4})   # valid ids, masks and images

Each builder's defaults are the real architecture; every size is a keyword so that tests can
build small variants.  Weights are random (`numpy.random.default_rng(seed)`, fp32, scaled so
activations stay finite), so nothing is downloaded, and the same arguments give a byte-identical
model.  `style` picks the exporter being imitated:

- ``"torchscript"`` (opset 13-17, default 17): Constant nodes, Shape→Gather→Unsqueeze→Concat
  reshape targets, LayerNormalization decomposed below opset 17, a few Dropout/Identity nodes;
- ``"dynamo"`` (opset 18-21, default 18): constants as initializers, constant reshape targets,
  ReduceMean with axes as an input, value_info on every intermediate.

`dynamic_batch=True` makes the batch dim (and BERT/GPT-2's sequence dim) a symbolic `dim_param`
("batch", "sequence").  Conv nets keep BatchNormalization unless `fold_batchnorm=True`.

Fidelity (tests/graph_autofusion/zoo/test_zoo_fidelity.py, against real torch 2.13 exports):
dynamo-style graphs have the same op-type histogram as the real export; TorchScript-style graphs
have the same compute ops and keep the shape chains an export with dynamic axes keeps (a static
export folds them to constants).  Two deliberate departures, so the engine has work to do: real
eval-mode exports fold BatchNormalization into Conv, and drop Dropout.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import onnx

from .arguments import UnknownZooModelError, ZooArgumentError
from .bert import bert_base
from .gpt2 import gpt2
from .inputs import example_inputs
from .mlp import mlp
from .mobilenet import mobilenet_v2
from .resnet import resnet50
from .vit import vit_b16

MODELS: dict[str, Callable[..., onnx.ModelProto]] = {
    "resnet50": resnet50,
    "mobilenet_v2": mobilenet_v2,
    "bert_base": bert_base,
    "gpt2": gpt2,
    "vit_b16": vit_b16,
    "mlp": mlp,
}

_TINY_TRANSFORMER = {
    "num_layers": 2,
    "hidden": 32,
    "heads": 2,
    "seq_len": 16,
    "batch": 2,
    "vocab": 64,
    "max_positions": 32,
}

#: Small variants for tests and CI (each builds in milliseconds and runs in onnxruntime in well
#: under a second): ``build(name, **TINY[name])``.  They match the tiny PyTorch modules whose real
#: exports are the zoo's fidelity fixtures (scripts/export_torch_fixtures.py).
TINY: dict[str, dict[str, Any]] = {
    "resnet50": {"image_size": 32, "width": 4, "layers": (1, 1, 1, 1), "num_classes": 10, "batch": 2},
    "mobilenet_v2": {
        "width_mult": 0.25,
        "image_size": 32,
        "num_classes": 10,
        "batch": 2,
        "setting": ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 2, 2)),
        "last_channel": 160,
    },
    "bert_base": dict(_TINY_TRANSFORMER),
    "gpt2": dict(_TINY_TRANSFORMER),
    "vit_b16": {
        "image_size": 32,
        "patch": 8,
        "num_layers": 2,
        "hidden": 32,
        "heads": 2,
        "num_classes": 10,
        "batch": 2,
    },
    "mlp": {"in_features": 64, "hidden": (32, 16), "num_classes": 10, "batch": 2},
}


def build(name: str, **kwargs: Any) -> onnx.ModelProto:
    """Build zoo model `name` with the builder's keyword arguments.

    Raises `UnknownZooModelError` (a `KeyError`) for a name not in `MODELS`, and
    `ZooArgumentError` (a `ValueError`) for an argument that is out of range.
    """
    try:
        builder = MODELS[name]
    except (KeyError, TypeError):
        raise UnknownZooModelError(
            f"unknown zoo model {name!r}; available: {', '.join(sorted(MODELS))}",
            name=str(name),
            available=sorted(MODELS),
        ) from None
    try:
        return builder(**kwargs)
    except TypeError as exc:  # an unknown keyword: say which builder and what it accepts
        raise ZooArgumentError(f"{name}: {exc}", argument=None) from exc


__all__ = [
    "MODELS",
    "TINY",
    "UnknownZooModelError",
    "ZooArgumentError",
    "bert_base",
    "build",
    "example_inputs",
    "gpt2",
    "mlp",
    "mobilenet_v2",
    "resnet50",
    "vit_b16",
]
