"""Stage 2 of the pipeline: rewrite a loaded model into the canonical form the planner expects.

    from graph_autofusion.canonicalize import canonicalize
    model, counts = canonicalize(model, config)   # counts: {"constant_folding": 37, ...}

Old-opset forms become the opset-18 ones (one set of op semantics downstream), every tensor gets
a static shape, constants are folded into initializers, BatchNormalization is
folded into the Conv before it, Identity/Dropout and dead code disappear — and the model computes
exactly what it did before.  One module per pass; `pipeline` runs them.
"""

from __future__ import annotations

from .pipeline import PASS_NAMES, canonicalize

__all__ = ["PASS_NAMES", "canonicalize"]
