"""The one "cannot generate this" exception every generator raises. Every kernel is lowered to the
kernel IR (graph_autofusion.lower) and rendered by render_c; no generator writes C of its own
beyond the call sequence of a staged chain (anchor.py)."""

from __future__ import annotations

from ....lower.values import Unsupported

__all__ = ["CodegenUnsupported"]

CodegenUnsupported = Unsupported  # one exception for "this kernel cannot be generated"
