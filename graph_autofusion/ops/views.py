"""View ops: they change only shape metadata, so the runtime aliases the buffer (no kernel)."""

from __future__ import annotations

from .registry import ZERO, OpDef, OpKind, register

for _op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"):
    register(OpDef(_op, OpKind.VIEW, ZERO, description="aliases its input: no kernel"))
