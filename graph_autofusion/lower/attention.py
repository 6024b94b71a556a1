"""The `attention` template as kernel IR: one parallel loop over (batch, head, query row block).

What the kernel computes is its `AttentionMatch` (plan/attention_match.py). Two forms:

* **sgemm** (Q, K, V and the output have unit-stride rows, the usual head split): per task of
  BLAS_ROWS query rows of one (b, h), S = scale * Q K^T by one sgemm into a per-thread slice of
  the caller's workspace (loop scratch: the kernel never allocates), the masks and the row
  softmax in place, then O = P V by a second sgemm written straight through the output view,
  each output row scaled by 1/sum. A causal match stops both sgemms at the block's diagonal.
* **loops** (any other strides): per task of ROW_BLOCK rows, per row: the scores (a dot over D)
  into a workspace row, scale and masks, max, exponentials and sum, and P V accumulated in a
  second workspace row of Dv floats, stored normalized through the output view.

Either way the exponentials are the row kernel's (exp of values <= 0, flushed below -87), the
head split, K^T and the head merge cost no copy, and the inner loops carry vector marks so gcc
vectorizes them. Measured on the CPU the unfused path (the same sgemms as anchor kernels around
a row-softmax kernel) was faster, so the planner forms attention for the cpu profile only on
request (plan/patterns.py `Attention`).
"""

from __future__ import annotations

import numpy as np
import onnx

from ..backend.cpu.kernel_spec import KernelSpec
from ..kernel_ir import Assign, Buffer, Call, Declare, DType, Expr, Kernel, Let, Loop, Stmt, Store
from ..kernel_ir import nodes as ir
from ..plan.attention_match import AttentionMatch, View, match_attention
from .values import Unsupported

ROW_BLOCK = 8  # query rows per task: enough tasks to balance threads, few enough loop overheads
# Query rows per task on the BLAS path: a 64 x Sk score block stays in L2 and gives sgemm
# matrices big enough to run at speed (32 and 128 measured no better on BERT-base).
BLAS_ROWS = 64
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
    if _unit_rows(m) and not any(b.role == "const" for b in buffers.values()):
        body = _blas_body(m, buffers)
        what = "attention: per (batch, head, query row block) sgemm scores, softmax, sgemm P*V"
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


def _unit_rows(m: AttentionMatch) -> bool:
    """Whether Q, K, V and the output have unit-stride rows: each (b, h) slice is then a
    row-major matrix with a leading dimension, which a BLAS call takes in place."""
    return all(v.strides[3] == 1 or v.shape[3] == 1 for v in (m.q, m.k, m.v, m.out))


def _ptr(buf: Buffer, offset: Expr) -> Expr:
    """`buf + offset` as C pointer arithmetic, for a library call's matrix argument."""
    return ir.raw(buf.name, DType.I64) + offset


def _blas_body(m: AttentionMatch, buffers: dict[str, Buffer]) -> tuple[Stmt, ...]:
    """Per task of BLAS_ROWS query rows: S = scale * Q K^T by one sgemm into the thread's
    workspace slice, the masks and the exponentials row by row (keys past a causal diagonal
    zeroed, 1/sum kept per row), O = P V by a second sgemm written through the output view, and
    each output row scaled by its 1/sum (Dv multiplies per row instead of Sk)."""
    sq, sk, d, dv, heads = m.seq_q, m.seq_k, m.head_dim, m.value_dim, m.heads
    f32 = DType.F32
    rows = BLAS_ROWS
    tiles = -(-sq // rows)
    scores = Buffer("af_scores", f32, rows * sk, "scratch")
    norms = Buffer("af_norms", f32, rows, "scratch")
    t, r, j, e = ir.var("t"), ir.var("r"), ir.var("j"), ir.var("e")
    b, h, i0, i, n, cols, end = (ir.var(x) for x in ("b", "h", "i0", "i", "n", "cols", "end"))
    mx, total, p = (ir.var(x, f32) for x in ("mx", "total", "p"))
    fill = ir.const(m.fill, f32)
    at = r * sk + j
    s: Expr = ir.load(scores, at)
    if m.mask is not None and not m.where_first:
        s = s + _at(m.mask, buffers, b, h, i, j)
    if m.causal is not None:
        s = ir.select(ir.le(j, i + m.causal), s, fill)
    elif m.cond is not None:
        c = ir.ne(_at(m.cond, buffers, b, h, i, j), ir.const(0, DType.BOOL))
        s = ir.select(c, s, fill) if m.keep_if else ir.select(c, fill, s)
    if m.mask is not None and m.where_first:
        s = s + _at(m.mask, buffers, b, h, i, j)
    x = ir.load(scores, at) - mx
    floor = ir.const(_EXP_FLOOR, f32)
    keep = ir.select(ir.lt(x, floor), ir.const(0.0, f32), ir.const(1.0, f32))
    ex = ir.unary("exp", ir.select(ir.lt(x, floor), floor, x)) * keep
    zero = ir.const(0.0, f32)

    def base(view: View, row: Expr) -> Expr:
        sb, sh, sr, _ = view.strides
        return _ptr(buffers[view.tensor], view.offset + b * sb + h * sh + row * sr)

    out = buffers[m.out.tensor]
    at_out = _index(m.out, b, h, i0 + r, e)
    if m.skips_blocks:
        cols_of_block: Expr = ir.minimum(i0 + n + m.causal, sk)  # type: ignore[operator]
        end_of_row: Expr = ir.minimum(i + (m.causal + 1), sk)  # type: ignore[operator]
    else:
        cols_of_block = ir.index(sk)
        end_of_row = ir.index(sk)
    no, tr = ir.raw("AfNoTrans", DType.I64), ir.raw("AfTrans", DType.I64)
    row_major = ir.raw("AfRowMajor", DType.I64)
    # leading dimensions (a single row's stride is arbitrary: BLAS wants at least the row length)
    sr_q, sr_k, sr_v, sr_o = (v.strides[2] if v.shape[2] > 1 else v.shape[3] for v in (m.q, m.k, m.v, m.out))
    row: tuple[Stmt, ...] = (
        Let(i, i0 + r),
        Let(end, end_of_row),
        Declare(mx, ir.const(float("-inf"), f32)),
        Loop(j, end, (Let(p, s), Store(scores, at, p), Assign(mx, ir.maximum(mx, p))), vector=True,
             reductions=(("max", mx),)),
        # a row of -inf scores only: keep 0 as its max so exp never sees inf - inf
        Assign(mx, ir.select(ir.eq(mx, ir.const(float("-inf"), f32)), zero, mx)),
        Declare(total, zero),
        Loop(j, end, (Let(p, ex), Store(scores, at, p), Assign(total, total + p)), vector=True,
             reductions=(("sum", total),)),
        Store(norms, r, ir.const(1.0, f32) / total),
        # keys past this row's diagonal but inside the block's columns weigh nothing in P V
        Loop(j, cols, (Store(scores, at, zero),), vector=True, start=end),
    )  # fmt: skip
    # each output row times 1/sum of its exponentials, once P V is written (Dv, not Sk, per row)
    normalize = Loop(r, n, (Loop(e, dv, (Store(out, at_out, ir.load(out, at_out) * ir.load(norms, r)),),
                                 vector=True),))  # fmt: skip
    task: tuple[Stmt, ...] = (
        Let(b, t // (heads * tiles)),
        Let(h, (t // tiles) % heads),
        Let(i0, (t % tiles) * rows),
        Let(n, ir.minimum(ir.index(rows), sq - i0)),
        Let(cols, cols_of_block),
        Call("AF_SGEMM", (row_major, no, tr, n, cols, ir.index(d), ir.const(m.scale, f32), base(m.q, i0),
                          ir.index(sr_q), base(m.k, ir.index(0)), ir.index(sr_k), zero,
                          _ptr(scores, ir.index(0)), ir.index(sk))),
        Loop(r, n, row),
        Call("AF_SGEMM", (row_major, no, no, n, ir.index(dv), cols, ir.const(1.0, f32),
                          _ptr(scores, ir.index(0)), ir.index(sk), base(m.v, ir.index(0)), ir.index(sr_v),
                          zero, base(m.out, i0), ir.index(sr_o))),
        normalize,
    )  # fmt: skip
    return (Loop(t, m.batch * heads * tiles, task, parallel=True, scratch=(scores, norms)),)


def _index(view: View, b: Expr, h: Expr, r: Expr, c: Expr) -> Expr:
    sb, sh, sr, sc = view.strides
    return view.offset + b * sb + h * sh + r * sr + c * sc


__all__ = ["ROW_BLOCK", "lower_attention"]
