"""The Triton backend: kernels for the `cuda` and `ascend910` targets (docs/targets.md).

render.py    the Triton renderer of the kernel IR (pointwise, row, scalar launches)
prelude.py   math helpers every rendered module carries (tl.math has no tanh, pow, ...)
kernels.py   one kernel spec to Triton source: lowering or anchor renderer
anchor.py    MatMul / Gemm / Conv anchor matches with tl.dot and the fused epilogue
blocks.py    block sizes and grids from the target's hardware profile; Ascend constraints
chains.py    anchor chains split into one kernel per contraction, CPU row stages into their own
ahead.py     CUDA cubins compiled ahead of time, without a GPU
tune.py      block-size autotune on a device, winners stored with the kernels
runtime.py   compile a fused model and run it on numpy inputs (device or interpreter)
"""

from .runtime import TARGETS, TritonCompiledModel, compile_triton, interpreting

__all__ = ["TARGETS", "TritonCompiledModel", "compile_triton", "interpreting"]
