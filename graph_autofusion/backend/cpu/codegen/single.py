"""`single` kernels: ops outside the fused templates that still compile to a plain loop.

Each is the pointwise loop nest over the op's output whose index rule folds the axis it needs
(lower/values.py: ArgMax/ArgMin scan the reduced axis; CumSum sums the prefix in the same
sequential float order as onnxruntime, so results agree to the bit). Anything else becomes a host
op (see hostops.py).
"""

from __future__ import annotations

from ....ops.registry import ops_tagged
from ..kernel_spec import KernelSpec
from .common import CodegenUnsupported
from .pointwise import emit_pointwise

SINGLE_OPS = ops_tagged("scan")


def emit_single(spec: KernelSpec) -> str:
    """C source for a single-op kernel from SINGLE_OPS."""
    if len(spec.nodes) != 1 or spec.nodes[0].op_type not in SINGLE_OPS:
        raise CodegenUnsupported(f"no single-op generator for {[n.op_type for n in spec.nodes]}")
    return emit_pointwise(
        spec, f"{spec.nodes[0].op_type}: one loop over the output, the op's axis walked inline"
    )
