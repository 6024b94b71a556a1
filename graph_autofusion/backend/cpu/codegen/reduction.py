"""The `reduction` (row) template in C: the kernel IR of graph_autofusion.lower.reduction, rendered."""

from __future__ import annotations

from ....lower.reduction import lower_reduction
from ..kernel_spec import KernelSpec
from ..render_c import render_kernel

__all__ = ["emit_reduction"]


def emit_reduction(spec: KernelSpec) -> str:
    """C source for a reduction-template kernel."""
    return render_kernel(lower_reduction(spec))
