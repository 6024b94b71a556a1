"""The kernel IR: one description of a generated kernel that every backend renders.

    dtypes.py   element types (storage vs compute type)
    nodes.py    expressions, statements, kernels, and the builders that fold as they build
    printer.py  the text form
    visit.py    the walk every renderer shares (per-node dispatch, one local per shared value)
    uses.py     which buffers statements read (a weight read only packed can be released)

Lowering (graph_autofusion.lower) turns a fused group into a `Kernel`; a renderer per target
(backend/cpu/render_c.py, backend/triton/render.py) turns a `Kernel` into source. The IR imports
nothing of the planner.
"""

from .dtypes import DType
from .nodes import (
    Addr,
    Assign,
    Binary,
    Buffer,
    Call,
    Cast,
    Const,
    Declare,
    Expr,
    Fold,
    If,
    Kernel,
    Let,
    Load,
    Loop,
    Raw,
    Select,
    Stmt,
    Store,
    TensorAt,
    Unary,
    Var,
)
from .printer import format_kernel

__all__ = [
    "Addr",
    "Assign",
    "Binary",
    "Buffer",
    "Call",
    "Cast",
    "Const",
    "DType",
    "Declare",
    "Expr",
    "Fold",
    "If",
    "Kernel",
    "Let",
    "Load",
    "Loop",
    "Raw",
    "Select",
    "Stmt",
    "Store",
    "TensorAt",
    "Unary",
    "Var",
    "format_kernel",
]
