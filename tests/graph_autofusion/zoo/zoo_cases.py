"""The zoo's tiny configurations paired with the real PyTorch exports they correspond to.

`zoo.TINY` matches the tiny modules of scripts/export_torch_fixtures.py, so a zoo model built from
it can be compared op for op with the real export in tests/data/torch_exports/.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from graph_autofusion import zoo

FIXTURES = Path(__file__).resolve().parents[2] / "data" / "torch_exports"

_STEMS = {
    "mlp": "mlp",
    "resnet50": "resnet",
    "mobilenet_v2": "mobilenet_v2",
    "bert_base": "bert",
    "gpt2": "gpt2",
    "vit_b16": "vit",
}

#: zoo name -> (fixture stem, builder kwargs)
SMALL: dict[str, tuple[str, dict[str, Any]]] = {
    name: (_STEMS[name], dict(kw)) for name, kw in zoo.TINY.items()
}
