"""The `attention` template as kernel IR: one parallel loop over (batch, head[, query row chunk]).

What the kernel computes is its `AttentionMatch` (plan/attention_match.py). Two forms:

* **tiles** (Q, K and V fp32 parameters, any strides): per task, one head's K^T and V packed
  into the thread's workspace by the attention tiles of the contraction library
  (backend/cpu/contraction/afa.c), then per block of TILE_ROWS query rows S = scale * Q K^T into
  a workspace slice (the kernel never allocates), the masks and the row softmax in place (the
  library's afa_softmax_row: max, an inline exponential and sum in two passes), and
  O = P V written straight through the output view, each row scaled by 1/sum as it is stored.
  A causal match multiplies only the keys up to each row tile's diagonal.
* **loops** (Q, K or V a 16-bit float or a constant): per task of ROW_BLOCK rows, per row: the
  scores (a dot over D) into a workspace row, scale and masks, max, exponentials and sum, and
  P V accumulated in a second workspace row of Dv floats, stored normalized through the output
  view. Measured 12x slower than the tiles at BERT's shapes (and than the unfused path).

Either way the exponentials flush values below -87 to 0, as the row kernel does, the
head split, K^T and the head merge cost no copy beyond the per-head packing, and the inner loops
carry vector marks so gcc vectorizes them.

Why the tiles and not sgemm per row block (the first form of this kernel): a BLAS call per
64 x 128 x 64 product re-packs both operands each call, and at these sizes packing and call
overhead were most of the time: the fused kernel lost to the unfused path (BLAS over all heads
around a row-softmax kernel) on BERT-base and ViT-B/16. Measurements are in plan/patterns.py
`Attention`, which decides where the planner forms this kernel.
"""

from __future__ import annotations

import numpy as np
import onnx

from ..backend.cpu.contraction import PANEL_QUANTUM
from ..backend.cpu.kernel_spec import KernelSpec
from ..kernel_ir import Assign, Buffer, Call, Declare, DType, Expr, Kernel, Let, Loop, Stmt, Store
from ..kernel_ir import nodes as ir
from ..plan.attention_match import AttentionMatch, View, match_attention
from .values import Unsupported

ROW_BLOCK = 8  # query rows per task: enough tasks to balance threads, few enough loop overheads
# Query rows per block on the tiles path: a 64 x Sk score block stays in L2 (L1 at Sk = 128).
TILE_ROWS = 64
# Tasks the tiles path aims for at least: a batch of fewer heads splits each head's row blocks
# into chunks (each packs its head's K and V again), so every thread of a pool gets work.
MIN_TASKS = 8
# Score rows are padded to a multiple of this many floats (a 512-bit vector's 16 lanes, two of
# AVX2's 8), so every row starts on a whole vector.
SCORE_QUANTUM = 16
_EXP_FLOOR = -87.0  # as the row kernel: exp below this is flushed to 0 (keeps expf vectorized)


def lower_attention(spec: KernelSpec) -> Kernel:
    """The kernel IR of an attention group (`Unsupported` when its match fails)."""
    m = match_attention(spec)
    params = tuple(
        Buffer(f"in{k}", DType.from_onnx(t.elem_type), t.numel, "input") for k, t in enumerate(spec.inputs)
    ) + tuple(
        Buffer(f"out{k}", DType.from_onnx(t.elem_type), t.numel, "output") for k, t in enumerate(spec.outputs)
    )
    buffers = {t.name: b for t, b in zip((*spec.inputs, *spec.outputs), params, strict=True)}
    tables = []
    for k, (name, values) in enumerate(m.tables([t.name for t in spec.inputs])):
        values = np.ascontiguousarray(values).reshape(-1)
        buf = Buffer(
            f"tab{k}",
            DType.from_onnx(onnx.helper.np_dtype_to_tensor_dtype(values.dtype)),
            values.size,
            "const",
        )
        buffers[name] = buf
        tables.append((buf, values))
    if any(b.dtype is not DType.F32 for b in params if b.name.startswith("out")):
        raise Unsupported("attention kernels write fp32")
    if _tiles_apply(m, buffers):
        body = _tiled_body(m, buffers)
        what = "attention: per (batch, head) packed K^T and V, per query row block score tiles, softmax, P*V"
    else:
        body = _body(m, buffers)
        what = "attention: scores, softmax and P*V per (batch, head, query row block)"
    return Kernel(spec.symbol, params, body, tuple(tables), spec.describe(what))


def _at(view: View, buffers: dict[str, Buffer], b: Expr, h: Expr, r: Expr, c: Expr) -> Expr:
    sb, sh, sr, sc = view.strides
    return ir.load(buffers[view.tensor], view.offset + b * sb + h * sh + r * sr + c * sc)


def _body(m: AttentionMatch, buffers: dict[str, Buffer]) -> tuple[Stmt, ...]:
    sq, sk, d, dv, heads = m.seq_q, m.seq_k, m.head_dim, m.value_dim, m.heads
    f32 = DType.F32
    tiles = -(-sq // ROW_BLOCK)
    scores = Buffer("af_scores", f32, sk, "scratch")
    acc = Buffer("af_acc", f32, dv, "scratch")
    t, r, j, k, e = (ir.var(n) for n in ("t", "r", "j", "k", "e"))
    b, h, i0, i, end = (ir.var(n) for n in ("b", "h", "i0", "i", "end"))
    dot, mx, total, p, inv = (ir.var(n, f32) for n in ("dot", "mx", "total", "p", "inv"))

    # s_ij: the scaled, masked score (Where before or after the additive mask, as the graph had it)
    s: Expr = ir.var("dot", f32) * ir.const(m.scale, f32)
    fill = ir.const(m.fill, f32)

    def add(x: Expr) -> Expr:
        return x + _at(m.mask, buffers, b, h, i, j) if m.mask is not None else x

    def where(x: Expr) -> Expr:
        if m.causal is not None:
            return ir.select(ir.le(j, i + m.causal), x, fill)
        if m.cond is not None:
            c = ir.ne(_at(m.cond, buffers, b, h, i, j), ir.const(0, DType.BOOL))
            return ir.select(c, x, fill) if m.keep_if else ir.select(c, fill, x)
        return x

    s = add(where(s)) if m.where_first else where(add(s))
    if m.skips_blocks:
        stop: int | Expr = ir.minimum(i + (m.causal + 1), sk)  # type: ignore[operator]
    else:
        stop = sk
    score_row: tuple[Stmt, ...] = (
        Declare(dot, ir.const(0.0, f32)),
        Loop(k, d, (Assign(dot, dot + _at(m.q, buffers, b, h, i, k) * _at(m.k, buffers, b, h, j, k)),),
             vector=True, reductions=(("sum", dot),)),
        Store(scores, j, s),
    )  # fmt: skip
    x = ir.load(scores, j) - mx
    floor = ir.const(_EXP_FLOOR, f32)
    keep = ir.select(ir.lt(x, floor), ir.const(0.0, f32), ir.const(1.0, f32))
    ex = ir.unary("exp", ir.select(ir.lt(x, floor), floor, x)) * keep
    row: tuple[Stmt, ...] = (
        Let(i, i0 + r),
        Let(end, stop if isinstance(stop, Expr) else ir.index(stop)),
        Loop(j, end, score_row),
        Declare(mx, ir.const(float("-inf"), f32)),
        Loop(j, end, (Assign(mx, ir.maximum(mx, ir.load(scores, j))),), vector=True,
             reductions=(("max", mx),)),
        # a row of -inf scores only: keep 0 as its max so exp never sees inf - inf
        Assign(mx, ir.select(ir.eq(mx, ir.const(float("-inf"), f32)), ir.const(0.0, f32), mx)),
        Declare(total, ir.const(0.0, f32)),
        Loop(j, end, (Let(p, ex), Store(scores, j, p), Assign(total, total + p)), vector=True,
             reductions=(("sum", total),)),
        Loop(e, dv, (Store(acc, e, ir.const(0.0, f32)),), vector=True),
        Loop(j, end, (
            Let(p, ir.load(scores, j)),
            Loop(e, dv, (Store(acc, e, ir.load(acc, e) + p * _at(m.v, buffers, b, h, j, e)),), vector=True),
        )),
        Let(inv, ir.const(1.0, f32) / total),
        Loop(e, dv, (Store(buffers[m.out.tensor], _index(m.out, b, h, i, e), ir.load(acc, e) * inv),),
             vector=True),
    )  # fmt: skip
    task: tuple[Stmt, ...] = (
        Let(b, t // (heads * tiles)),
        Let(h, (t // tiles) % heads),
        Let(i0, (t % tiles) * ROW_BLOCK),
        Loop(r, ir.minimum(ir.index(ROW_BLOCK), sq - i0), row),
    )
    return (Loop(t, m.batch * heads * tiles, task, parallel=True, scratch=(scores, acc)),)


def _tiles_apply(m: AttentionMatch, buffers: dict[str, Buffer]) -> bool:
    """Whether the tiles (afa.c) take Q, K and V: fp32 parameters, read in place through their
    row and column strides (any layout: a heads-inner one has column stride H)."""
    return all(
        buffers[v.tensor].dtype is DType.F32 and buffers[v.tensor].role == "input" for v in (m.q, m.k, m.v)
    )


def _ptr(buf: Buffer, offset: Expr) -> Expr:
    """`buf + offset` as C pointer arithmetic, for a library call's matrix argument."""
    return ir.raw(buf.name, DType.I64) + offset


def _tiled_body(m: AttentionMatch, buffers: dict[str, Buffer]) -> tuple[Stmt, ...]:
    """Per task (one head, or a chunk of its query row blocks when there are few heads): K^T and
    V packed once into the thread's workspace (afa_pack_kt, afa_pack_v), then per block of
    TILE_ROWS query rows S = scale * Q K^T (afa_qk) into the workspace, the masks (a pass of
    their own where there are any) and the softmax row by row (afa_softmax_row: keys past a
    causal diagonal zeroed, 1/sum kept per row), and
    O = diag(1/sum) P V (afa_pv) stored through the output view. A causal match packs and
    multiplies only the keys up to its block's diagonal."""
    sq, sk, d, dv, heads = m.seq_q, m.seq_k, m.head_dim, m.value_dim, m.heads
    f32 = DType.F32
    rows = TILE_ROWS
    tiles = -(-sq // rows)
    # enough tasks to keep every thread busy when the batch has few heads, whole heads otherwise
    chunks = min(tiles, -(-MIN_TASKS // (m.batch * heads)))
    per_chunk = -(-tiles // chunks)
    chunks = -(-tiles // per_chunk)
    lds = -(-sk // SCORE_QUANTUM) * SCORE_QUANTUM
    scores = Buffer("af_scores", f32, rows * lds, "scratch")
    norms = Buffer("af_norms", f32, rows, "scratch")
    kt = Buffer("af_kt", f32, d * _panels(sk), "scratch")
    vp = Buffer("af_vp", f32, sk * _panels(dv), "scratch")
    t, r, j, g = ir.var("t"), ir.var("r"), ir.var("j"), ir.var("g")
    b, h, c, i0, i, n, cols, end, keys = (
        ir.var(x) for x in ("b", "h", "c", "i0", "i", "n", "cols", "end", "keys")
    )
    fill = ir.const(m.fill, f32)
    at = r * lds + j
    s: Expr = ir.load(scores, at)
    if m.mask is not None and not m.where_first:
        s = s + _at(m.mask, buffers, b, h, i, j)
    if m.causal is not None:
        s = ir.select(ir.le(j, i + m.causal), s, fill)
    elif m.cond is not None:
        cond = ir.ne(_at(m.cond, buffers, b, h, i, j), ir.const(0, DType.BOOL))
        s = ir.select(cond, s, fill) if m.keep_if else ir.select(cond, fill, s)
    if m.mask is not None and m.where_first:
        s = s + _at(m.mask, buffers, b, h, i, j)

    def base(view: View, row: Expr) -> Expr:
        sb, sh, sr, _ = view.strides
        return _ptr(buffers[view.tensor], view.offset + b * sb + h * sh + row * sr)

    def keys_to(last_row: Expr) -> Expr:
        """Keys a block of rows up to `last_row` (exclusive) reads: to its diagonal when causal."""
        if m.skips_blocks:
            return ir.minimum(last_row + m.causal, sk)  # type: ignore[operator]
        return ir.index(sk)

    if m.skips_blocks:
        end_of_row: Expr = ir.minimum(i + (m.causal + 1), sk)  # type: ignore[operator]
    else:
        end_of_row = ir.index(sk)
    # row strides (a single row's stride is arbitrary) and column strides
    sr_q, sr_k, sr_v, sr_o = (v.strides[2] if v.shape[2] > 1 else v.shape[3] for v in (m.q, m.k, m.v, m.out))
    cs_q, cs_k, cs_v, cs_o = (v.strides[3] if v.shape[3] > 1 else 1 for v in (m.q, m.k, m.v, m.out))
    # the masks in a pass of their own, where there are any: keys past a causal row's diagonal
    # need none (the row ends there); the softmax itself is the library's (afa_softmax_row)
    masked = m.mask is not None or m.cond is not None or (m.causal is not None and not m.skips_blocks)
    row: tuple[Stmt, ...] = (
        Let(i, i0 + r),
        Let(end, end_of_row),
        *((Loop(j, end, (Store(scores, at, s),), vector=True),) if masked else ()),
        Call("afa_softmax_row", (_ptr(scores, r * lds), end, cols, _ptr(norms, r))),
    )
    scratch0 = ir.index(0)
    # tiles of rows skip the keys past their last row's diagonal (afa.c afa_keys); sk: none skipped
    lead: Expr = i0 + m.causal if m.skips_blocks else ir.index(sk)  # type: ignore[operator]
    block: tuple[Stmt, ...] = (
        Let(i0, g * rows),
        Let(n, ir.minimum(ir.index(rows), sq - i0)),
        Let(cols, keys_to(i0 + n)),
        Call("afa_qk", (n, cols, ir.index(d), ir.const(m.scale, f32), base(m.q, i0), ir.index(sr_q),
                        ir.index(cs_q), _ptr(kt, scratch0), _ptr(scores, scratch0), ir.index(lds), lead)),
        Loop(r, n, row),
        Call("afa_pv", (n, ir.index(dv), cols, _ptr(scores, scratch0), ir.index(lds), _ptr(vp, scratch0),
                        keys, _ptr(norms, scratch0), base(m.out, i0), ir.index(sr_o),
                        ir.index(cs_o), lead)),
    )  # fmt: skip
    last = ir.minimum((c + 1) * per_chunk, tiles)  # type: ignore[operator]
    task: tuple[Stmt, ...] = (
        Let(b, t // (heads * chunks)),
        Let(h, (t // chunks) % heads),
        Let(c, t % chunks),
        Let(keys, keys_to(ir.minimum(last * rows, sq))),
        Call("afa_pack_kt", (keys, ir.index(d), base(m.k, scratch0), ir.index(sr_k), ir.index(cs_k),
                             _ptr(kt, scratch0))),
        Call("afa_pack_v", (keys, ir.index(dv), base(m.v, scratch0), ir.index(sr_v), ir.index(cs_v),
                            _ptr(vp, scratch0))),
        Loop(g, last, block, start=c * per_chunk),
    )  # fmt: skip
    # handed out one at a time even when equal (non-causal): with sleeping workers (threads.py)
    # a worker that joins late then costs at most the tasks it misses, where a static split made
    # the whole kernel wait for its share. On a 2-vCPU AMD EPYC Zen 1 host at 2 threads, with
    # the 12 heads split statically, fused ViT-B/16 ran 1.4x the unfused model in one run of
    # runtime_speed.py although its attention kernels' fastest runs beat the unfused pair; with
    # dynamic tasks attention_speed.py measures fused/unfused 0.94 (ViT-B/16) and 0.82 (BERT).
    return (Loop(t, m.batch * heads * chunks, task, parallel=True, scratch=(scores, norms, kt, vp),
                 dynamic=True),)  # fmt: skip


def _panels(columns: int) -> int:
    """Columns of the packed panels of `columns` columns on any ISA (afa.c: AFA_NR divides 32)."""
    return -(-columns // PANEL_QUANTUM) * PANEL_QUANTUM


def _index(view: View, b: Expr, h: Expr, r: Expr, c: Expr) -> Expr:
    sb, sh, sr, sc = view.strides
    return view.offset + b * sb + h * sh + r * sr + c * sc


__all__ = ["ROW_BLOCK", "TILE_ROWS", "lower_attention"]
