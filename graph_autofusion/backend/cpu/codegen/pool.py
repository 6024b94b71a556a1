"""The `pool` template: MaxPool/AveragePool/LpPool as a direct windowed loop, epilogue fused.

The kernel is the pointwise loop nest over the pooled output (lower/pointwise.py); the pool op's
index rule (lower/values.py) folds its window into one value, and the elementwise epilogue (bias,
activation, ...) is applied to that value before the single store.
"""

from __future__ import annotations

from ..kernel_spec import KernelSpec
from .pointwise import emit_pointwise


def emit_pool(spec: KernelSpec) -> str:
    """C source for a pooling kernel with its epilogue."""
    pools = [n.op_type for n in spec.nodes if n.op_type.endswith("Pool")]
    return emit_pointwise(
        spec, f"direct windowed {'/'.join(pools) or 'pool'} loop, epilogue applied before the store"
    )
