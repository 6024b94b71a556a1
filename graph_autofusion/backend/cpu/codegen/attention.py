"""The `attention` template in C: the kernel IR of graph_autofusion.lower.attention, rendered."""

from __future__ import annotations

from ....kernel_ir import Call, If, Loop, Stmt
from ....lower.attention import lower_attention
from ..contraction import attention_source
from ..kernel_spec import KernelSpec
from ..render_c import render_kernel

__all__ = ["emit_attention"]


def emit_attention(spec: KernelSpec) -> tuple[str, bool]:
    """C source for an attention-template kernel, and whether it calls BLAS (it does not: where
    the operands' rows are unit-stride the lowering calls the attention tiles of the contraction
    library, whose text then heads the kernel)."""
    kernel = lower_attention(spec)
    source = render_kernel(kernel)
    return (attention_source() + "\n" + source if _calls(kernel.body) else source), False


def _calls(body: tuple[Stmt, ...]) -> bool:
    for s in body:
        if isinstance(s, Call):
            return True
        if isinstance(s, Loop) and _calls(s.body):
            return True
        if isinstance(s, If) and (_calls(s.then) or _calls(s.otherwise)):
            return True
    return False
