"""The `pointwise` template in C: the kernel IR of graph_autofusion.lower.pointwise, rendered."""

from __future__ import annotations

from ....lower.pointwise import lower_pointwise
from ..kernel_spec import KernelSpec
from ..render_c import render_kernel


def emit_pointwise(spec: KernelSpec, description: str = "") -> str:
    """C source for a pointwise kernel (also pooling and single ops whose rules fold an axis)."""
    return render_kernel(lower_pointwise(spec, description))
