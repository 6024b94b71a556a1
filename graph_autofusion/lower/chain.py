"""Two chained MatMul/Gemm anchors as kernel IR: per row block, both products and both epilogues,
the intermediate in a per-thread workspace slice that never leaves the cache.

What the kernel computes is its `ChainMatch` (plan/anchor_match.py); each half is the
`AnchorMatch` of a one-anchor spec over that half's nodes (`sub_spec`), so the operand views,
Gemm addends and output tails are the planner's, not re-derived here:

    for blk in 0..blocks (parallel, dynamic):            # row blocks of the first product
        m0, m1 = the block's rows
        contraction(A1 rows [m0, m1), B1 -> h)           # h: this thread's workspace slice
        for r, c in the block: h[r - m0, c] <- middle epilogue(h[r - m0, c])
        contraction(h, B2 -> Y rows [m0, m1))
        for r, c in the block: Y[r, c] (and other outputs) <- epilogue(Y[r, c])

A view between the two products keeps the rows (the match says so), so a row block of the first
product is the same row block of the second's left operand. Both products go through
`lower.anchor.contraction`, so with `AUTOFUSION_CONTRACTION=library` each constant weight is
packed once at load as one block of all its columns (the chain computes whole rows).
"""

from __future__ import annotations

import math

import onnx

from ..backend.cpu.contraction import contraction_mode
from ..backend.cpu.kernel_spec import KernelSpec
from ..kernel_ir import Buffer, DType, Expr, Kernel, Let, Loop, Stmt
from ..kernel_ir import nodes as ir
from ..plan.anchor_match import AnchorMatch, ChainMatch, Contraction, match_anchor, match_chain
from .anchor import (
    PARALLEL_MIN_MACS,
    TILE_ROWS,
    PackedPanels,
    _EpilogueValues,
    _is_raw,
    _round_up,
    anchor_kernel,
    contraction,
    destination,
    epilogue_nest,
    norm_rows,
    pack_weights,
    parallel_work,
)
from .schedule import two_ended_makespan
from .values import Unsupported

# Rows of the intermediate per block: half an anchor tile, so that the block's intermediate (rows x
# N1 floats) stays in L2 between the two products; of the splits the threads finish equally soon,
# the one with blocks nearest this many rows (`row_blocks`).
CHAIN_ROWS = TILE_ROWS // 2
# Rows of a block are a multiple of this: half an AVX-512 row panel, which the micro-kernel runs
# at half the cost (afc.c's `afc_ukernel`), as the convs' pixel tiles with the pixels as rows.
CHAIN_ROW_STEP = 4
# A block's fixed cost, in rows: it streams both weights again and makes its calls. ViT-B/16's
# MLP chain (768 -> 3072 -> 768) in 4 blocks of 52 rows took 1.065x its time in 2 blocks of 100
# where rows alone account for 1.04x (Zen 5): about 3 rows a block.
CHAIN_BLOCK_ROWS = 4
# The most rows of a block: each thread's workspace holds one block's intermediate (3 MB of a
# 3072-wide one), and a thread slowed for a while costs the kernel at most one block.
CHAIN_MAX_ROWS = 2 * TILE_ROWS
# Fewer rows than this run as one block: each row block streams both weights again, which so few
# rows do not amortize.
CHAIN_PARALLEL_MIN_ROWS = 32
# Fewer rows than this make the products GEMV-shaped, bound by streaming their weights
# (`_streams_alone`).
CHAIN_STREAMING_ROWS = 8


def sub_spec(
    spec: KernelSpec, symbol: str, nodes: list[onnx.NodeProto], extra_outputs: list[str]
) -> KernelSpec:
    """A one-anchor spec over part of a chain's body; its parameters keep the body's tensor names
    (`extra_outputs`: the intermediate, an output of the first half and an input of the second)."""
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
        weights=spec.weights & frozenset(reads),
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


def chain_halves(spec: KernelSpec, chain: ChainMatch) -> tuple[AnchorMatch, AnchorMatch]:
    """The anchor matches of the chain's two halves: first + middle (ending in the second's left
    operand), second + epilogue (reading it)."""
    h = chain.second.input[0]
    first = sub_spec(spec, f"{spec.symbol}_s1", [chain.first, *chain.middle], [h])
    second = sub_spec(spec, f"{spec.symbol}_s2", [chain.second, *chain.epilogue], [h])
    return match_anchor(first), match_anchor(second)


def row_blocks(p1: Contraction, p2: Contraction) -> tuple[int, int]:
    """(rows per block, blocks): of the splits into equal blocks of whole CHAIN_ROW_STEPs and at
    most CHAIN_MAX_ROWS rows, the one two threads finish soonest (`two_ended_makespan`, a block
    costing its rows and CHAIN_BLOCK_ROWS), then the one with blocks nearest CHAIN_ROWS rows;
    blocks of CHAIN_ROWS, run in turn, where the chain is not worth parallelising or has fewer
    than CHAIN_PARALLEL_MIN_ROWS rows.

    Blocks of about CHAIN_ROWS rounded up to 8 rows, at least four, had left ViT-B/16's 197
    tokens in blocks of 56, 56, 56 and 29: two blocks for one thread, one and a half for the
    other. Its dynamo export's MLP chains took 50.1 ms in all, 44.4 in two blocks of 100 rows,
    against 47.8 for the two products as separate kernels (one process, fastest of 18 profiled
    runs each, two threads, AMD EPYC Zen 5). The intermediate of 100 rows (1.2 MB) is past that
    host's 1 MiB of L2 and still faster: written and read back once, it costs far less than a
    thread idle for a quarter of the kernel. GPT-2's 128 tokens (4 blocks of 32 before, 2 of 64
    now) measured even."""
    m, step = p1.m, CHAIN_ROW_STEP
    if parallel_work(p1) + parallel_work(p2) < PARALLEL_MIN_MACS or m < CHAIN_PARALLEL_MIN_ROWS:
        mb = min(m, CHAIN_ROWS)  # in turn on one thread: blocks only keep the intermediate in L2
        return mb, -(-m // mb)
    best: tuple[tuple[float, int], int] | None = None
    for blocks in range(1, -(-m // step) + 1):
        mb = _round_up(-(-m // blocks), step)
        if mb > CHAIN_MAX_ROWS:
            continue
        costs = [min(mb, m - i * mb) + CHAIN_BLOCK_ROWS for i in range(-(-m // mb))]
        key = (two_ended_makespan(costs), abs(mb - CHAIN_ROWS))
        if best is None or key < best[0]:
            best = (key, mb)
    assert best is not None
    return best[1], -(-m // best[1])


def _weights(values: _EpilogueValues, p: Contraction, name: str) -> tuple[Buffer, Loop, int] | None:
    """The right operand packed once at load as one block of all columns when the library
    contracts (a weight bound at every call, fp32, shared across rows); None: OpenBLAS."""
    if contraction_mode() != "library" or p.b.tensor not in values.spec.weights or p.k < 1 or p.n < 1:
        return None
    b = values.buffer_of(p.b.tensor)
    if b.role != "input" or b.dtype is not DType.F32:
        return None
    return pack_weights(k=p.k, n=p.n, nb=p.n, b=b, offset=p.b.offset, rs=p.b.rs, cs=p.b.cs, name=name)


def _right(
    values: _EpilogueValues, p: Contraction, weights: tuple[Buffer, Loop, int] | None
) -> tuple[Expr | PackedPanels, bool, int]:
    if weights is not None:
        return PackedPanels(ir.addr(weights[0], 0)), False, 0
    layout = p.b.blas()
    if layout is None:
        raise Unsupported("a chained weight BLAS cannot read in place")
    return ir.addr(values.buffer_of(p.b.tensor), p.b.offset), layout[0], layout[1]


class StreamingChain(Unsupported):
    """A chain that would run on one thread while its products are bound by their weights'
    bytes (`_streams_alone`): the caller runs its two products as stages, each split over the
    threads, and takes the chain anyway (`decline_streaming=False`) where the stages cannot be."""


def _streams_alone(p1: Contraction, blocks: int, work: int) -> bool:
    """Whether one row block of GEMV-shaped products (fewer rows than CHAIN_STREAMING_ROWS: streaming
    their weights costs more than their multiply-adds) carries `work` (`parallel_work` of both)
    worth the thread team. A batch-1 MLP's two GEMVs then stream both weights from one core (MLP
    784 -> 512 -> 256: 43 us against onnxruntime's 30 on two threads, Emerald Rapids)."""
    return blocks == 1 and p1.m < CHAIN_STREAMING_ROWS and work >= PARALLEL_MIN_MACS


def lower_chain(spec: KernelSpec, chain: ChainMatch | None = None, decline_streaming: bool = True) -> Kernel:
    """The kernel of an `anchor_chain` spec; raises `Unsupported` when its layout rules out row
    blocks (the caller then runs the halves as two anchor kernels), and `StreamingChain` (unless
    `decline_streaming` is off) when its one row block would stream large weights on one thread."""
    chain = chain or match_chain(spec)
    match1, match2 = chain_halves(spec, chain)
    p1, p2 = match1.contraction, match2.contraction
    h = chain.second.input[0]
    if p1 is None or p2 is None or p1.batch or p2.batch:
        raise Unsupported("a matmul chain needs weights shared across the batch")
    if match1.tail is not None or p1.c_rs != p1.n:
        raise Unsupported("the chain's intermediate is not a dense row block")
    a2 = p2.a
    if a2.tensor != h or a2.offset or a2.rs != p2.k or a2.cs != 1 or p1.n != p2.k or p1.m != p2.m:
        raise Unsupported("the second matmul does not read the intermediate's rows in place")
    a1 = p1.a.blas()
    if a1 is None:
        raise Unsupported("the first matmul's left operand needs packing")
    values = _EpilogueValues(spec, match1)
    w1, w2 = _weights(values, p1, "packed_b1"), _weights(values, p2, "packed_b2")
    b1, tb1, ldb1 = _right(values, p1, w1)
    b2, tb2, ldb2 = _right(values, p2, w2)

    # The second half's destination, as a single anchor's.
    out_buf, dest, value, strides, flat = destination(spec, values, match2, "chain's epilogue")
    write_back2 = None if _is_raw(match2, value) else value
    write_back1 = None if _is_raw(match1, h) else h

    cols1, cols2 = (ir.index(0), ir.index(p1.n)), (ir.index(0), ir.index(p2.n))
    mb, blocks = row_blocks(p1, p2)
    work = parallel_work(p1) + parallel_work(p2)
    if decline_streaming and _streams_alone(p1, blocks, work):
        raise StreamingChain(
            f"{p1.m} row(s) make one row block, on one thread, while the weights' streaming is "
            "worth splitting over the threads by columns"
        )
    ws = Buffer("h", DType.F32, mb * p1.n, "scratch")
    blk, m0, m1 = ir.var("blk"), ir.var("m0"), ir.var("m1")
    body: list[Stmt] = [Let(m0, blk * mb), Let(m1, ir.minimum(m0 + mb, p1.m))]
    body.append(
        contraction(
            trans_a=a1[0],
            m=m1 - m0,
            n=ir.index(p1.n),
            k=p1.k,
            alpha=p1.alpha,
            a=ir.addr(values.buffer_of(p1.a.tensor), p1.a.offset + m0 * p1.a.rs),
            lda=a1[1],
            b=b1,
            trans_b=tb1,
            ldb=ldb1,
            c=ir.addr(ws, 0),
            ldc=p1.n,
        )
    )
    if write_back1 is not None:
        values.raw_at, values.raw_origin = (ws, None), m0 * p1.n
        body.append(
            epilogue_nest(
                values,
                match1,
                ws,
                write_back1,
                [],
                out_buf,
                (m0, m1),
                cols1,
                m0 * p1.n,
            )
        )
    y_buf = out_buf[dest]
    body.append(
        contraction(
            trans_a=False,
            m=m1 - m0,
            n=ir.index(p2.n),
            k=p2.k,
            alpha=p2.alpha,
            a=ir.addr(ws, 0),
            lda=p2.k,
            b=b2,
            trans_b=tb2,
            ldb=ldb2,
            c=ir.addr(y_buf, m0 * p2.c_rs),
            ldc=p2.c_rs,
        )
    )
    if write_back2 is not None or flat:
        values.match, values.raw_at, values.raw_origin = match2, (y_buf, strides), None
        body.append(epilogue_nest(values, match2, y_buf, write_back2, flat, out_buf, (m0, m1), cols2))
    if match2.norm is not None:
        body.append(norm_rows(values, match2.norm, y_buf, (m0, m1)))
    parallel = blocks > 1 and work >= PARALLEL_MIN_MACS
    loop = Loop(blk, blocks, tuple(body), parallel=parallel, dynamic=parallel, scratch=(ws,), macs=work)
    weights = [w for w in (w1, w2) if w is not None]
    middle = " -> ".join(n.op_type for n in match1.epilogue) or "none"
    after = " -> ".join(n.op_type for n in match2.epilogue) or "none"
    what = (
        f"method: matmul_chain; [{p1.m}x{p1.k}]x[{p1.k}x{p1.n}] -> {middle}"
        f" -> [{p2.m}x{p2.k}]x[{p2.k}x{p2.n}] -> {after}"
        + ("; rows normalised (LayerNormalization)" if match2.norm else "")
        + f"; {blocks} row blocks of {mb},"
        " the intermediate in a per-thread workspace slice"
        + (f"; {len(weights)} weight(s) packed once at load (contraction library)" if weights else "")
    )
    return anchor_kernel(spec, values, [loop] if math.prod(match2.domain) and p1.m else [], what, weights)
