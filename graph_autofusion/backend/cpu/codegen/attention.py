"""The `attention` template in C: the kernel IR of graph_autofusion.lower.attention, rendered."""

from __future__ import annotations

from ....kernel_ir import Call, If, Loop, Stmt
from ....lower.attention import lower_attention
from ..blas import BLAS_PREAMBLE
from ..kernel_spec import KernelSpec
from ..render_c import render_kernel

__all__ = ["emit_attention"]


def emit_attention(spec: KernelSpec) -> tuple[str, bool]:
    """C source for an attention-template kernel, and whether it calls BLAS (the lowering calls
    sgemm for the two contractions where the operands' rows are unit-stride)."""
    kernel = lower_attention(spec)
    blas = _calls(kernel.body)
    source = render_kernel(kernel)
    return (BLAS_PREAMBLE + source if blas else source), blas


def _calls(body: tuple[Stmt, ...]) -> bool:
    for s in body:
        if isinstance(s, Call):
            return True
        if isinstance(s, Loop) and _calls(s.body):
            return True
        if isinstance(s, If) and (_calls(s.then) or _calls(s.otherwise)):
            return True
    return False
