"""From a fused group to kernel IR: one module per kind of kernel.

    values.py     a tensor's value at an index: the index rule of every op a loop nest inlines
    pointwise.py  elementwise / broadcast / injective groups as one loop nest

Lowering imports the IR and the op registry, never a backend: every target renders what it makes.
"""

from .values import Unsupported

__all__ = ["Unsupported"]
