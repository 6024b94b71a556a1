"""C source per kernel; `generate(spec)` picks the generator for `spec.template`.

    pointwise.py   pointwise, pool and single kernels: lower/pointwise.py's IR, rendered
    reduction.py   the row template: lower/reduction.py's IR, rendered
    attention.py   the attention template: lower/attention.py's IR, rendered
    pool.py        MaxPool / AveragePool / LpPool windows (an index rule of lower/values.py)
    single.py      other single ops whose rule folds an axis (ArgMax, CumSum)
    anchor.py      Conv / ConvTranspose / MatMul / Gemm with their epilogues: a single anchor is
                   its AnchorMatch lowered to the IR (lower/anchor.py, lower/conv.py), a two-GEMM
                   chain its ChainMatch (lower/chain.py), rendered
    common.py      the generators' one exception

A generator that meets something it cannot compile raises `CodegenUnsupported`; the runtime then
runs that kernel's nodes as host ops and lists them, so nothing is dropped silently.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import onnx

from ..kernel_spec import KernelSpec
from . import pool, single
from .attention import emit_attention
from .common import CodegenUnsupported
from .pointwise import emit_pointwise
from .reduction import emit_reduction

__all__ = ["CodegenUnsupported", "GeneratedKernel", "anchor_module", "generate"]


@dataclass(frozen=True)
class GeneratedKernel:
    source: str
    uses_blas: bool = False
    method: str = ""  # how an anchor computes its contraction (im2col, direct 1x1, ...)


def anchor_module():
    """The anchor generator module, or None while it is not available."""
    try:
        return importlib.import_module("graph_autofusion.backend.cpu.codegen.anchor")
    except ImportError:
        return None


_IR_TEMPLATES = frozenset(
    {"pointwise", "view", "reduction", "pool", "single", "attention"}
)  # lowered through the kernel IR
_IR_ONLY_TYPES = frozenset({onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16})


def generate(spec: KernelSpec) -> GeneratedKernel:
    """C source for one kernel, dispatched on `spec.template`."""
    template = spec.template
    if template not in _IR_TEMPLATES:
        # 16-bit floats are stored as bits and widened at loads: only kernels lowered through the
        # kernel IR know that; the C-text generators would compute on the raw bits.
        narrow = sorted({onnx.TensorProto.DataType.Name(t.elem_type) for t in spec.tensors.values()
                         if t.elem_type in _IR_ONLY_TYPES})  # fmt: skip
        if narrow:
            raise CodegenUnsupported(f"{'/'.join(narrow)} tensors in the {template} template")
    if template in ("pointwise", "view"):  # a group of views only: a copy in the new shape
        return GeneratedKernel(emit_pointwise(spec), method="loop")
    if template == "reduction":
        return GeneratedKernel(emit_reduction(spec), method="row")
    if template == "attention":
        source, blas = emit_attention(spec)
        return GeneratedKernel(source, uses_blas=blas, method="tiles" if "afa_qk(" in source else "rows")
    if template == "pool":
        return GeneratedKernel(pool.emit_pool(spec), method="window")
    if template == "single":
        return GeneratedKernel(single.emit_single(spec), method="loop")
    if template in ("anchor", "anchor_chain"):
        module = anchor_module()
        if module is None:
            raise CodegenUnsupported("the anchor generator is not available")
        try:
            kernel = module.emit_anchor(spec)
        except NotImplementedError as exc:
            raise CodegenUnsupported(str(exc) or "anchor variant not implemented") from exc
        return GeneratedKernel(kernel.source, uses_blas=bool(kernel.uses_blas), method=str(kernel.method))
    raise CodegenUnsupported(f"unknown template {template!r}")
