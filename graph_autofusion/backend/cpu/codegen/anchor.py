"""Anchor kernels: one contraction (Conv, ConvTranspose, MatMul, Gemm) or a chain of two GEMMs, with
stride-only prologues folded into operand views and the elementwise epilogue fused per output tile.

`emit_anchor(spec)` handles the templates `anchor`, `anchor_chain` and `single` (a lone anchor) of
docs/fused-format.md and returns the C translation unit plus the method it chose, which the
runtime reports per kernel. Past the contraction, views may sit among the epilogue ops (they keep
the linear index the epilogue runs on), and a MatMul/Gemm may end in one output Transpose that
keeps the last axis last (followed only by views): the GEMM then stores each tile straight into
the permuted layout instead of writing the product and copying it.

A single anchor is its `AnchorMatch` (plan/anchor_match.py) lowered to the kernel IR by
lower/anchor.py (MatMul/Gemm) or lower/conv.py (Conv/ConvTranspose) and rendered by render_c.py.
The row-block chain is still C text assembled here from the pieces next door: `gemm.py` (views,
GEMM problems, chain tiling), `epilogue.py` (operands and the per-tile epilogue).

With `AUTOFUSION_CONTRACTION=library`, a constant weight operand is packed once at load for the
contraction library (backend/cpu/contraction), on both paths and by the same convention
(kernel_spec.py: `<symbol>_prepack`): C text reserves its blocks with `_Kernel.pack`; a lowered
MatMul/Gemm/Conv holds it as the IR kernel's `packed` buffer and `prepack` loop. Either way the
library's text sits atop the unit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import onnx

from ....kernel_ir import Call, Kernel, Loop, Stmt
from ....lower.anchor import CONTRACTION_ROUTINE, lower_anchor, method_of
from ....lower.conv import lower_conv
from ....plan.anchor_match import match_anchor
from ..blas import BLAS_PREAMBLE
from ..contraction import b_panels_floats, contraction_mode, library_source
from ..kernel_spec import KernelSpec
from ..render_c import WORKSPACE_SUFFIX, c_comment, render_kernel
from .common import PRELUDE, CodegenUnsupported, attrs_of
from .epilogue import (
    EPILOGUE_VIEWS,
    ERF_PRELUDE,
    Epilogue,
    Operands,
    Step,
    build_epilogue,
    emit_epilogue,
    plan_destination,
)
from .gemm import (
    VIEW_OPS,
    EpilogueCall,
    GemmProblem,
    Matrix,
    PackedB,
    emit_chain_body,
    gemm_c_shape,
    gemm_problem,
    matmul_problem,
    trace_view,
)

ANCHOR_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
TEMPLATES = frozenset({"anchor", "anchor_chain", "single"})


@dataclass(frozen=True)
class AnchorKernel:
    """A generated anchor kernel.

    `source` is a complete C translation unit defining `void <spec.symbol>(void *const *args)`;
    `method` names how the contraction is computed ("gemm", "batched_gemm", "conv1x1_gemm",
    "conv_im2col_tiled", "conv_depthwise", "conv_transpose_col2im", "matmul_chain", or
    "matmul_chain_staged" when a chain's layout rules out row blocks; a "_packed" suffix means an
    operand view needed a per-tile copy); `uses_blas` says whether the unit must be linked with
    BLAS.
    """

    source: str
    method: str
    uses_blas: bool


class _Kernel:
    """Generation state: operands, emitted helpers and the body's node structure."""

    def __init__(self, spec: KernelSpec) -> None:
        if spec.template not in TEMPLATES:
            raise CodegenUnsupported(f"template {spec.template!r} is not an anchor template")
        self.spec = spec
        self.ops = Operands(spec)
        self.producers: dict[str, onnx.NodeProto] = {}
        for node in spec.nodes:
            for out in node.output:
                if out:
                    self.producers[out] = node
        self.helpers: list[str] = []
        self.epilogues = 0
        # Weights packed once at load for the contraction library: the prepack function's body
        # and the floats of the buffer (kernel_spec.py: the `_prepack` convention).
        self.prepack: list[str] = []
        self.packed: list[str] = []  # C constant expressions: floats of each packed block
        for t in (*spec.inputs, *spec.outputs):
            if t.elem_type != onnx.TensorProto.FLOAT and t.name not in self._index_inputs():
                raise CodegenUnsupported(f"anchor kernels are fp32; {t.name!r} is {t.ctype}")

    def _index_inputs(self) -> set[str]:
        # Reshape's shape operand is read at compile time and may arrive as a parameter too.
        # So are Split's sizes and Slice's window (stride-only prologues).
        return {
            i for n in self.spec.nodes if n.op_type in ("Reshape", "Split", "Slice") for i in n.input[1:] if i
        }

    def ancestors(self, names: list[str]) -> set[int]:
        """Indices (in spec.nodes) of the nodes the given tensors depend on."""
        index = {id(n): k for k, n in enumerate(self.spec.nodes)}
        seen: set[int] = set()
        stack = list(names)
        while stack:
            node = self.producers.get(stack.pop())
            if node is None or index[id(node)] in seen:
                continue
            seen.add(index[id(node)])
            stack.extend(i for i in node.input if i)
        return seen

    def view_nodes_feeding(self, names: list[str]) -> set[int]:
        """Prologue views: view nodes on the paths into the given anchor inputs."""
        out: set[int] = set()
        stack = list(names)
        while stack:
            node = self.producers.get(stack.pop())
            if node is None or node.op_type not in VIEW_OPS:
                continue
            out.add(self.spec.nodes.index(node))
            stack.append(node.input[0])
        return out

    def epilogue_call(self, epi: Epilogue, dest_in_tile: str | None, flat: list[str]) -> EpilogueCall | None:
        if not flat and (not epi.steps or dest_in_tile is None):
            return None
        self.epilogues += 1
        fn = f"{self.spec.symbol}_epilogue{self.epilogues}"
        self.helpers.append(emit_epilogue(fn, epi, self.ops, write_back=dest_in_tile, flat_outputs=flat))
        return lambda tile, ldt, r0, r1, c0, c1: f"{fn}(args, {tile}, {ldt}, {r0}, {r1}, {c0}, {c1});"

    def packs(self, name: str) -> bool:
        """Whether the operand `name` (a kernel input) is to be packed once for the library."""
        return (
            contraction_mode() == "library"
            and name in self.spec.weights
            and name in self.ops.args
            and self.ops.elem_type(name) == onnx.TensorProto.FLOAT
        )

    def pack(self, floats: str, lines: list[str]) -> str:
        """Reserve `floats` (a C constant expression; 64-byte aligned) of the packed buffer, filled
        at load by `lines` (C statements where `dst` is the reserved block); returns the block's
        C expression."""
        offset = " + ".join(self.packed) or "0"
        self.packed.append(f"((({floats}) + 15) / 16 * 16)")
        self.prepack += ["  {", f"    float *dst = packed + ({offset});", *lines, "  }"]
        return f"(PK + ({offset}))"

    def assemble(self, body: list[str], method: str, uses_blas: bool, description: str) -> AnchorKernel:
        spec = self.spec
        if self.packed:
            description += f"; {len(self.packed)} weight operand(s) packed once at load (contraction library)"
        header = c_comment(spec.describe(f"method: {method}; {description}"))
        parts = [PRELUDE, ERF_PRELUDE]
        if uses_blas:
            parts.append(BLAS_PREAMBLE)
        if self.packed:
            parts.append(library_source())
        parts += [*self.ops.decls, "", *self.helpers, header]
        if self.packed:
            n_args = len(spec.inputs) + len(spec.outputs)
            parts += [
                f"const int64_t {spec.symbol}_prepack_floats = {' + '.join(self.packed)};",
                f"void {spec.symbol}_prepack(void *const *args, float *packed) {{",
                *self.prepack,
                "}",
            ]
            body = [f"  const float *restrict PK = (const float *)args[{n_args}];", *body]
        parts.append(f"void {spec.symbol}(void *const *args) {{")
        parts += body
        parts.append("}")
        return AnchorKernel(source="\n".join(parts) + "\n", method=method, uses_blas=uses_blas)


def emit_anchor(spec: KernelSpec) -> AnchorKernel:
    """Generate the C kernel for an `anchor`, `anchor_chain` or `single` anchor spec.

    Raises `CodegenUnsupported` (with the reason) for a body outside these templates, so the
    runtime can fall back instead of running a wrong kernel.
    """
    kernel = _Kernel(spec)
    anchors = [k for k, n in enumerate(spec.nodes) if n.op_type in ANCHOR_OPS]
    if spec.template == "anchor_chain":
        if len(anchors) != 2:
            raise CodegenUnsupported(f"anchor_chain needs two anchors, found {len(anchors)}")
        return _emit_chain(kernel, anchors)
    if len(anchors) != 1:
        raise CodegenUnsupported(f"an anchor kernel has exactly one anchor, found {len(anchors)}")
    match = match_anchor(spec)
    if match.contraction is None:  # Conv / ConvTranspose
        return _rendered(lower_conv(spec, match))
    return _rendered(lower_anchor(spec, match))


def _rendered(lowered: Kernel) -> AnchorKernel:
    """A MatMul/Gemm/Conv anchor lowered to the kernel IR (lower/anchor.py, lower/conv.py) and
    rendered, behind the text of the contraction routine it calls: the library's
    (`library_source`, as atop a C-text anchor) when it packs its weight, the BLAS declarations
    when it calls OpenBLAS, nothing for a kernel without a contraction (a depthwise conv)."""
    if lowered.packed:
        return AnchorKernel(library_source() + "\n" + render_kernel(lowered), method_of(lowered), False)
    if _calls(lowered.body, CONTRACTION_ROUTINE):
        return AnchorKernel(BLAS_PREAMBLE + render_kernel(lowered), method_of(lowered), True)
    return AnchorKernel(render_kernel(lowered), method_of(lowered), False)


def _calls(body: tuple[Stmt, ...], function: str) -> bool:
    for s in body:
        if isinstance(s, Call) and s.function == function:
            return True
        if isinstance(s, Loop) and _calls(s.body, function):
            return True
    return False


def _destination(kernel: _Kernel, epi: Epilogue, anchor_output: str) -> tuple[str, EpilogueCall | None]:
    dest, write_back, flat = plan_destination(epi, kernel.ops, anchor_output=anchor_output)
    call = kernel.epilogue_call(epi, write_back, flat)
    return kernel.ops.output_pointer(dest), call


def _gemm_pre_steps(
    kernel: _Kernel, node: onnx.NodeProto, p: GemmProblem
) -> tuple[str, list[Step], dict[str, tuple[int, ...]]]:
    """Gemm's `beta * C` as leading epilogue steps on the raw product (named `source`)."""
    ops = kernel.ops
    y = node.output[0]
    attrs = attrs_of(node)
    beta = float(attrs.get("beta", 1.0))  # type: ignore[arg-type]
    if node.op_type != "Gemm" or len(node.input) < 3 or not node.input[2] or beta == 0.0:
        return y, [], {}
    c = node.input[2]
    c_shape = gemm_c_shape(ops.shape(c), p.m, p.n)
    source = f"__af_acc_{kernel.spec.symbol}_{len(ops.shapes)}"
    ops.shapes[source] = ops.shape(y)
    steps: list[Step] = []
    addend = c
    if beta != 1.0:
        scaled = f"__af_betac_{kernel.spec.symbol}_{len(ops.shapes)}"
        ops.shapes[scaled] = c_shape
        steps.append(Step("Mul", (c, ops.add_constant("beta", beta)), scaled))
        addend = scaled
    steps.append(Step("Add", (source, addend), y))
    return source, steps, {c: c_shape}


def _problem(
    kernel: _Kernel, node: onnx.NodeProto, out_strides: tuple[int, ...] | None = None
) -> tuple[GemmProblem, bool]:
    """The GEMM of a MatMul/Gemm node (stored at `out_strides` when given, else densely); also
    whether the output has a column axis (B not 1-D)."""
    ops = kernel.ops
    a = trace_view(node.input[0], ops, kernel.producers)
    b = trace_view(node.input[1], ops, kernel.producers)
    if node.op_type == "Gemm":
        p = gemm_problem(node, a, b, ops)
        if out_strides is not None:
            if p.n != 1 and out_strides[-1] != 1:
                raise CodegenUnsupported("a permuted Gemm output must keep its columns contiguous")
            ldc = out_strides[0] if p.m > 1 else max(1, p.n)
            if ldc < p.n:
                raise CodegenUnsupported(f"output rows {ldc} apart overlap rows of {p.n} columns")
            p = replace(p, c_rs=ldc)
        return p, True
    p, _, b_vec = matmul_problem(a, b, ops, out_strides)
    return p, not b_vec


def _packed_b(kernel: _Kernel, p: GemmProblem, node: onnx.NodeProto, nb: int) -> PackedB | None:
    """A constant right operand shared across the batch as the library's B-panels, one block per
    column tile of `nb` columns; None: BLAS contracts. (A single MatMul/Gemm anchor packs its
    weights in the kernel IR instead: lower/anchor.py.)"""
    name = trace_view(node.input[1], kernel.ops, kernel.producers).base
    if not kernel.packs(name) or any(p.b.batch_strides) or p.k < 1 or p.n < 1:
        return None
    nt = -(-p.n // nb)
    block = f"((({b_panels_floats(p.k, nb)}) + 15) / 16 * 16)"
    lines = [
        f"    for (long t = 0; t < {nt}L; ++t) {{",
        f"      const long n0 = t * {nb}L, n1 = n0 + {nb}L < {p.n}L ? n0 + {nb}L : {p.n}L;",
        f"      afc_pack_b({p.k}L, n1 - n0, {p.b.ptr} + n0 * {p.b.cs}L, {p.b.rs}L, {p.b.cs}L,"
        f" dst + t * {block});",
        "    }",
    ]
    return PackedB(kernel.pack(f"{nt}L * {block}", lines), nb, block)


def _emit_chain(kernel: _Kernel, anchors: list[int]) -> AnchorKernel:
    """The fused row-block chain when its layout allows, else the two stages one after the other."""
    try:
        return _emit_fused_chain(kernel, anchors)
    except CodegenUnsupported as exc:
        try:
            return _emit_staged_chain(kernel.spec, anchors, str(exc))
        except CodegenUnsupported as staged:
            raise CodegenUnsupported(f"{exc}; and as two stages: {staged}") from staged


def _sub_spec(
    spec: KernelSpec, symbol: str, nodes: list[onnx.NodeProto], extra_outputs: list[str]
) -> KernelSpec:
    """A one-anchor spec over part of a chain's body; its parameters keep the body's tensor names."""
    constants = [n for n in spec.nodes if n.op_type == "Constant" and n not in nodes]
    body = [*constants, *nodes]
    body.sort(key=lambda n: list(spec.nodes).index(n))
    produced = {o for n in body for o in n.output if o}
    params = {t.name for t in spec.inputs} | set(extra_outputs)
    reads: list[str] = []
    for n in body:
        for name in n.input:
            if name and name not in produced and name not in reads and name in params:
                reads.append(name)
    kernel_outputs = {t.name for t in spec.outputs}
    outputs = [o for n in nodes for o in n.output if o in kernel_outputs or o in extra_outputs]
    return KernelSpec(
        symbol=symbol,
        template="anchor",
        nodes=tuple(body),
        inputs=tuple(spec.tensors[r] for r in reads),
        outputs=tuple(spec.tensors[o] for o in dict.fromkeys(outputs)),
        tensors=spec.tensors,
        constants=spec.constants,
        pattern=spec.pattern,
        members=spec.members,
    )


def _emit_staged_chain(spec: KernelSpec, anchors: list[int], reason: str) -> AnchorKernel:
    """Both anchors as ordinary anchor kernels, the intermediate in a heap buffer between them.

    Used when the row-block chain does not apply (weights batched per row block, a Transpose in
    between, ...): every tile still gets its epilogue while hot, only the intermediate makes one
    round trip to memory.
    """
    second = spec.nodes[anchors[1]]
    producers = {o: n for n in spec.nodes for o in n.output if o}
    mid = second.input[0]
    while mid in producers and producers[mid].op_type in VIEW_OPS:
        mid = producers[mid].input[0]
    helper = _Kernel(spec)
    stage1_idx = helper.ancestors([mid])
    if anchors[0] not in stage1_idx:
        raise CodegenUnsupported("the second matmul of a chain must consume the first one's result")
    stage1 = [n for k, n in enumerate(spec.nodes) if k in stage1_idx and n.op_type != "Constant"]
    stage2 = [n for k, n in enumerate(spec.nodes) if k not in stage1_idx and n.op_type != "Constant"]
    mid_info = spec.tensors[mid]
    sub1 = _sub_spec(spec, f"{spec.symbol}_s1", stage1, [mid])
    sub2 = _sub_spec(spec, f"{spec.symbol}_s2", stage2, [mid])
    k1, k2 = emit_anchor(sub1), emit_anchor(sub2)
    for sub, k in ((sub1, k1), (sub2, k2)):
        if f"{sub.symbol}{WORKSPACE_SUFFIX}" in k.source:  # called below without a workspace
            raise CodegenUnsupported(f"stage {sub.symbol} of a staged chain needs a workspace")
    index = {t.name: k for k, t in enumerate((*spec.inputs, *spec.outputs))}
    mid_is_output = mid in {t.name for t in spec.outputs}
    mid_ptr = f"args[{index[mid]}]" if mid_is_output else "mid"

    def argv(sub: KernelSpec) -> str:
        items = [mid_ptr if t.name == mid else f"args[{index[t.name]}]" for t in (*sub.inputs, *sub.outputs)]
        return ", ".join(items)

    body = []
    if not mid_is_output:
        body.append(f"  void *mid = malloc(sizeof(float) * {max(1, mid_info.numel)});")
    body += [
        f"  void *const a1[] = {{{argv(sub1)}}};",
        f"  {sub1.symbol}(a1);",
        f"  void *const a2[] = {{{argv(sub2)}}};",
        f"  {sub2.symbol}(a2);",
    ]
    if not mid_is_output:
        body.append("  free(mid);")
    kernel = _Kernel(spec)
    kernel.helpers = [k1.source, k2.source]
    desc = (
        f"two stages ({k1.method} -> {k2.method}) with the intermediate {list(mid_info.shape)} in memory, "
        f"because the row-block chain does not apply: {reason}"
    )
    return kernel.assemble(body, "matmul_chain_staged", True, desc)


def _emit_fused_chain(kernel: _Kernel, anchors: list[int]) -> AnchorKernel:
    spec = kernel.spec
    ops = kernel.ops
    first, second = spec.nodes[anchors[0]], spec.nodes[anchors[1]]
    for n in (first, second):
        if n.op_type not in ("MatMul", "Gemm"):
            raise CodegenUnsupported(f"an anchor_chain links MatMul/Gemm, not {n.op_type}")
    if second.op_type == "Gemm" and attrs_of(second).get("transA", 0):
        raise CodegenUnsupported("the second Gemm of a chain cannot transpose its left operand")
    # The intermediate: second's left input, through an optional view, back to a stage-1 value.
    h2 = second.input[0]
    mid = h2
    between = kernel.producers.get(h2)
    if between is not None and between.op_type in VIEW_OPS:
        if between.op_type == "Transpose":
            raise CodegenUnsupported("a Transpose between chained matmuls is not a row-preserving view")
        mid = between.input[0]
    stage1_nodes = kernel.ancestors([mid])
    prologue = kernel.view_nodes_feeding([i for i in first.input if i] + list(second.input[1:]))
    if anchors[0] not in stage1_nodes:
        raise CodegenUnsupported("the second matmul of a chain must consume the first one's result")
    skip = prologue | {anchors[0], anchors[1]}
    if between is not None and between.op_type in VIEW_OPS:
        skip.add(spec.nodes.index(between))
    epi1_nodes = [n for k, n in enumerate(spec.nodes) if k in stage1_nodes and k not in skip]
    epi2_nodes = [n for k, n in enumerate(spec.nodes) if k not in stage1_nodes and k not in skip]
    for n in (*epi1_nodes, *epi2_nodes):
        if n.op_type in (VIEW_OPS - EPILOGUE_VIEWS) | {"Conv", "ConvTranspose"}:
            raise CodegenUnsupported(f"{n.op_type} inside a matmul chain's epilogue is not supported")
    if len(ops.shape(mid)) < 1 or len(ops.shape(h2)) < 2:
        raise CodegenUnsupported("chained matmuls need 2-D or higher operands")

    p1, has_cols1 = _problem(kernel, first)
    if p1.batch or not has_cols1:
        raise CodegenUnsupported("the first matmul of a chain must share its weights across the batch")
    y1 = first.output[0]
    y1_shape = ops.shape(y1)
    src1, pre1, ov1 = _gemm_pre_steps(kernel, first, p1)
    epi1 = build_epilogue(
        ops,
        source=src1,
        anchor_output=y1,
        domain=y1_shape,
        split=len(y1_shape) - 1,
        pre_steps=pre1,
        nodes=epi1_nodes,
        shape_overrides=ov1,
    )
    if mid not in epi1.values:
        raise CodegenUnsupported("the chain's intermediate is not computed by the first stage")
    flat1 = [v for v in epi1.values if v in ops.outputs]
    call1 = kernel.epilogue_call(epi1, mid if mid != epi1.source else None, flat1)
    if call1 is None and mid != epi1.source:
        raise CodegenUnsupported("internal: chain stage 1 produced no epilogue")

    h2_shape = ops.shape(h2)
    k2 = h2_shape[-1]
    n1 = p1.n
    m2 = math.prod(h2_shape) // k2
    g = math.gcd(n1, k2)
    ratio = (n1 // g, k2 // g)
    b2 = trace_view(second.input[1], ops, kernel.producers)
    if len(b2.shape) != 2:
        raise CodegenUnsupported("the second matmul of a chain needs 2-D weights")
    (br, bc), (brs, bcs) = b2.shape, b2.strides
    alpha2 = 1.0
    if second.op_type == "Gemm":
        attrs = attrs_of(second)
        if attrs.get("transB", 0):
            br, bc, brs, bcs = bc, br, bcs, brs
        alpha2 = float(attrs.get("alpha", 1.0))  # type: ignore[arg-type]
    if br != k2:
        raise CodegenUnsupported(f"chained matmul inner dimensions differ: {h2_shape} x {b2.shape}")
    p2 = GemmProblem(
        (),
        m2,
        bc,
        k2,
        Matrix("h", m2, k2, k2, 1, ()),
        Matrix(b2.pointer(ops), br, bc, brs, bcs, ()),
        alpha2,
    )
    y2 = second.output[0]
    y2_shape = ops.shape(y2)
    src2, pre2, ov2 = _gemm_pre_steps(kernel, second, p2)
    epi2 = build_epilogue(
        ops,
        source=src2,
        anchor_output=y2,
        domain=y2_shape,
        split=len(y2_shape) - 1,
        pre_steps=pre2,
        nodes=epi2_nodes,
        shape_overrides=ov2,
    )
    y_ptr, call2 = _destination(kernel, epi2, y2)
    # The chain computes whole rows: each GEMM's weights pack as one block of all N columns.
    packed = (_packed_b(kernel, p1, first, p1.n), _packed_b(kernel, p2, second, p2.n))
    body = emit_chain_body(p1, p2, y_ptr, call1, call2, ratio, packed)
    desc = (
        f"[{p1.m}x{p1.k}]x[{p1.k}x{p1.n}] -> {epi1.describe()} -> [{p2.m}x{p2.k}]x[{p2.k}x{p2.n}] -> "
        f"{epi2.describe()}; the intermediate stays in a per-thread row block"
    )
    uses_blas = None in packed
    return kernel.assemble(body, "matmul_chain", uses_blas, desc)
