"""MatMul / Gemm chains (`anchor_chain`) as tiled single-threaded sgemm calls, still C text.

A single MatMul/Gemm anchor is lowered to the kernel IR (lower/anchor.py, which also holds the
tile sizes and the reasoning behind them); what stays here serves the row-block chain
GEMM -> epilogue -> GEMM -> epilogue (`emit_chain_body`): operand views through
stride-only prologues (`trace_view`: Transpose, Reshape, Squeeze/Unsqueeze/Flatten/Identity,
Split outputs and step-1 Slices as a base offset), GEMM problems (`matmul_problem`,
`gemm_problem`), and one tile's sgemm call (`sgemm_tile`), packing a view BLAS cannot address
into a per-thread buffer.

The kernel owns the parallel loop: BLAS runs single-threaded inside the OpenMP loop, since two
thread pools on the same cores fight (DESIGN.md §1); row blocks are handed out dynamically.

A chain's right operand that is a constant weight may come packed once by the runtime (B-panels
of the contraction library, backend/cpu/contraction, `PackedB`): its tile is then one
`afc_gemm_bp` call reading A through its view's strides. Everything else keeps OpenBLAS.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import onnx

from ....layout import reshape_strides, slice_window, split_sizes
from ....lower.anchor import PARALLEL_MIN_MACS, TILE_ROWS
from .common import CodegenUnsupported, attrs_of, c_literal
from .epilogue import Operands, contiguous_strides

VIEW_OPS = frozenset(
    {"Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Split", "Slice"}
)


@dataclass(frozen=True)
class View:
    """A tensor read through stride-only ops: element i lives at `base[offset + sum(i_d * strides_d)]`."""

    base: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0

    def pointer(self, ops: Operands) -> str:
        """The C expression of the view's first element."""
        ptr = ops.pointer(self.base)
        return f"({ptr} + {self.offset}L)" if self.offset else ptr


def _int_constant(ops: Operands, name: str, what: str) -> list[int]:
    if name not in ops.constants:
        raise CodegenUnsupported(f"{what} {name!r} is not a compile-time constant")
    return [int(v) for v in ops.constants[name].reshape(-1)]


def _split_view(node: onnx.NodeProto, name: str, src: View, ops: Operands) -> View:
    """Output `name` of a Split: the source window along the split axis, at an element offset."""
    attrs = attrs_of(node)
    rank = len(src.shape)
    axis = int(attrs.get("axis", 0)) % max(rank, 1)  # type: ignore[call-overload]
    given: list[int] | None = None
    if len(node.input) > 1 and node.input[1]:
        given = _int_constant(ops, node.input[1], "Split sizes")
    elif attrs.get("split") is not None:
        given = [int(v) for v in attrs["split"]]  # type: ignore[union-attr]
    sizes = split_sizes(src.shape[axis], len(node.output), given)
    if sizes is None:
        raise CodegenUnsupported(f"Split {node.name!r} sizes do not cover axis {axis} of {list(src.shape)}")
    idx = list(node.output).index(name)
    shape = list(src.shape)
    shape[axis] = sizes[idx]
    offset = src.offset + sum(sizes[:idx]) * src.strides[axis]
    return View(src.base, tuple(shape), src.strides, offset)


def _slice_view(node: onnx.NodeProto, src: View, ops: Operands) -> View:
    """A step-1 Slice: a window of the source at an element offset, same strides."""
    attrs = attrs_of(node)
    if len(node.input) > 1:
        starts = _int_constant(ops, node.input[1], "Slice starts")
        ends = _int_constant(ops, node.input[2], "Slice ends")
        axes = (
            _int_constant(ops, node.input[3], "Slice axes") if len(node.input) > 3 and node.input[3] else None
        )
        steps = (
            _int_constant(ops, node.input[4], "Slice steps")
            if len(node.input) > 4 and node.input[4]
            else None
        )
    else:
        starts = [int(v) for v in attrs.get("starts", [])]  # type: ignore[union-attr]
        ends = [int(v) for v in attrs.get("ends", [])]  # type: ignore[union-attr]
        axes = [int(v) for v in attrs["axes"]] if attrs.get("axes") is not None else None  # type: ignore[union-attr]
        steps = None
    window = slice_window(src.shape, starts, ends, axes, steps)
    if window is None:
        raise CodegenUnsupported(f"Slice {node.name!r} is not a constant step-1 window")
    begin, shape = window
    offset = src.offset + sum(b * st for b, st in zip(begin, src.strides, strict=True))
    return View(src.base, shape, src.strides, offset)


def trace_view(name: str, ops: Operands, producers: dict[str, onnx.NodeProto]) -> View:
    """Follow stride-only prologue ops back to a kernel input or constant."""
    node = producers.get(name)
    if node is None:
        shape = ops.shape(name)
        return View(name, shape, contiguous_strides(shape))
    if node.op_type not in VIEW_OPS:
        raise CodegenUnsupported(f"{node.op_type} feeding an anchor is not a stride-only prologue")
    src = trace_view(node.input[0], ops, producers)
    out_shape = ops.shape(name)
    if node.op_type in ("Split", "Slice"):
        view = _split_view(node, name, src, ops) if node.op_type == "Split" else _slice_view(node, src, ops)
        if view.shape != tuple(out_shape):
            raise CodegenUnsupported(
                f"{node.op_type} {node.name!r} yields {list(view.shape)}, not {list(out_shape)}"
            )
        return view
    if node.op_type == "Transpose":
        perm = attrs_of(node).get("perm") or list(range(len(src.shape)))[::-1]
        return View(
            src.base,
            tuple(src.shape[p] for p in perm),  # type: ignore[union-attr]
            tuple(src.strides[p] for p in perm),  # type: ignore[union-attr]
            src.offset,
        )
    strides = reshape_strides(src.shape, src.strides, out_shape)
    if strides is None:
        raise CodegenUnsupported(f"{node.op_type} {node.name!r} on a transposed view would need a copy")
    return View(src.base, tuple(out_shape), strides, src.offset)


@dataclass(frozen=True)
class Matrix:
    """One GEMM operand: `rows x cols` at `ptr`, element (i, j) at `i*rs + j*cs`, per-batch strides."""

    ptr: str
    rows: int
    cols: int
    rs: int
    cs: int
    batch_strides: tuple[int, ...]

    def blas(self) -> tuple[str, int] | None:
        """(transpose flag, leading dimension) if BLAS can read it in place."""
        if self.cols == 1 or self.cs == 1:
            ld = self.rs if self.rows > 1 else self.cols
            if ld >= max(1, self.cols):
                return "AfNoTrans", ld
        if self.rows == 1 or self.rs == 1:
            ld = self.cs if self.cols > 1 else self.rows
            if ld >= max(1, self.rows):
                return "AfTrans", ld
        return None


@dataclass(frozen=True)
class GemmProblem:
    """`Y[b] = alpha * A[b] @ B[b]` for every index b of `batch`.

    Y is dense `[*batch, m, n]` unless `c_rs` is set: then row i of batch entry b starts at
    `offset(b, c_batch_strides) + i * c_rs` (columns stay unit-stride), a permuted output layout.
    """

    batch: tuple[int, ...]
    m: int
    n: int
    k: int
    a: Matrix
    b: Matrix
    alpha: float = 1.0
    c_rs: int | None = None
    c_batch_strides: tuple[int, ...] = ()

    @property
    def batch_count(self) -> int:
        return math.prod(self.batch)

    @property
    def macs(self) -> int:
        return self.batch_count * self.m * self.n * self.k


def _split_batch(view: View, nd_batch: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    dims = view.shape[:-2]
    strides = view.strides[:-2]
    pad = nd_batch - len(dims)
    return (1,) * pad + tuple(dims), (0,) * pad + tuple(strides)


def matmul_problem(
    a: View, b: View, ops: Operands, out_strides: Sequence[int] | None = None
) -> tuple[GemmProblem, bool, bool]:
    """The GEMM problem of `MatMul(a, b)` with numpy semantics; also whether a/b were 1-D.

    `out_strides` (element strides of the output's axes where the kernel stores it; dense when
    None) must keep the last axis unit-stride; batch dims fold into M only where both A's and
    the output's rows stay evenly spaced."""
    a_vec, b_vec = len(a.shape) == 1, len(b.shape) == 1
    if out_strides is not None and (a_vec or b_vec):
        raise CodegenUnsupported("a permuted output needs a MatMul of matrices, not of a vector")
    if a_vec:
        a = View(a.base, (1, a.shape[0]), (a.shape[0] * a.strides[0], a.strides[0]), a.offset)
    if b_vec:
        b = View(b.base, (b.shape[0], 1), (b.strides[0], 1), b.offset)
    m, k = a.shape[-2:]
    k2, n = b.shape[-2:]
    if k != k2:
        raise CodegenUnsupported(f"MatMul inner dimensions differ: {a.shape} x {b.shape}")
    nd = max(len(a.shape), len(b.shape)) - 2
    a_dims, a_str = _split_batch(a, nd)
    b_dims, b_str = _split_batch(b, nd)
    full = tuple(max(da, db) for da, db in zip(a_dims, b_dims, strict=True))
    c_str = tuple(out_strides) if out_strides is not None else contiguous_strides((*full, m, n))
    if len(c_str) != nd + 2 or (n != 1 and c_str[-1] != 1):
        raise CodegenUnsupported(f"output strides {list(c_str)} do not keep MatMul columns contiguous")
    batch, sa, sb, sc = [], [], [], []
    for da, db, ta, tb, tc in zip(a_dims, b_dims, a_str, b_str, c_str[:-2], strict=True):
        if da != db and 1 not in (da, db):
            raise CodegenUnsupported(f"MatMul batch dims do not broadcast: {a.shape} x {b.shape}")
        d = max(da, db)
        if d == 1:
            continue
        batch.append(d)
        sa.append(ta if da != 1 else 0)
        sb.append(tb if db != 1 else 0)
        sc.append(tc)
    a_rs, a_cs = a.strides[-2:]
    c_rs = c_str[-2]
    # Fold trailing batch dims into M when B is shared across them and the rows of A and of the
    # output stay evenly spaced.
    while batch and sb[-1] == 0 and (m == 1 or (sa[-1] == m * a_rs and sc[-1] == m * c_rs)):
        if m == 1:
            a_rs, c_rs = sa[-1], sc[-1]
        m *= batch.pop()
        sa.pop()
        sb.pop()
        sc.pop()
    pa = Matrix(a.pointer(ops), m, k, a_rs, a_cs, tuple(sa))
    pb = Matrix(b.pointer(ops), k, n, b.strides[-2], b.strides[-1], tuple(sb))
    if out_strides is None:
        return GemmProblem(tuple(batch), m, n, k, pa, pb), a_vec, b_vec
    ldc = c_rs if m > 1 else max(1, n)
    if ldc < n:
        raise CodegenUnsupported(f"output rows {ldc} apart overlap rows of {n} columns")
    return GemmProblem(tuple(batch), m, n, k, pa, pb, c_rs=ldc, c_batch_strides=tuple(sc)), a_vec, b_vec


def gemm_problem(node: onnx.NodeProto, a: View, b: View, ops: Operands) -> GemmProblem:
    """The contraction of an ONNX `Gemm` (alpha and the transposes; C/beta go to the epilogue)."""
    attrs = attrs_of(node)
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise CodegenUnsupported("Gemm operands must be 2-D")
    (ar, ac), (ars, acs) = a.shape, a.strides
    if attrs.get("transA", 0):
        ar, ac, ars, acs = ac, ar, acs, ars
    (br, bc), (brs, bcs) = b.shape, b.strides
    if attrs.get("transB", 0):
        br, bc, brs, bcs = bc, br, bcs, brs
    if ac != br:
        raise CodegenUnsupported(f"Gemm inner dimensions differ: {a.shape} x {b.shape}")
    pa = Matrix(a.pointer(ops), ar, ac, ars, acs, ())
    pb = Matrix(b.pointer(ops), br, bc, brs, bcs, ())
    return GemmProblem((), ar, bc, ac, pa, pb, float(attrs.get("alpha", 1.0)))


def parallel_or_serial(lines: list[str], parallel: bool) -> list[str]:
    """Keep the OpenMP pragmas of a generated body, or drop them when the work is too small to
    pay for a fork/join (the loop then runs on the calling thread with no OpenMP call at all)."""
    if parallel:
        return lines
    return [line for line in lines if "#pragma omp" not in line]


def _round_up(x: int, q: int) -> int:
    return -(-x // q) * q


def _batch_offset(var: str, batch: Sequence[int], strides: Sequence[int]) -> str:
    terms = []
    inner = 1
    inners = []
    for d in reversed(batch):
        inners.append(inner)
        inner *= d
    inners.reverse()
    for a, (d, s) in enumerate(zip(batch, strides, strict=True)):
        if s == 0:
            continue
        idx = var if inners[a] == 1 else f"({var} / {inners[a]}L)"
        if a > 0:
            idx = f"({idx} % {d}L)"
        terms.append(f"{idx} * {s}L")
    return " + ".join(terms) if terms else "0"


def _pack_lines(dst: str, src: str, rows: str, cols: str, rs: int, cs: int, indent: str) -> list[str]:
    return [
        f"{indent}for (long i = 0; i < {rows}; ++i)",
        f"{indent}  for (long j = 0; j < {cols}; ++j) {dst}[i * {cols} + j] = {src}[i * {rs}L + j * {cs}L];",
    ]


@dataclass(frozen=True)
class PackedB:
    """The right operand packed once at C expression `ptr`: per column tile of `nb` columns, the
    library's B-panels over the full K, `block` floats apart (a C constant expression)."""

    ptr: str
    nb: int
    block: str


@dataclass(frozen=True)
class SgemmCall:
    """C statements computing rows [m0, m1) x columns [n0, n1) of one batch entry into `dst`."""

    lines: list[str]
    packs_a: bool
    packs_b: bool


def sgemm_tile(
    p: GemmProblem,
    *,
    batch_var: str,
    dst: str,
    ldd: str,
    indent: str,
    a_ptr: str | None = None,
    lda_override: int | None = None,
    packed_b: PackedB | None = None,
) -> SgemmCall:
    """One single-threaded sgemm for the tile (`m0..m1`, `n0..n1` are C variables in scope);
    with `packed_b` (n0 on a column-tile boundary) the contraction library's `afc_gemm_bp`."""
    lines: list[str] = []
    if packed_b is not None:
        if a_ptr is None:
            a_off = _batch_offset(batch_var, p.batch, p.a.batch_strides)
            a_ptr, rs, cs = f"{p.a.ptr} + {a_off} + m0 * {p.a.rs}L", p.a.rs, p.a.cs
        else:
            rs, cs = lda_override or p.k, 1
        alpha = c_literal(p.alpha, onnx.TensorProto.FLOAT)
        lines.append(
            f"{indent}afc_gemm_bp(m1 - m0, n1 - n0, {p.k}L, {alpha}, {a_ptr}, {rs}L, {cs}L, "
            f"{packed_b.ptr} + (n0 / {packed_b.nb}L) * {packed_b.block}, {dst}, {ldd});"
        )
        return SgemmCall(lines, False, False)
    if a_ptr is None:
        a_off = _batch_offset(batch_var, p.batch, p.a.batch_strides)
        a_ptr = f"{p.a.ptr} + {a_off} + m0 * {p.a.rs}L"
        a_layout = p.a.blas()
    else:
        a_layout = ("AfNoTrans", lda_override or p.k)
    b_off = _batch_offset(batch_var, p.batch, p.b.batch_strides)
    b_ptr = f"{p.b.ptr} + {b_off} + n0 * {p.b.cs}L"
    b_layout = p.b.blas()
    packs_a = a_layout is None
    packs_b = b_layout is None
    if packs_a:
        lines += _pack_lines("pa", f"({a_ptr})", "(m1 - m0)", f"{p.k}L", p.a.rs, p.a.cs, indent)
        a_ptr, a_layout = "pa", ("AfNoTrans", p.k)
    if packs_b:
        lines += _pack_lines("pb", f"({b_ptr})", f"{p.k}L", "(n1 - n0)", p.b.rs, p.b.cs, indent)
        b_ptr, b_layout = "pb", ("AfNoTrans", -1)
    assert a_layout is not None and b_layout is not None
    ldb = "(n1 - n0)" if packs_b else str(b_layout[1])
    alpha = c_literal(p.alpha, onnx.TensorProto.FLOAT)
    lines.append(
        f"{indent}AF_SGEMM(AfRowMajor, {a_layout[0]}, {b_layout[0]}, (af_blasint)(m1 - m0), "
        f"(af_blasint)(n1 - n0), {p.k}, {alpha}, {a_ptr}, {a_layout[1]}, {b_ptr}, {ldb}, 0.0f, "
        f"{dst}, (af_blasint)({ldd}));"
    )
    return SgemmCall(lines, packs_a, packs_b)


EpilogueCall = Callable[[str, str, str, str, str, str], str]


def emit_chain_body(
    p1: GemmProblem,
    p2: GemmProblem,
    y_ptr: str,
    epilogue1: EpilogueCall | None,
    epilogue2: EpilogueCall | None,
    ratio: tuple[int, int],
    packed: tuple[PackedB | None, PackedB | None] = (None, None),
) -> list[str]:
    """Per row block: GEMM1 -> epilogue1 into a thread buffer -> GEMM2 -> epilogue2 into Y.

    `packed`: the weights of either GEMM packed once (one block of all N columns each).

    `ratio = (num, den)`: a block of `r` rows of the intermediate is `r * num / den` rows of the
    second GEMM's left operand (a Reshape between them that changes the row length).
    """
    if p1.batch or p2.batch:
        raise CodegenUnsupported("a matmul chain needs weights shared across the batch")
    num, den = ratio
    step = math.lcm(8, den // math.gcd(num, den))
    target = max(step, (TILE_ROWS // 2 // step) * step)
    blocks = max(1, -(-p1.m // target))
    if p1.macs + p2.macs >= PARALLEL_MIN_MACS and blocks < 4 and p1.m >= 4 * step:
        blocks = 4
    mb = min(p1.m, _round_up(-(-p1.m // blocks), step))
    blocks = -(-p1.m // mb)
    if (p1.m * num) % den or (mb * num) % den:
        raise CodegenUnsupported("the Reshape between the chained matmuls does not keep row blocks whole")
    k2 = p2.k
    call1 = sgemm_tile(p1, batch_var="0", dst="h", ldd=f"{p1.n}L", indent="      ", packed_b=packed[0])
    full2 = GemmProblem((), p2.m, p2.n, p2.k, p2.a, p2.b, p2.alpha)
    lines = [
        f"  float *restrict Y = {y_ptr};",
        f"  /* {blocks} row blocks of {mb}: [{p1.m}x{p1.k}]x[{p1.k}x{p1.n}]"
        f" -> [{p2.m}x{k2}]x[{k2}x{p2.n}] */",
        "  #pragma omp parallel",
        "  {",
        f"    float *h = (float *)malloc(sizeof(float) * {mb * p1.n});",
    ]
    call2_probe = sgemm_tile(
        full2,
        batch_var="0",
        dst="y",
        ldd=f"{p2.n}L",
        indent="        ",
        a_ptr="h",
        lda_override=k2,
        packed_b=packed[1],
    )
    if call1.packs_a:
        lines.append(f"    float *pa = (float *)malloc(sizeof(float) * {mb * p1.k});")
    if call1.packs_b or call2_probe.packs_b:
        lines.append(f"    float *pb = (float *)malloc(sizeof(float) * {max(p1.k * p1.n, p2.k * p2.n)});")
    lines += [
        "    #pragma omp for schedule(dynamic, 1)",
        f"    for (long blk = 0; blk < {blocks}L; ++blk) {{",
        f"      const long m0 = blk * {mb}L, m1 = m0 + {mb}L < {p1.m}L ? m0 + {mb}L : {p1.m}L;",
        f"      const long n0 = 0, n1 = {p1.n}L;",
        *call1.lines,
    ]
    if epilogue1 is not None:
        lines.append("      " + epilogue1("h", f"{p1.n}L", "m0", "m1", "0", f"{p1.n}L"))
    lines += [
        "      {",
        f"        const long r0 = m0 * {num}L / {den}L, r1 = m1 * {num}L / {den}L;",
        f"        const long m0 = r0, m1 = r1, n0 = 0, n1 = {p2.n}L;",
        f"        float *y = Y + m0 * {p2.n}L;",
        *call2_probe.lines,
    ]
    if epilogue2 is not None:
        lines.append("        " + epilogue2("y", f"{p2.n}L", "m0", "m1", "0", f"{p2.n}L"))
    lines += ["      }", "    }", "    free(h);"]
    if call1.packs_a:
        lines.append("    free(pa);")
    if call1.packs_b or call2_probe.packs_b:
        lines.append("    free(pb);")
    lines.append("  }")
    return parallel_or_serial(lines, blocks > 1 and p1.macs + p2.macs >= PARALLEL_MIN_MACS)


def gemm_c_shape(c_shape: Sequence[int], m: int, n: int) -> tuple[int, ...]:
    """Gemm's C broadcasts unidirectionally to [M, N]."""
    shape = tuple(int(d) for d in c_shape)
    if len(shape) > 2 or any(d not in (1, full) for d, full in zip(shape[::-1], (n, m), strict=False)):
        raise CodegenUnsupported(f"Gemm C of shape {shape} does not broadcast to {[m, n]}")
    return shape
