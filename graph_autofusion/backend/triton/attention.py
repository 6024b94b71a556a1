"""Attention for the Triton targets: one flash-attention-style function per `AttentionMatch`.

One program per (batch x head, block of BM query rows): it loads its Q block once, walks the keys
in blocks of BN (`tl.dot` of Q with the K block read transposed through strides), scales and
masks the scores of the block, and keeps a running row max and row sum in fp32 (the online
softmax): the accumulator of P·V is rescaled by exp(old max - new max) whenever the max grows, so
no score matrix ever reaches memory. A causal match stops the key loop at the diagonal of the
query block. Q, K, V, the masks and the output are all read and written through the match's
(offset, strides) views: the head split and merge cost no copy.

Block sizes come from the target profile (`blocks.configure`): on CUDA BM x BN of 64 x 64 from
compute capability 8 on (32 x 32 before), on Ascend multiples of the cube tile shrunk until the
working set fits the Unified Buffer, the grid held to the AI cores (persistent programs).
"""

from __future__ import annotations

import numpy as np
import onnx

from ...hardware import HardwareProfile
from ...kernel_ir import Buffer, DType
from ...lower.values import Unsupported
from ...plan.attention_match import AttentionMatch, View, match_attention
from ..cpu.kernel_spec import KernelSpec
from .blocks import is_ascend
from .prelude import PRELUDE
from .render import Launch, RenderedKernel

MIN_DOT = 16  # tl.dot wants every dimension at least 16


def _pow2(n: int, lo: int = MIN_DOT) -> int:
    return max(lo, 1 << max(0, (max(n, 1) - 1).bit_length()))


def render_attention(spec: KernelSpec, profile: HardwareProfile) -> RenderedKernel:
    """The Triton module of an attention group: one function, one launch."""
    m = match_attention(spec)
    params = tuple(
        Buffer(t.name, DType.from_onnx(t.elem_type), t.numel, "input") for t in spec.inputs
    ) + tuple(Buffer(t.name, DType.from_onnx(t.elem_type), t.numel, "output") for t in spec.outputs)
    names = {b.name: f"a{k}" for k, b in enumerate(params)}
    tables = []
    for k, (name, values) in enumerate(m.tables([t.name for t in spec.inputs])):
        values = np.ascontiguousarray(values).reshape(-1)
        tables.append(
            (
                Buffer(
                    name,
                    DType.from_onnx(onnx.helper.np_dtype_to_tensor_dtype(values.dtype)),
                    values.size,
                    "const",
                ),
                values,
            )
        )
        names[name] = f"tab{k}"
    persistent = is_ascend(profile)
    fn = f"{spec.symbol}_0"
    ind = "        " if persistent else "    "
    body = _body(m, names, profile)
    args = [*names.values(), "NBLOCKS", "NPROG", "BLOCK: tl.constexpr", "BM: tl.constexpr",
            "BN: tl.constexpr"]  # fmt: skip
    lines = [
        "\n@triton.jit",
        f"def {fn}({', '.join(args)}):",
        "    pid = tl.program_id(0).to(tl.int64)",
        "    for bid in range(pid, NBLOCKS, NPROG):" if persistent else "    bid = pid",
        *(ind + line for line in body),
    ]
    header = "# " + spec.describe("flash attention: online softmax over key blocks").replace("\n", "\n# ")
    source = header + "\n" + PRELUDE + "\n".join(lines) + "\n"
    bd, bdv = _pow2(m.head_dim), _pow2(m.value_dim)
    # per (query row x key column) lane: the scores, probabilities and a mask value (fp32)
    lane_bytes = 12 + (4 if m.mask is not None else 0) + (1 if m.cond is not None else 0)
    launch = Launch(
        fn, "attention", m.batch * m.heads, tuple(names.values()), lane_bytes,
        tile=(m.batch * m.heads, m.seq_q, m.seq_k, bd, bdv),
    )  # fmt: skip
    return RenderedKernel(spec.symbol, source, (launch,), params, tuple(tables), ())


def _addr(view: View, names: dict[str, str], rows: str, cols: str) -> str:
    """The address of view[b, h, rows, cols] (rows/cols: index vectors already shaped)."""
    sb, sh, sr, sc = view.strides
    return (f"{names[view.tensor]} + {view.offset} + v_b * {sb} + v_h * {sh} + ({rows}) * {sr} "
            f"+ ({cols}) * {sc}")  # fmt: skip


def _body(m: AttentionMatch, names: dict[str, str], profile: HardwareProfile) -> list[str]:
    sq, sk, d, dv = m.seq_q, m.seq_k, m.head_dim, m.value_dim
    bd, bdv = _pow2(d), _pow2(dv)
    ieee = "" if is_ascend(profile) else ', input_precision="ieee"'
    out = [
        f"tiles_m = tl.cdiv({sq}, BM)",
        "v_bh = bid // tiles_m",
        "v_mt = bid % tiles_m",
        f"v_b = v_bh // {m.heads}",
        f"v_h = v_bh % {m.heads}",
        "v_i = v_mt * BM + tl.arange(0, BM)",
        f"v_d = tl.arange(0, {bd})",
        f"v_e = tl.arange(0, {bdv})",
        f"v_iok = v_i < {sq}",
        f"v_q = tl.load({_addr(m.q, names, 'v_i[:, None]', 'v_d[None, :]')}, "
        f"mask=v_iok[:, None] & (v_d[None, :] < {d}), other=0.0).to(tl.float32)",
        'v_mx = tl.full([BM], float("-inf"), tl.float32)',
        "v_l = tl.zeros([BM], tl.float32)",
        f"v_acc = tl.zeros([BM, {bdv}], tl.float32)",
    ]
    if m.skips_blocks:
        out.append(f"v_end = tl.minimum((v_mt + 1) * BM + {m.causal}, {sk})")
    else:
        out.append(f"v_end = {sk}")
    out.append("for v_n0 in range(0, v_end, BN):")
    loop = [
        "v_j = v_n0 + tl.arange(0, BN)",
        f"v_jok = v_j < {sk}",
        f"v_kt = tl.load({_addr(m.k, names, 'v_j[None, :]', 'v_d[:, None]')}, "
        f"mask=v_jok[None, :] & (v_d[:, None] < {d}), other=0.0).to(tl.float32)",
        f"v_s = tl.dot(v_q, v_kt{ieee}) * {float(m.scale)!r}",
    ]
    both = "v_iok[:, None] & v_jok[None, :]"
    add = []
    if m.mask is not None:
        add = [f"v_s = v_s + tl.load({_addr(m.mask, names, 'v_i[:, None]', 'v_j[None, :]')}, "
               f"mask={both}, other=0.0).to(tl.float32)"]  # fmt: skip
    where = []
    fill = _literal(m.fill)
    if m.causal is not None:
        where = [f"v_s = tl.where(v_j[None, :] <= v_i[:, None] + {m.causal}, v_s, {fill})"]
    elif m.cond is not None:
        keep = "v_c != 0" if m.keep_if else "v_c == 0"
        where = [
            f"v_c = tl.load({_addr(m.cond, names, 'v_i[:, None]', 'v_j[None, :]')}, mask={both}, other=0)",
            f"v_s = tl.where({keep}, v_s, {fill})",
        ]
    loop += [*where, *add] if m.where_first else [*add, *where]
    loop += [
        'v_s = tl.where(v_jok[None, :], v_s, float("-inf"))',
        "v_mn = tl.maximum(v_mx, tl.max(v_s, 1))",
        # a row whose every score so far is -inf keeps max 0 for the exponentials (no inf - inf)
        'v_ms = tl.where(v_mn == float("-inf"), 0.0, v_mn)',
        "v_alpha = tl.exp(v_mx - v_ms)",
        "v_p = tl.exp(v_s - v_ms[:, None])",
        "v_l = v_l * v_alpha + tl.sum(v_p, 1)",
        f"v_v = tl.load({_addr(m.v, names, 'v_j[:, None]', 'v_e[None, :]')}, "
        f"mask=v_jok[:, None] & (v_e[None, :] < {dv}), other=0.0).to(tl.float32)",
        f"v_acc = v_acc * v_alpha[:, None] + tl.dot(v_p, v_v{ieee})",
        "v_mx = v_mn",
    ]
    out += ["    " + line for line in loop]
    out += [
        "v_o = v_acc / v_l[:, None]",
        f"tl.store({_addr(m.out, names, 'v_i[:, None]', 'v_e[None, :]')}, v_o, "
        f"mask=v_iok[:, None] & (v_e[None, :] < {dv}))",
    ]
    return out


def _literal(value: float) -> str:
    if value == float("inf"):
        return 'float("inf")'
    if value == float("-inf"):
        return 'float("-inf")'
    return repr(float(value))


__all__ = ["Unsupported", "render_attention"]
