"""graph-autofusion: an operator-fusion compiler for ONNX models.

    import graph_autofusion as gaf
    fused = gaf.fuse("model.onnx")            # plan + export; fused.model is an onnx.ModelProto
    outputs = fused({"input": x})             # compile the kernels for the host CPU and run them
    print(fused.report()["kernels"])

The public surface is what `__all__` lists; everything else is private and may change.
Heavy submodules load on first use so that `import graph_autofusion` stays fast for the CLI.
"""

from __future__ import annotations

import importlib
from typing import Any

from .config import FusionConfig, PatternSpec
from .errors import (
    CompilationError,
    FusionError,
    InvalidConfigError,
    InvalidModelError,
    ModelTooLargeError,
    RuntimeInputError,
    UnboundDimensionError,
    UnsupportedModelError,
    VerificationError,
)

__version__ = "0.1.0"

_LAZY = {
    "fuse": "graph_autofusion.api",
    "Fuser": "graph_autofusion.api",
    "FusedGraph": "graph_autofusion.api",
    "Pattern": "graph_autofusion.plan.patterns",
    "load": "graph_autofusion.backend.cpu.bundle",
    "zoo": "graph_autofusion.zoo",
}

__all__ = [
    "CompilationError",
    "FusedGraph",
    "Fuser",
    "FusionConfig",
    "FusionError",
    "InvalidConfigError",
    "InvalidModelError",
    "ModelTooLargeError",
    "Pattern",
    "PatternSpec",
    "RuntimeInputError",
    "UnboundDimensionError",
    "UnsupportedModelError",
    "VerificationError",
    "__version__",
    "fuse",
    "load",
    "zoo",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'graph_autofusion' has no attribute {name!r}")
    if name == "zoo":
        return importlib.import_module(module)
    return getattr(importlib.import_module(module), name)
