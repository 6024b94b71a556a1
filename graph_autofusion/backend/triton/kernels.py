"""One kernel spec to Triton source: which lowering makes its IR, or which anchor renderer."""

from __future__ import annotations

from ...hardware import HardwareProfile
from ...lower.pointwise import lower_pointwise
from ...lower.reduction import lower_reduction
from ...lower.values import Unsupported
from ...ops.registry import ops_tagged
from ..cpu.kernel_spec import KernelSpec
from .blocks import is_ascend
from .render import RenderedKernel, render_kernel

SINGLE_OPS = ops_tagged("scan")


def render_spec(spec: KernelSpec, profile: HardwareProfile) -> RenderedKernel:
    """The Triton module of `spec` on `profile`'s target; `Unsupported` says why not."""
    template = spec.template
    if template in ("pointwise", "view", "pool"):
        kernel = lower_pointwise(spec)
    elif template == "single":
        if len(spec.nodes) != 1 or spec.nodes[0].op_type not in SINGLE_OPS:
            raise Unsupported(f"no single-op lowering for {[n.op_type for n in spec.nodes]}")
        kernel = lower_pointwise(spec)
    elif template == "reduction":
        kernel = lower_reduction(spec)
    elif template == "attention":
        from .attention import render_attention

        return render_attention(spec, profile)
    elif template in ("anchor", "anchor_chain"):
        from .anchor import render_anchor

        return render_anchor(spec, profile)
    else:
        raise Unsupported(f"unknown template {template!r}")
    return render_kernel(kernel, persistent=is_ascend(profile), narrow_f64=not profile.fp64)
