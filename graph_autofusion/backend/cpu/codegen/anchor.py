"""Anchor kernels: one contraction (Conv, ConvTranspose, MatMul, Gemm) or a chain of two GEMMs, with
stride-only prologues folded into operand views and the elementwise epilogue fused per output tile.

`emit_anchor(spec)` handles the templates `anchor`, `anchor_chain` and `single` (a lone anchor) of
docs/fused-format.md and returns the C translation unit plus the method it chose, which the
runtime reports per kernel. Past the contraction, views may sit among the epilogue ops (they keep
the linear index the epilogue runs on), and a MatMul/Gemm may end in one output Transpose that
keeps the last axis last (followed only by views): the GEMM then stores each tile straight into
the permuted layout instead of writing the product and copying it.

A single anchor is its `AnchorMatch` (plan/anchor_match.py) lowered to the kernel IR by
lower/anchor.py (MatMul/Gemm) or lower/conv.py (Conv/ConvTranspose), a chain its `ChainMatch`
lowered by lower/chain.py (two GEMMs) or lower/conv_chain.py (a 1x1 Conv into a depthwise 3x3
Conv), and all are rendered by render_c.py. Only a staged chain
(the row-block chain ruled out by its layout) is a little C text here: two lowered stage kernels
called one after the other with the intermediate in a heap buffer.

With `AUTOFUSION_CONTRACTION=library`, a constant weight operand is packed once at load for the
contraction library (backend/cpu/contraction): the lowered kernel holds it as its `packed` buffer
and `prepack` loop (kernel_spec.py: the `<symbol>_prepack` convention), and the library's text
sits atop the unit. A staged chain exports the convention for both stages: one packed argument
holding the first stage's block, then the second's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import onnx

from ....kernel_ir import Call, If, Kernel, Loop, Stmt
from ....lower.anchor import (
    CONTRACTION_ROUTINE,
    DEPTHWISE_3X3_ROUTINE,
    DEPTHWISE_3X3_S2_ROUTINE,
    lower_anchor,
    method_of,
)
from ....lower.chain import StreamingChain, lower_chain, sub_spec
from ....lower.conv import lower_conv
from ....lower.conv_chain import DW_PW_ROUTINE, PW_DW_ROUTINE, lower_conv_chain
from ....plan.anchor_match import (
    ANCHOR_OPS,
    EPILOGUE_VIEW_OPS,
    STRIDE_PROLOGUE_OPS,
    match_anchor,
    match_chain,
)
from ..blas import BLAS_PREAMBLE
from ..contraction import library_source
from ..kernel_spec import KernelSpec
from ..render_c import (
    PRELUDE,
    PREPACK_ONLY_SUFFIX,
    PREPACK_SUFFIX,
    c_comment,
    packed_layout,
    prepack_only,
    render_kernel,
    workspace_layout,
)
from .common import CodegenUnsupported

# Ops that only relabel elements (the match's own view sets): the staged chain looks through
# them for its intermediate.
VIEW_OPS = STRIDE_PROLOGUE_OPS | EPILOGUE_VIEW_OPS
TEMPLATES = frozenset({"anchor", "anchor_chain", "single"})


@dataclass(frozen=True)
class AnchorKernel:
    """A generated anchor kernel.

    `source` is a complete C translation unit defining `void <spec.symbol>(void *const *args)`;
    `method` names how the contraction is computed ("gemm", "batched_gemm", "conv1x1_gemm",
    "conv_im2col_tiled", "conv_direct", "conv_winograd", "conv_depthwise", "conv_transpose_col2im",
    "matmul_chain",
    "conv_depthwise_chain", or "matmul_chain_staged" / "conv_chain_staged" when a chain runs as two
    stages (its layout rules out row blocks, or the library is not there); a "_packed" suffix means an
    operand view needed a per-tile copy); `uses_blas` says whether the unit must be linked with
    BLAS.
    """

    source: str
    method: str
    uses_blas: bool


def emit_anchor(spec: KernelSpec) -> AnchorKernel:
    """Generate the C kernel for an `anchor`, `anchor_chain` or `single` anchor spec.

    Raises `CodegenUnsupported` (with the reason) for a body outside these templates, so the
    runtime can fall back instead of running a wrong kernel.
    """
    if spec.template not in TEMPLATES:
        raise CodegenUnsupported(f"template {spec.template!r} is not an anchor template")
    for t in (*spec.inputs, *spec.outputs):
        if t.elem_type != onnx.TensorProto.FLOAT and t.name not in _index_inputs(spec):
            raise CodegenUnsupported(f"anchor kernels are fp32; {t.name!r} is {t.ctype}")
    anchors = [k for k, n in enumerate(spec.nodes) if n.op_type in ANCHOR_OPS]
    if spec.template == "anchor_chain":
        if len(anchors) != 2:
            raise CodegenUnsupported(f"anchor_chain needs two anchors, found {len(anchors)}")
        return _emit_chain(spec, anchors)
    if len(anchors) != 1:
        raise CodegenUnsupported(f"an anchor kernel has exactly one anchor, found {len(anchors)}")
    return _rendered(_lowered(spec))


def _lowered(spec: KernelSpec) -> Kernel:
    """A one-anchor spec lowered to the kernel IR."""
    match = match_anchor(spec)
    if match.contraction is None:  # Conv / ConvTranspose
        return lower_conv(spec, match)
    return lower_anchor(spec, match)


def _rendered(lowered: Kernel) -> AnchorKernel:
    """A MatMul/Gemm/Conv anchor lowered to the kernel IR (lower/anchor.py, lower/conv.py) and
    rendered, behind the text of the contraction routine it calls: the library's
    (`library_source`) when it packs a weight or calls the library's depthwise conv, the BLAS
    declarations when it calls OpenBLAS (a chain may do both), nothing for a kernel without a
    contraction (a depthwise conv of the generated loop)."""
    # A chain may pack one weight and call OpenBLAS for its other product: both texts, then.
    blas = _calls(lowered.body, CONTRACTION_ROUTINE)
    prelude = (library_source() + "\n" if uses_library(lowered) else "") + (BLAS_PREAMBLE if blas else "")
    return AnchorKernel(prelude + render_kernel(lowered), method_of(lowered), blas)


def uses_library(kernel: Kernel) -> bool:
    """Whether a lowered kernel calls the contraction library (it packs a weight, or runs its
    depthwise planes there), so its translation unit carries the library's text."""
    return bool(kernel.packed) or any(
        _calls(kernel.body, r)
        for r in (DEPTHWISE_3X3_ROUTINE, DEPTHWISE_3X3_S2_ROUTINE, PW_DW_ROUTINE, DW_PW_ROUTINE)
    )


def _calls(body: tuple[Stmt, ...], function: str) -> bool:
    for s in body:
        if isinstance(s, Call) and s.function == function:
            return True
        if isinstance(s, Loop) and _calls(s.body, function):
            return True
        if isinstance(s, If) and (_calls(s.then, function) or _calls(s.otherwise, function)):
            return True
    return False


def _index_inputs(spec: KernelSpec) -> set[str]:
    # Reshape's shape operand is read at compile time and may arrive as a parameter too.
    # So are Split's sizes and Slice's window (stride-only prologues).
    return {i for n in spec.nodes if n.op_type in ("Reshape", "Split", "Slice") for i in n.input[1:] if i}


def _emit_chain(spec: KernelSpec, anchors: list[int]) -> AnchorKernel:
    """The row-block chain (lower/chain.py) or the band chain of two convs (lower/conv_chain.py)
    when its layout allows, else the two stages one after the other."""
    try:
        chain = match_chain(spec)
        return _rendered(lower_conv_chain(spec, chain) if chain.conv else lower_chain(spec, chain))
    except CodegenUnsupported as exc:
        try:
            return _emit_staged_chain(spec, anchors, str(exc))
        except CodegenUnsupported as staged:
            if isinstance(exc, StreamingChain):
                return _rendered(lower_chain(spec, decline_streaming=False))
            raise CodegenUnsupported(f"{exc}; and as two stages: {staged}") from staged


def _ancestors(spec: KernelSpec, names: list[str]) -> set[int]:
    """Indices (in spec.nodes) of the nodes the given tensors depend on."""
    producers = {o: k for k, n in enumerate(spec.nodes) for o in n.output if o}
    seen: set[int] = set()
    stack = list(names)
    while stack:
        k = producers.get(stack.pop())
        if k is None or k in seen:
            continue
        seen.add(k)
        stack.extend(i for i in spec.nodes[k].input if i)
    return seen


def _emit_staged_chain(spec: KernelSpec, anchors: list[int], reason: str) -> AnchorKernel:
    """Both anchors as ordinary anchor kernels, the intermediate in a heap buffer between them.

    Used when the row-block chain does not apply (weights batched per row block, a Transpose in
    between, ...): every tile still gets its epilogue while hot, only the intermediate makes one
    round trip to memory. The two stages are lowered kernels; only this call sequence is text.
    """
    second = spec.nodes[anchors[1]]
    producers = {o: n for n in spec.nodes for o in n.output if o}
    mid = second.input[0]
    while mid in producers and producers[mid].op_type in VIEW_OPS:
        mid = producers[mid].input[0]
    stage1_idx = _ancestors(spec, [mid])
    if anchors[0] not in stage1_idx:
        raise CodegenUnsupported("the second matmul of a chain must consume the first one's result")
    stage1 = [n for k, n in enumerate(spec.nodes) if k in stage1_idx and n.op_type != "Constant"]
    stage2 = [n for k, n in enumerate(spec.nodes) if k not in stage1_idx and n.op_type != "Constant"]
    mid_info = spec.tensors[mid]
    sub1 = sub_spec(spec, f"{spec.symbol}_s1", stage1, [mid])
    sub2 = sub_spec(spec, f"{spec.symbol}_s2", stage2, [mid])
    l1, l2 = _lowered(sub1), _lowered(sub2)
    for lowered in (l1, l2):
        if workspace_layout(lowered)[1]:  # called below without a workspace
            raise CodegenUnsupported(f"stage {lowered.name} of a staged chain needs a workspace")
    k1, k2 = _rendered(l1), _rendered(l2)
    index = {t.name: k for k, t in enumerate((*spec.inputs, *spec.outputs))}
    mid_is_output = mid in {t.name for t in spec.outputs}
    mid_ptr = f"args[{index[mid]}]" if mid_is_output else "mid"
    # each stage with the offset of its block in the packed argument
    stages = [(sub1, l1, 0), (sub2, l2, packed_layout(l1)[1])]
    packed_floats = stages[-1][2] + packed_layout(l2)[1]

    def argv(sub: KernelSpec, lowered: Kernel, at: int | None, mid_text: str) -> str:
        """A stage's arguments; `at`: its packed block follows its parameters (when it packs)."""
        items = [mid_text if t.name == mid else f"args[{index[t.name]}]" for t in (*sub.inputs, *sub.outputs)]
        if at is not None and packed_layout(lowered)[1]:
            items.append(f"af_packed + {at}")
        return ", ".join(items)

    body = [f"void {spec.symbol}(void *const *args) {{"]
    if packed_floats:
        body.append(f"  float *const af_packed = (float *)args[{len(index)}];")
    if not mid_is_output:
        body.append(f"  void *mid = malloc(sizeof(float) * {max(1, mid_info.numel)});")
    for n, (sub, lowered, at) in enumerate(stages, 1):
        body += [f"  void *const a{n}[] = {{{argv(sub, lowered, at, mid_ptr)}}};", f"  {sub.symbol}(a{n});"]
    if not mid_is_output:
        body.append("  free(mid);")
    body.append("}")
    if packed_floats:
        body = _staged_prepack(spec, stages, packed_floats, index, argv) + body
    method = "conv_chain_staged" if spec.nodes[anchors[0]].op_type == "Conv" else "matmul_chain_staged"
    desc = (
        f"method: {method}; two stages ({k1.method} -> {k2.method}) with the intermediate "
        f"{list(mid_info.shape)} in memory, because the chain does not apply: {reason}"
    )
    parts = [PRELUDE, k1.source, k2.source, c_comment(spec.describe(desc)), *body]
    return AnchorKernel("\n".join(parts) + "\n", method, k1.uses_blas or k2.uses_blas)


def _staged_prepack(
    spec: KernelSpec,
    stages: list[tuple[KernelSpec, Kernel, int]],
    packed_floats: int,
    index: dict[str, int],
    argv: Callable[[KernelSpec, Kernel, int | None, str], str],
) -> list[str]:
    """The kernel_spec.py prepack convention for a staged chain: each stage's packed weights at
    its offset in one argument, filled by calling each stage's own `_prepack` (the intermediate,
    which packing never reads, passed as NULL), and a parameter counted prepack-only where every
    stage that takes it reads it only packed."""
    readers: dict[int, list[bool]] = {}
    for sub, lowered, _ in stages:
        only = prepack_only(lowered)
        for j, t in enumerate((*sub.inputs, *sub.outputs)):
            if t.name in index:
                readers.setdefault(index[t.name], []).append(j in only)
    mask = sum(1 << j for j, flags in readers.items() if j < 63 and all(flags))
    lines = [
        f"const int64_t {spec.symbol}{PREPACK_SUFFIX}_floats = {packed_floats};",
        f"const int64_t {spec.symbol}{PREPACK_ONLY_SUFFIX} = {mask};",
        f"void {spec.symbol}{PREPACK_SUFFIX}(void *const *args, float *af_packed) {{",
    ]
    for n, (sub, lowered, at) in enumerate(stages, 1):
        if packed_layout(lowered)[1]:
            lines += [
                f"  void *const p{n}[] = {{{argv(sub, lowered, None, 'NULL')}}};",
                f"  {sub.symbol}{PREPACK_SUFFIX}(p{n}, af_packed + {at});",
            ]
    return [*lines, "}"]
