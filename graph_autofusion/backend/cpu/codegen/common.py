"""What the C-text generators of anchor kernels (gemm, conv, epilogue) share with the rest of
the backend: the one "cannot generate this" exception, attributes, C literals and the prelude.

Every other kernel is lowered to the kernel IR (graph_autofusion.lower) and rendered by
render_c; anchors follow.
"""

from __future__ import annotations

from ....kernel_ir import DType
from ....lower.values import Unsupported, attrs_of
from .. import render_c
from ..render_c import PRELUDE, vector_math_functions

__all__ = ["PRELUDE", "CodegenUnsupported", "attrs_of", "c_literal", "vector_math_functions"]

CodegenUnsupported = Unsupported  # one exception for "this kernel cannot be generated"


def c_literal(value: object, elem_type: int) -> str:
    """A C literal of an ONNX element type (INFINITY/NAN spelled out)."""
    return render_c.c_literal(value, DType.from_onnx(elem_type))
