"""MatMul / Gemm anchors as kernel IR: a tiled contraction whose epilogue runs on each hot tile.

What the kernel computes is its `AnchorMatch` (plan/anchor_match.py, the planner's legality
test); this module only renders it:

    for task in 0..tasks (parallel, dynamic):          # tasks = batch x row blocks x column blocks
        bi, m0, n0 = the task's batch entry and tile corner; m1, n1 its far corner
        [pack an operand BLAS cannot address into this thread's workspace slice]
        call contraction(tile of A, tile of B -> tile of the destination)
        for r in rows of the tile:                     # the epilogue, while the tile is in cache
            for c in columns of the tile (vector):
                destination[r, c] <- epilogue(raw product at [r, c], operands)
                other kernel outputs[r * L + c] <- their epilogue values

The kernel owns the parallel loop: each tile is one single-threaded contraction call, since two
thread pools on the same cores fight (DESIGN.md §1). Tasks are handed out dynamically, one at a
time (the atomic costs nothing next to a tile product): on a shared machine a worker thread may be
descheduled for milliseconds, and with a static split the running thread would then wait for the
other's half instead of taking it over (benchmarks/anchors.py measures it).

The epilogue is the same expression machinery as pointwise kernels (lower/values.py): each output
value is resolved at the tile element's index through its producers; the anchor's own output
resolves to a load of the raw product where the contraction left it (plus Gemm's `beta * C`).
Views among the epilogue keep the linear order, so every value leaving the kernel is stored at the
tile element's linear index `r * L + c`, except the destination, which may be a permuted layout
(an output Transpose folded into the contraction's `ldc` and batch offsets).

A match closing with a LayerNormalization (`RowNorm`) leaves the pre-norm value in the
destination, then normalises each row in place: a blocked sum for the mean, one for the variance
of the centred row (the same fp32-lanes-into-double blocking as lower/reduction.py), then one
vector pass writing `(x - mean) * rstd * scale + bias`. The pre-norm value, when the graph reads
it (a transformer's residual stream), is one more epilogue output. Where the rows are normalised
follows from the operand traffic (`full_row_tiles`): tiles of whole rows (the row tile sized to
stay in L2) normalise each row of the hot tile right after its epilogue; but every row tile then
streams the whole weight, so when that costs more than the usual tiles' traffic (BERT-base at 128
tokens: 4 row tiles x 2.4M weight floats against 4 column tiles x 0.4M activation floats), the
usual tiles run and a second parallel loop normalises blocks of rows while they are still in
cache, in the same kernel.

A match opening with a GlobalAveragePool (`PoolPrologue`, a CNN's classifier) gives each task
a workspace slice for the pooled values: before its contraction the task averages the entries
its tile of the left operand reads (its rows, every K), so the pooled tensor never makes a trip
through memory to a kernel of its own; with column tiles a row is pooled once per column tile,
which is N*C*window additions against the tile product's N*C*columns multiply-adds.

`contraction(...)` is the one place that chooses the routine computing a tile product: OpenBLAS
(`af_sgemm_tile`), or, when the right operand is a constant weight shared across the batch and
`AUTOFUSION_CONTRACTION=library` (backend/cpu/contraction), the library's `afc_gemm_bp` on that
weight packed once at load. The kernel then holds the packed weight as a `packed` buffer (one
block of B-panels per column tile) and the `prepack` loop filling it (`pack_weights`), so the
per-call work is only the activation's per-tile packing inside the library.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..backend.cpu.contraction import PANEL_QUANTUM, contraction_mode
from ..backend.cpu.kernel_spec import KernelSpec
from ..kernel_ir import Assign, Buffer, Call, Declare, DType, Expr, Kernel, Let, Loop, Stmt, Store, TensorAt
from ..kernel_ir import nodes as ir
from ..plan.anchor_match import (
    EPILOGUE_VIEW_OPS,
    AnchorMatch,
    Contraction,
    MatrixView,
    PoolPrologue,
    RowNorm,
    match_anchor,
)
from .pointwise import KernelValues
from .reduction import SUM_BLOCK
from .values import IndexGroup, Unsupported, broadcast_index

# Tile shape targets. OpenBLAS packs both operands on every call: the left panel (rows x K) is
# amortized over the tile's columns and the right panel (K x cols) over its rows, so tiles are
# kept tall (all of M up to TILE_ROWS) and about TILE_COLS wide; the 128 x 256 output tile
# (128 KiB) stays in L2 between the contraction that writes it and the epilogue that finishes it.
# Measured on BERT shapes (K = 768, 3072): 128-row tiles beat 64-row ones by 1.3-1.7x.
TILE_ROWS = 128
TILE_COLS = 256
# Narrowest column / row split used to make enough (and an even number of) tiles for the threads.
MIN_TILE_COLS = 64
MIN_TILE_ROWS = 16
MIN_TILES = 4
# Bytes of one tile of whole rows (a LayerNormalization epilogue): the tile is normalised right
# after its contraction, so it should still be in L2 (1-2 MiB per core on current x86 servers,
# shared with the packed operands).
ROW_TILE_BYTES = 512 * 1024
# Rows per task of the normalisation pass after the tile loop (`_norm_pass`).
NORM_ROWS = 16
# Below this many multiply-adds a kernel runs on the calling thread (an OpenMP fork/join costs
# more than it saves, DESIGN.md §1): the floor, for workers that spin between regions (a fork/join
# of 0.5-0.8 us). Loops above it carry their multiply-adds (`Loop.macs`), so that where workers
# sleep at once (OMP_WAIT_POLICY=PASSIVE, backend/cpu/threads.py) and a wake-up costs tens of
# microseconds, the runtime raises the bar from the measured wake-up cost without recompiling.
PARALLEL_MIN_MACS = 1 << 19
# A weight float a product streams costs about as long as this many multiply-adds at the library's
# full rate: a product of few rows (a GEMV) is bound by its weight's bytes, not its multiply-adds
# (`parallel_work`). MLP 784 -> 512 at batch 1: 401K multiply-adds, below PARALLEL_MIN_MACS, took
# 35 us on one thread streaming its 1.6 MB weight (Emerald Rapids), where 401K multiply-adds of a
# GEMM tile take about 5.
STREAMED_WEIGHT_MACS = 8

# The routines `contraction` calls: backend/cpu/blas.py's single-threaded sgemm on row-major tiles,
# or the contraction library's tile with a right operand packed once (backend/cpu/contraction/afc.h).
CONTRACTION_ROUTINE = "af_sgemm_tile"
PACKED_B_ROUTINE = "afc_gemm_bp"
# afc_gemm_bp for a left operand that is a kernel input: packed once per thread and kernel call,
# after BEGIN_CALL_ROUTINE at the kernel's start has retired the previous call's packings
PACKED_B_INPUT_ROUTINE = "afc_gemm_bp_in"
BEGIN_CALL_ROUTINE = "afc_begin_call"
PACK_B_ROUTINE = "afc_pack_b"
PACKED_A_ROUTINE = "afc_gemm_ap"
# afc_gemm_ap for a right operand that is a kernel input: packed once per thread and call (after
# BEGIN_CALL_ROUTINE), reused by the later row chunks of the same tile (lower/conv.py)
PACKED_A_INPUT_ROUTINE = "afc_gemm_ap_in"
# afc_gemm_ap with a conv's common epilogue applied by the library to each tile before its store
# (afc.h's post-ops: the bias per output channel, a residual, then Relu or Clip; AFC_POST_* codes
# below)
PACKED_A_POST_ROUTINE = "afc_gemm_ap_post"
POST_NONE, POST_RELU, POST_CLIP = 0, 1, 2
PACK_A_ROUTINE = "afc_pack_a"
DIRECT_CONV_ROUTINE = "afc_conv_ap"  # lower/conv.py's `conv_direct`: taps read from the input band
DIRECT_ROWS_CONV_ROUTINE = "afc_conv_bp"  # its pixels-as-rows tiles over a padded band
STORE_T_ROUTINE = "afc_store_t"  # a pixels-as-rows tile stored transposed into NCHW
STORE_T_POST_ROUTINE = "afc_store_t_post"  # ... with the post-ops of PACKED_A_POST_ROUTINE
WINOGRAD_ROUTINE = "afc_wino3x3"  # lower/conv.py's `conv_winograd`: F(2x2, 3x3) of 3x3 convs
WINOGRAD_PACK_ROUTINE = "afc_wino3x3_pack"  # ... its weight's 16 transforms as B-panels, at load
DEPTHWISE_3X3_ROUTINE = "afc_dw3x3"  # lower/conv.py: stride-1 depthwise 3x3s
DEPTHWISE_3X3_S2_ROUTINE = "afc_dw3x3_s2"  # ... and stride-2 ones


@dataclass(frozen=True)
class PackedPanels:
    """One operand of a tile as the library's panels, packed once at load: `at` (an `ir.addr`
    into a `packed` buffer) is the first panel of the tile's block (B-panels for the right
    operand of a MatMul/Gemm, A-panels for a conv's weight, the left operand)."""

    at: Expr


def contraction(
    *,
    trans_a: bool,
    m: Expr,
    n: Expr,
    k: int,
    alpha: float,
    a: Expr | PackedPanels,
    lda: Expr | int,
    b: Expr | PackedPanels,
    c: Expr,
    ldc: Expr | int,
    trans_b: bool = False,
    ldb: Expr | int = 0,
    a_input: bool = False,
) -> Call:
    """`c[m x n] = alpha * op(a)[m x k] @ op(b)[k x n]` for one tile, row-major, `a`/`b`/`c` the
    addresses (`ir.addr`) of the tiles' first elements, or `a` / `b` the tile's packed panels
    (that operand's transpose flag and leading dimension then unused). Every anchor kernel,
    MatMul/Gemm and Conv alike, computes its products through this one call, so a faster
    routine plugs in here. `a_input` says `a` is a kernel input, unchanged during the call (not
    a workspace the call rewrites), so the library may keep its packing for the next tile."""
    if isinstance(a, PackedPanels):
        if isinstance(b, PackedPanels):
            raise ValueError("one operand of a tile product is packed at load, not both")
        b_rs, b_cs = (ir.index(1), ir.index(ldb)) if trans_b else (ir.index(ldb), ir.index(1))
        return Call(
            PACKED_A_ROUTINE,
            (m, n, ir.index(k), ir.const(alpha, DType.F32), a.at, b, b_rs, b_cs, c, ir.index(ldc)),
        )
    if isinstance(b, PackedPanels):
        a_rs, a_cs = (ir.index(1), ir.index(lda)) if trans_a else (ir.index(lda), ir.index(1))
        return Call(
            PACKED_B_INPUT_ROUTINE if a_input else PACKED_B_ROUTINE,
            (m, n, ir.index(k), ir.const(alpha, DType.F32), a, a_rs, a_cs, b.at, c, ir.index(ldc)),
        )
    return Call(
        CONTRACTION_ROUTINE,
        (
            ir.index(int(trans_a)),
            ir.index(int(trans_b)),
            m,
            n,
            ir.index(k),
            ir.const(alpha, DType.F32),
            a,
            ir.index(lda),
            b,
            ir.index(ldb),
            c,
            ir.index(ldc),
        ),
    )


def pack_weights(
    *, k: int, n: int, nb: int, b: Buffer, offset: Expr | int, rs: int, cs: int, name: str = "packed_b"
) -> tuple[Buffer, Loop, int]:
    """The prepack of a constant `k x n` right operand (element (i, j) at `b[offset + i*rs + j*cs]`)
    as one block of B-panels per column tile of `nb` columns: the `packed` buffer, the loop
    filling it at load, and the floats between blocks.

    A block is sized for whole PANEL_QUANTUM-column panels, a multiple of every ISA's panel width
    (AFC_NR), so the layout is the same Python arithmetic whatever -march the kernel is built
    for, at most 16 x k floats per block more than an AVX2 build needs."""
    nt = -(-n // nb)
    block = _round_up(-(-nb // PANEL_QUANTUM) * PANEL_QUANTUM * max(k, 1), 16)
    packed = Buffer(name, DType.F32, nt * block, "packed")
    t, n0 = ir.var("t"), ir.var("n0")
    fill = Loop(
        t,
        nt,
        (
            Let(n0, t * nb),
            Call(
                PACK_B_ROUTINE,
                (
                    ir.index(k),
                    ir.minimum(n0 + nb, n) - n0,
                    ir.addr(b, offset + n0 * cs),
                    ir.index(rs),
                    ir.index(cs),
                    ir.addr(packed, t * block),
                ),
            ),
        ),
    )
    return packed, fill, block


def _round_up(x: int, q: int) -> int:
    return -(-x // q) * q


def parallel_work(p: Contraction) -> int:
    """The work of a product as multiply-adds, against PARALLEL_MIN_MACS and the runtime's bar
    (`Loop.macs`): its multiply-adds, or, for few rows, its right operand's floats (each streamed
    once) at STREAMED_WEIGHT_MACS each, whichever is more."""
    return max(p.macs, p.batch_count * p.k * p.n * STREAMED_WEIGHT_MACS)


def tile_sizes(p: Contraction, full_rows: bool = False) -> tuple[int, int]:
    """(rows, columns) of one output tile: near TILE_ROWS x TILE_COLS and equal-sized; when the
    problem is worth parallelising, at least MIN_TILES tiles and an even count (two threads split
    them evenly), made by narrowing columns first, since rows amortize the packing of B.
    `full_rows`: every tile spans all N columns (a row-normalising epilogue), at most
    ROW_TILE_BYTES of them, and only rows are split. Column tiles are whole panels
    (`_panel_columns`) where that gives an even count; otherwise columns are narrowed to
    16-column multiples, then rows split.

    Row tiles are balanced to within a row, not rounded up to 8: the library balances each tile's
    rows over its panels itself (afc_panel_span), and rounded tiles were uneven work. ViT's 197
    tokens made tiles of 104 and 93 rows, one thread's twelve tiles 12% longer than the other's,
    which then took one of them (and packed its rows again): ViT-B/16's projections 3-5% slower
    than with tiles of 99 and 98, the whole model 4.6% (median of 8 interleaved rounds, 2 threads,
    AMD EPYC Zen 4)."""
    row_cap = TILE_ROWS
    if full_rows:
        row_cap = max(8, min(TILE_ROWS, ROW_TILE_BYTES // (4 * max(p.n, 1)) // 8 * 8))
    mct = -(-p.m // row_cap)
    nct = 1 if full_rows else -(-p.n // TILE_COLS)

    def count() -> int:
        return p.batch_count * mct * nct

    work = parallel_work(p)
    if work >= PARALLEL_MIN_MACS and not full_rows:
        nb = _panel_columns(p, p.batch_count * mct, nct)
        if nb is not None:
            return -(-p.m // mct), nb
    if work >= PARALLEL_MIN_MACS:
        while (
            not full_rows and (count() < MIN_TILES or count() % 2) and -(-p.n // (nct + 1)) >= MIN_TILE_COLS
        ):
            nct += 1
        while count() < MIN_TILES and -(-p.m // (mct + 1)) >= MIN_TILE_ROWS:
            mct += 1
    mb = -(-p.m // mct)
    nb = min(p.n, _round_up(-(-p.n // nct), 16))
    return mb, nb


def _panel_columns(p: Contraction, row_tiles: int, parts: int) -> int | None:
    """Columns per tile in whole PANEL_QUANTUM-column panels that make an even count of at least
    MIN_TILES tiles with `row_tiles` row tiles, trying `parts`, `parts + 1`, ... column tiles
    while a tile keeps MIN_TILE_COLS columns; None when no such width exists.

    The count that must be even is that of the tiles the widths really make. Splitting N into
    `parts` and rounding each part up to 16 columns did not ensure it: N = 2304 (a fused QKV
    projection) asked for 10 tiles and got 9 of 240 columns (7.5 panels each) and one of 144, so
    on two threads one ran 5 x 240 columns and the other 4 x 240 + 144; it is now 12 tiles of
    192 (6 panels), 6 per thread, and no tile ends in a half-empty panel."""
    while True:
        width = min(p.n, _round_up(-(-p.n // parts), PANEL_QUANTUM))
        if width < MIN_TILE_COLS:
            return None
        tiles = row_tiles * -(-p.n // width)
        if tiles >= MIN_TILES and tiles % 2 == 0:
            return width
        parts += 1


def full_row_tiles(p: Contraction) -> bool:
    """Whether a row-normalising anchor runs tiles of whole rows: when the floats its tiles stream
    (each row tile reads all of B, each column tile all of its rows of A) are no more than those
    of the usual tiles, which then need a second pass over the rows."""

    def streamed(full_rows: bool) -> int:
        mb, nb = tile_sizes(p, full_rows)
        return p.batch_count * (-(-p.m // mb) * p.k * p.n + -(-p.n // nb) * p.m * p.k)

    return streamed(True) <= streamed(False)


def batch_offset(bi: Expr, batch: Sequence[int], strides: Sequence[int]) -> Expr:
    """Element offset of flat batch entry `bi` over `batch` dims at `strides` (0: broadcast)."""
    offset: Expr = ir.index(0)
    inner = 1
    for a in range(len(batch) - 1, -1, -1):
        d, s = batch[a], strides[a]
        if s:
            idx = bi if inner == 1 else bi // inner
            if a > 0:
                idx = idx % d
            offset = idx * s + offset
        inner *= d
    return offset


class _EpilogueValues(KernelValues):
    """Kernel values where the anchor's output is the raw product in the destination tile."""

    def __init__(self, spec: KernelSpec, match: AnchorMatch) -> None:
        super().__init__(spec)
        self.match = match
        self.raw_at: tuple[Buffer, tuple[int, ...] | None] | None = None  # set by lower_anchor
        # Where the raw product's element 0 of the tile rows sits: subtracted from every raw
        # index, so that a chain's per-thread workspace slice holds only its row block.
        self.raw_origin: Expr | None = None

    def _leaf(self, at: TensorAt) -> Expr | None:
        match = self.match
        if at.tensor != match.anchor.output[0]:
            return super()._leaf(at)
        assert self.raw_at is not None
        buf, strides = self.raw_at
        idx = list(at.index)
        if strides is None:
            where = self.lin(idx, match.domain)
        else:
            where = ir.index(0)
            for e, s in zip(idx, strides, strict=True):
                where = e * s + where if s else where
        if self.raw_origin is not None:
            where = where - self.raw_origin
        value: Expr = ir.load(buf, where)
        if match.addend is not None:
            add = match.addend
            c_idx = broadcast_index(idx, match.domain, add.shape)
            addend = self._substitute(self.at(add.tensor, c_idx))
            value = value + ir.const(add.beta, DType.F32) * addend if add.beta != 1.0 else value + addend
        return value


def _is_raw(match: AnchorMatch, value: str) -> bool:
    """Whether `value` is the raw product itself (the anchor output, or a view of it, no addend)."""
    views = {n.output[0]: n.input[0] for n in match.epilogue if n.op_type in EPILOGUE_VIEW_OPS}
    while value in views:
        value = views[value]
    return value == match.anchor.output[0] and match.addend is None


def destination(
    spec: KernelSpec, values: KernelValues, match: AnchorMatch, what: str
) -> tuple[dict[str, Buffer], str, str, tuple[int, ...] | None, list[str]]:
    """Where an anchor kernel (MatMul/Gemm, Conv, the second half of a chain) puts its result:
    (each output's buffer, the output the contraction writes, the value that output finally
    holds, its store strides (None: dense), the other outputs the epilogue writes at the tile's
    linear index). A closing LayerNormalization's output holds the pre-norm value, normalised in
    place; an output Transpose is stored through its strides; otherwise the product itself, or
    the last epilogue value the kernel returns."""
    out_buf = {t.name: values.params[len(spec.inputs) + k] for k, t in enumerate(spec.outputs)}
    y = match.anchor.output[0]
    flat = [v for v in [y, *(n.output[0] for n in match.epilogue)] if v in out_buf]
    strides: tuple[int, ...] | None = None
    if match.norm is not None:
        dest, value = match.norm.output, match.norm.value
    elif match.tail is not None:
        dest, value, strides = match.tail.output, match.tail.value, match.tail.strides
    else:
        if not flat:
            raise Unsupported(f"no value of the {what} is a kernel output")
        dest = y if y in flat else flat[-1]
        value = dest
    return out_buf, dest, value, strides, [v for v in flat if v != dest]


def anchor_kernel(
    spec: KernelSpec,
    values: KernelValues,
    body: Sequence[Stmt],
    what: str,
    weights: Sequence[tuple[Buffer, Loop, int]],
) -> Kernel:
    """The lowered kernel of an anchor spec: its parameters and constant tables from `values`,
    each packed weight (`pack_weights`) as a packed buffer with its load-time packing loop."""
    return Kernel(
        spec.symbol,
        tuple(values.params),
        tuple(body),
        tuple(values.const_buffers.values()),
        spec.describe(what),
        packed=tuple(w[0] for w in weights),
        prepack=tuple(w[1] for w in weights),
    )


def lower_anchor(spec: KernelSpec, match: AnchorMatch | None = None) -> Kernel:
    """The kernel of a MatMul/Gemm `anchor` spec (its match computed here when not given)."""
    match = match or match_anchor(spec)
    p = match.contraction
    if p is None:
        raise Unsupported(f"{match.anchor.op_type} anchors are not lowered to the kernel IR")
    values = _EpilogueValues(spec, match)
    out_buf, dest, value, strides, flat = destination(spec, values, match, "anchor epilogue")
    values.raw_at = (out_buf[dest], strides)
    write_back = None if _is_raw(match, value) else value
    method = "batched_gemm" if p.batch else "gemm"
    weights: tuple[Buffer, Loop, int] | None = None
    if math.prod(match.domain) == 0:
        body: list[Stmt] = []
    else:
        full_rows = match.norm is not None and full_row_tiles(p)
        weights = _packed_weights(values, p, full_rows)
        body, scratch = _tiles(values, match, p, out_buf[dest], write_back, flat, out_buf, weights, full_rows)
        method += "_packed" if scratch else ""
        if match.norm is not None and not full_rows:
            body.append(_norm_pass(values, match.norm, out_buf[dest], p))
    what = (
        f"method: {method}; {match.anchor.op_type} batch {list(p.batch)} M={p.m} N={p.n} K={p.k}"
        f" (A {_layout(p.a)}, B {_layout(p.b)}); epilogue "
        f"{' -> '.join(n.op_type for n in match.epilogue) or 'none'}"
        + (
            f"; rows normalised (LayerNormalization over {p.n} columns, "
            f"{'in each tile of whole rows' if full_row_tiles(p) else 'after the tiles'})"
            if match.norm
            else ""
        )
        + (f"; A pooled first (GlobalAveragePool of {match.pool.window})" if match.pool else "")
        + (
            f"; stored transposed (ldc {p.c_rs}, batch strides {list(p.c_batch_strides)})"
            if match.tail
            else ""
        )
        + ("; the weight packed once at load (contraction library)" if weights else "")
    )
    return anchor_kernel(spec, values, body, what, [weights] if weights else [])


def _packed_weights(
    values: _EpilogueValues, p: Contraction, full_rows: bool = False
) -> tuple[Buffer, Loop, int] | None:
    """`pack_weights` of the right operand when the library contracts this anchor: the operand
    is a weight (bound to an initializer at every call, `KernelSpec.weights`) passed as an fp32
    parameter, shared across the batch; None: OpenBLAS, which reads both operands in place."""
    if contraction_mode() != "library" or p.b.tensor not in values.spec.weights or p.k < 1 or p.n < 1:
        return None
    b = values.buffer_of(p.b.tensor)
    if b.role != "input" or b.dtype is not DType.F32 or any(p.b.batch_strides):
        return None
    nb = tile_sizes(p, full_rows)[1]
    return pack_weights(k=p.k, n=p.n, nb=nb, b=b, offset=p.b.offset, rs=p.b.rs, cs=p.b.cs)


def method_of(kernel: Kernel) -> str:
    """The method named in a lowered anchor kernel's description."""
    for line in kernel.description.splitlines():
        if line.startswith("method: "):
            return line.split(";")[0].removeprefix("method: ")
    return ""


def _layout(mv: MatrixView) -> str:
    found = mv.blas()
    if found is None:
        return "strided, packed"
    return f"{'Trans' if found[0] else 'NoTrans'} ld {found[1]}"


def _tiles(
    values: _EpilogueValues,
    match: AnchorMatch,
    p: Contraction,
    dest: Buffer,
    write_back: str | None,
    flat: list[str],
    out_buf: dict[str, Buffer],
    weights: tuple[Buffer, Loop, int] | None,
    full_rows: bool = False,
) -> tuple[list[Stmt], bool]:
    mb, nb = tile_sizes(p, full_rows)
    mt, nt = -(-p.m // mb), -(-p.n // nb)
    tasks = p.batch_count * mt * nt
    task, bi, rest = ir.var("task"), ir.var("bi"), ir.var("rest")
    m0, m1, n0, n1 = ir.var("m0"), ir.var("m1"), ir.var("n0"), ir.var("n1")
    head: list[Stmt] = [
        Let(bi, task // (mt * nt)),
        Let(rest, task % (mt * nt)),
        Let(m0, (rest // nt) * mb),
        Let(n0, (rest % nt) * nb),
        Let(m1, ir.minimum(m0 + mb, p.m)),
        Let(n1, ir.minimum(n0 + nb, p.n)),
    ]
    scratch: list[Buffer] = []
    a_at = p.a.offset + batch_offset(bi, p.batch, p.a.batch_strides) + m0 * p.a.rs
    pooled = match.pool is not None
    if match.pool is not None:
        pool_buf = Buffer("pooled", DType.F32, match.pool.entries, "scratch")
        scratch.append(pool_buf)
        values.buffers[match.pool.value] = pool_buf
        head.append(pool_rows(values, match.pool, pool_buf, p.a, a_at, m1 - m0, p.k))
    a_buf, b_buf = values.buffer_of(p.a.tensor), values.buffer_of(p.b.tensor)
    b_at = p.b.offset + batch_offset(bi, p.batch, p.b.batch_strides) + n0 * p.b.cs
    a_layout, b_layout = p.a.blas(), p.b.blas()
    a_ptr = ir.addr(a_buf, a_at)
    b_ptr: Expr = ir.addr(b_buf, b_at)
    ldb: Expr | int
    if a_layout is None:  # neither axis unit-stride: copy the tile's rows into scratch
        pa = Buffer("pa", DType.F32, mb * p.k, "scratch")
        scratch.append(pa)
        i, j = ir.var("pi"), ir.var("pj")
        copy = Store(pa, i * p.k + j, ir.load(a_buf, a_at + i * p.a.rs + j * p.a.cs))
        head.append(Loop(i, m1 - m0, (Loop(j, p.k, (copy,)),)))
        a_ptr, a_layout = ir.addr(pa, 0), (False, p.k)
    ldb = b_layout[1] if b_layout is not None else 0
    b_arg: Expr | PackedPanels = b_ptr
    if weights is not None:  # the tile's block of the weight packed at load (any strides)
        packed, _, block = weights
        b_arg, b_layout = PackedPanels(ir.addr(packed, (rest % nt) * block)), (False, 0)
    elif b_layout is None:
        pb = Buffer("pb", DType.F32, p.k * nb, "scratch")
        scratch.append(pb)
        i, j = ir.var("pi"), ir.var("pj")
        copy = Store(pb, i * (n1 - n0) + j, ir.load(b_buf, b_at + i * p.b.rs + j * p.b.cs))
        head.append(Loop(i, p.k, (Loop(j, n1 - n0, (copy,), vector=True),)))
        b_arg, b_layout, ldb = ir.addr(pb, 0), (False, 0), n1 - n0
    y_at = batch_offset(bi, p.batch, p.c_batch_strides) + m0 * p.c_rs + n0
    head.append(
        contraction(
            trans_a=a_layout[0],
            trans_b=b_layout[0],
            m=m1 - m0,
            n=n1 - n0,
            k=p.k,
            alpha=p.alpha,
            a=a_ptr,
            lda=a_layout[1],
            b=b_arg,
            ldb=ldb,
            c=ir.addr(dest, y_at),
            ldc=p.c_rs,
            a_input=a_ptr.buffer.role == "input",
        )
    )
    if write_back is not None or flat:
        rows = (bi * p.m + m0, bi * p.m + m1)
        head.append(epilogue_nest(values, match, dest, write_back, flat, out_buf, rows, (n0, n1)))
    if match.norm is not None and full_rows:
        head.append(norm_rows(values, match.norm, dest, (bi * p.m + m0, bi * p.m + m1)))
    work = parallel_work(p)
    parallel = tasks > 1 and work >= PARALLEL_MIN_MACS
    loop = Loop(
        task, tasks, tuple(head), parallel=parallel, dynamic=parallel, scratch=tuple(scratch), macs=work
    )
    # a library tile that keeps its packing of the input for the call's later tiles needs the
    # call's start marked, so that no packing of an earlier call is taken for this one's
    keeps = any(isinstance(s, Call) and s.function == PACKED_B_INPUT_ROUTINE for s in head)
    return ([Call(BEGIN_CALL_ROUTINE, ())] if keeps else []) + [loop], len(scratch) > int(pooled)


def _row_sum(j: ir.Var, n: int, term: Expr, name: str) -> tuple[list[Stmt], ir.Var]:
    """The statements summing `term` (an fp32 expression of `j`) over j in [0, n), and the
    double total: fp32 vector lanes over blocks of SUM_BLOCK, blocks added in double, as the row
    kernels sum (lower/reduction.py), which keeps a mean within fp32 rounding of onnxruntime's."""
    total, part = ir.var(f"{name}_t", DType.F64), ir.var(f"{name}_p", DType.F32)
    jb, je = ir.var(f"{name}_jb"), ir.var(f"{name}_je")
    lanes = Loop(j, je, (Assign(part, part + term),), vector=True, start=jb, reductions=(("sum", part),))
    chunk: tuple[Stmt, ...] = (
        Let(je, ir.minimum(jb + min(n, SUM_BLOCK), n)),
        Declare(part, ir.const(0.0, DType.F32)),
        lanes,
        Assign(total, total + ir.cast(part, DType.F64)),
    )
    return [Declare(total, ir.const(0.0, DType.F64)), Loop(jb, n, chunk, step=min(n, SUM_BLOCK))], total


def pool_rows(
    values: KernelValues, pool: PoolPrologue, dest: Buffer, a: MatrixView, a_at: Expr, rows: Expr, k: int
) -> Loop:
    """The pooled entries a tile of the left operand reads (`rows` rows of `k` from `a_at`, at
    `a`'s strides), each the mean of its window of the pooled input, stored where the operand
    reads them in `dest` (the pooled value's dense layout)."""
    i, kk, w, e = ir.var("pi"), ir.var("pk"), ir.var("pw"), ir.var("pe")
    src = values.buffer_of(pool.tensor)
    stmts, total = _row_sum(w, pool.window, ir.load(src, e * pool.window + w), "pp")
    mean = ir.cast(total / ir.const(float(pool.window), DType.F64), DType.F32)
    entry = (Let(e, a_at + i * a.rs + kk * a.cs), *stmts, Store(dest, e, mean))
    return Loop(i, rows, (Loop(kk, k, entry),))


def _norm_pass(values: KernelValues, norm: RowNorm, dest: Buffer, p: Contraction) -> Loop:
    """The rows normalised after the tile loop: blocks of NORM_ROWS rows, parallel when the
    product was (the destination is dense, `batch x M` rows of N)."""
    rows = p.batch_count * p.m
    blocks = -(-rows // NORM_ROWS)
    blk, r0 = ir.var("nblk"), ir.var("nr0")
    block = (Let(r0, blk * NORM_ROWS), norm_rows(values, norm, dest, (r0, ir.minimum(r0 + NORM_ROWS, rows))))
    return Loop(blk, blocks, block, parallel=blocks > 1 and p.macs >= PARALLEL_MIN_MACS, macs=p.macs)


def norm_rows(values: KernelValues, norm: RowNorm, dest: Buffer, rows: tuple[Expr, Expr]) -> Loop:
    """LayerNormalization, in place, of rows [rows) of `dest` (dense rows of `norm.columns`):
    the mean, the variance of the centred row (two passes, not E[x^2] - mean^2, which cancels),
    then `(x - mean) * rstd * scale + bias` stored over the row."""
    n = norm.columns
    r, j, base = ir.var("nr"), ir.var("nj"), ir.var("nbase")
    mean, rstd = ir.var("nmean", DType.F32), ir.var("nrstd", DType.F32)
    x = ir.load(dest, base + j)
    body: list[Stmt] = [Let(base, r * n)]
    stmts, total = _row_sum(j, n, x, "ns")
    body += [*stmts, Let(mean, ir.cast(total / ir.const(float(n), DType.F64), DType.F32))]
    stmts, total = _row_sum(j, n, (x - mean) * (x - mean), "nv")
    var = ir.cast(total / ir.const(float(n), DType.F64), DType.F32)
    eps = ir.const(norm.epsilon, DType.F32)
    body += [*stmts, Let(rstd, ir.const(1.0, DType.F32) / ir.unary("sqrt", var + eps))]
    y = (x - mean) * rstd * ir.load(values.buffer_of(norm.scale), j)
    if norm.bias is not None:
        y = y + ir.load(values.buffer_of(norm.bias), j)
    body.append(Loop(j, n, (Store(dest, base + j, y),), vector=True))
    return Loop(r, rows[1], tuple(body), start=rows[0])


def _axes(flat: Expr, dims: Sequence[int]) -> list[Expr]:
    """The multi-index over `dims` of the linear index `flat`, as expressions."""
    out: list[Expr] = []
    for a, d in enumerate(dims):
        stride = math.prod(dims[a + 1 :])
        outermost = all(x == 1 for x in dims[:a])
        out.append(ir.index(0) if d == 1 else flat // stride if outermost else (flat // stride) % d)
    return out


def epilogue_nest(
    values: _EpilogueValues,
    match: AnchorMatch,
    dest: Buffer,
    write_back: str | None,
    flat: list[str],
    out_buf: dict[str, Buffer],
    rows: tuple[Expr, Expr],
    cols: tuple[Expr, Expr],
    dest_origin: Expr | None = None,
) -> Loop:
    """The epilogue over the tile just computed: rows `r` in [rows) over the flattened leading
    `match.split` domain axes (batch x M; a conv's N x C), columns `c` in [cols) over the rest
    (N; a conv's pixels), every output value resolved at the domain index and stored.
    `dest_origin`: subtracted from the destination's index (a workspace holding one row block)."""
    domain, split = match.domain, match.split
    row_dims, col_dims = domain[:split], domain[split:]
    r, c = ir.var("r"), ir.var("c")
    row_lets: list[Stmt] = []
    names: list[Expr] = [r] * len(row_dims)  # none for MatMul(vector, B)
    if len(row_dims) > 1:
        row_vars = [ir.var(f"i{a}") for a in range(len(row_dims))]
        row_lets = [Let(v, e) for v, e in zip(row_vars, _axes(r, row_dims), strict=True)]
        names = list(row_vars)
    # One column axis at most for a GEMM (none for MatMul(A, vector)); a conv's spatial axes are
    # expressions of the pixel index, not lets, so that the ones no value reads cost nothing
    # (an unused division would keep the vector loop scalar).
    names += _axes(c, col_dims) if len(col_dims) > 1 else [c] * len(col_dims)
    values.new_scope()
    values.clean, values.assume = {}, {}
    values.groups = []
    rows_total = math.prod(row_dims)
    linear = r * math.prod(col_dims) + c if col_dims else r
    for value in [match.anchor.output[0], *(n.output[0] for n in match.epilogue)]:
        _declare_groups(values, values.shape(value), names, domain, rows_total, r, c, linear)
    # Every value is computed before anything is stored: the destination holds the raw product
    # until the end of the element (a value read through a view reads it at another expression).
    lets: list[Stmt] = []
    stores: list[Stmt] = []
    if write_back is not None:
        if match.tail is None:
            where = linear
        else:
            where = ir.index(0)
            for e, s in zip(names, match.tail.strides, strict=True):
                where = e * s + where if s else where
        if dest_origin is not None:
            where = where - dest_origin
        v = ir.var("wb", DType.F32)
        lets.append(Let(v, _resolve(values, write_back, names, domain)))
        stores.append(Store(dest, where, v))
    for k, name in enumerate(flat):
        v = ir.var(f"o{k}", DType.F32)
        lets.append(Let(v, _resolve(values, name, names, domain)))
        stores.append(Store(out_buf[name], linear, v))
    inner = Loop(c, cols[1], (*lets, *stores), vector=True, start=cols[0])
    return Loop(r, rows[1], (*row_lets, inner), start=rows[0])


def _declare_groups(
    values: _EpilogueValues,
    shape: tuple[int, ...],
    names: list[Expr],
    domain: tuple[int, ...],
    rows: int,
    r: Expr,
    c: Expr,
    linear: Expr,
) -> None:
    """Let `lin` see through a value's index derived from the domain's: its leading axes that
    span the tile rows decompose `r`, the rest decompose `c`, the whole the linear index. A view
    (`[B*S, N] -> [B, S, N]`) then reads its operands at `r * N + c`, not at
    `((r / S) * S + r % S) * N + c`."""
    idx = list(names) if tuple(shape) == tuple(domain) else values.reshape_index(names, domain, shape)
    values.groups.append(IndexGroup(tuple(idx), tuple(shape), linear))
    for k in range(len(shape), -1, -1):
        if math.prod(shape[:k]) == rows:
            if k > 1:
                values.groups.append(IndexGroup(tuple(idx[:k]), tuple(shape[:k]), r))
            if len(shape) - k > 1:
                values.groups.append(IndexGroup(tuple(idx[k:]), tuple(shape[k:]), c))
            break


def _resolve(values: _EpilogueValues, name: str, names: list[Expr], domain: tuple[int, ...]) -> Expr:
    shape = values.shape(name)
    idx = names if tuple(shape) == tuple(domain) else values.reshape_index(names, domain, shape)
    return values.resolve(name, idx)
