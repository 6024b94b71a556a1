"""Small configurations of every zoo model, shared by the zoo tests.

They match the tiny PyTorch modules of scripts/export_torch_fixtures.py, so a zoo model built
from one of them can be compared op for op with the real export in tests/data/torch_exports/.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parents[2] / "data" / "torch_exports"

_TRANSFORMER = {
    "num_layers": 2,
    "hidden": 32,
    "heads": 2,
    "seq_len": 16,
    "batch": 2,
    "vocab": 64,
    "max_positions": 32,
}

#: zoo name -> (fixture stem, builder kwargs)
SMALL: dict[str, tuple[str, dict[str, Any]]] = {
    "mlp": ("mlp", {"in_features": 64, "hidden": (32, 16), "num_classes": 10, "batch": 2}),
    "resnet50": (
        "resnet",
        {"image_size": 32, "width": 4, "layers": (1, 1, 1, 1), "num_classes": 10, "batch": 2},
    ),
    "mobilenet_v2": (
        "mobilenet_v2",
        {
            "width_mult": 0.25,
            "image_size": 32,
            "num_classes": 10,
            "batch": 2,
            "setting": [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 2, 2)],
            "last_channel": 160,
        },
    ),
    "bert_base": ("bert", dict(_TRANSFORMER)),
    "gpt2": ("gpt2", dict(_TRANSFORMER)),
    "vit_b16": (
        "vit",
        {
            "image_size": 32,
            "patch": 8,
            "num_layers": 2,
            "hidden": 32,
            "heads": 2,
            "num_classes": 10,
            "batch": 2,
        },
    ),
}
