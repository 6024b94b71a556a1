"""The `pointwise` template in C: the kernel IR of graph_autofusion.lower.pointwise, rendered.

`loop_nests` serves the row template's degenerate case (nothing left to reduce): the same IR loop
nest, every value computed by that generator's C-text emitter.
"""

from __future__ import annotations

from collections.abc import Sequence

from ....kernel_ir import Buffer, DType
from ....lower.pointwise import KernelValues, loop_nest, lower_pointwise
from ....lower.values import IndexGroup as IRIndexGroup
from ..kernel_spec import KernelSpec
from ..render_c import render_kernel, render_stmts
from .common import IndexGroup, KernelEmitter


def _string_groups(em: KernelEmitter, groups: Sequence[IRIndexGroup]) -> list[IndexGroup]:
    """The IR loop nest's index groups, as the C-text emitter names them."""
    return [
        IndexGroup(tuple(str(em._text(n, None)) for n in g.names), g.dims, str(em._text(g.expr, None)))
        for g in groups
    ]


def emit_pointwise(spec: KernelSpec, description: str = "") -> str:
    """C source for a pointwise kernel (also used for single injective/elementwise ops)."""
    return render_kernel(lower_pointwise(spec, description))


def loop_nests(em: KernelEmitter, outputs: Sequence[tuple[str, str]]) -> list[str]:
    """C lines of loop nests writing each (tensor, pointer) pair at every point of its shape,
    every value computed by `em` (for generators that assemble the function themselves)."""
    values = KernelValues(em.spec, opaque=lambda op: True)
    lines: list[str] = []
    by_shape: dict[tuple[int, ...], list[tuple[str, Buffer]]] = {}
    for name, ptr in outputs:
        info = em.info(name)
        by_shape.setdefault(info.shape, []).append(
            (name, Buffer(ptr, DType.from_onnx(info.elem_type), info.numel))
        )
    for shape, group in by_shape.items():
        body = loop_nest(values, shape, group)
        em.groups = _string_groups(em, values.groups)
        lines.extend(render_stmts(tuple(body), em.exprs))
        values.groups = []
    em.groups = []
    return lines
