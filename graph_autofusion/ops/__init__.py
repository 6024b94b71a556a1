"""The op registry: the one place an ONNX op is described.

Each entry gives the op's fusion kind (on the lattice view < elementwise < broadcast < injective <
reduce < anchor < opaque), its cost (flops and bytes from static shapes) and, for scalar ops, the
C expression the CPU backend inlines. Adding an op touches its family module and its test.
Shapes come from ONNX shape inference during canonicalization, so entries carry no shape rules.
"""

from . import anchor, elementwise, injective, opaque, reduce, views  # noqa: F401  (registration)
from .registry import OpCost, OpDef, OpKind, lookup, registered_ops

__all__ = ["OpCost", "OpDef", "OpKind", "lookup", "registered_ops"]
