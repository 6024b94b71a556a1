"""The `attention` template in C: the kernel IR of graph_autofusion.lower.attention, rendered."""

from __future__ import annotations

from ....lower.attention import lower_attention
from ..kernel_spec import KernelSpec
from ..render_c import render_kernel

__all__ = ["emit_attention"]


def emit_attention(spec: KernelSpec) -> str:
    """C source for an attention-template kernel."""
    return render_kernel(lower_attention(spec))
