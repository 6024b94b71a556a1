"""The `pointwise` template in C: the kernel IR of graph_autofusion.lower.pointwise, rendered.

Ops whose C is still written by a generator of this package (pooling windows, ArgMax, CumSum)
stay `TensorAt` reads in the IR; the renderer asks this package's emitter for them, so one loop
nest serves both.
"""

from __future__ import annotations

from collections.abc import Sequence

from ....kernel_ir import Buffer, DType
from ....lower.pointwise import KernelValues, loop_nest, lower_pointwise
from ....lower.values import IndexGroup as IRIndexGroup
from ..kernel_spec import KernelSpec
from ..render_c import render_kernel, render_stmts
from .common import IndexGroup, KernelEmitter, has_node_rule


def _string_groups(em: KernelEmitter, groups: Sequence[IRIndexGroup]) -> list[IndexGroup]:
    """The IR loop nest's index groups, as the C-text emitter names them."""
    return [
        IndexGroup(tuple(str(em._text(n, None)) for n in g.names), g.dims, str(em._text(g.expr, None)))
        for g in groups
    ]


def emit_pointwise(spec: KernelSpec, description: str = "") -> str:
    """C source for a pointwise kernel (also used for single injective/elementwise ops)."""
    em = KernelEmitter(spec)
    lowered = lower_pointwise(spec, description, opaque=has_node_rule)
    em.groups = _string_groups(em, lowered.groups)
    return render_kernel(lowered.kernel, em.exprs, em.const_decls)


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
