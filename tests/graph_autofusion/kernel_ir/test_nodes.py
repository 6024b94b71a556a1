"""The kernel IR's expressions: interning, folding builders, types, substitution, the text form."""

from __future__ import annotations

import gc
import math

import pytest

from graph_autofusion.kernel_ir import Buffer, DType, Kernel, Let, Loop, Store, format_kernel
from graph_autofusion.kernel_ir import nodes as ir


def test_equal_expressions_are_one_object() -> None:
    x = ir.var("x", DType.F32)
    assert ir.unary("exp", x) + 1.0 is ir.unary("exp", x) + 1.0
    assert ir.const(0.0, DType.F32) is not ir.const(-0.0, DType.F32)  # 0.0 == -0.0, yet not the same value
    nan = ir.const(math.nan, DType.F32)
    assert nan is ir.const(math.nan, DType.F32)
    assert ir.const(1, DType.I32) is not ir.const(1, DType.I64)  # the type is part of the value


def test_interned_children_stay_alive_with_their_parent() -> None:
    e = ir.var("o") * 7 + ir.var("i")
    text = str(e)
    gc.collect()
    assert str(ir.var("o") * 7 + ir.var("i")) == text
    assert ir.var("o") * 7 + ir.var("i") is e


def test_index_arithmetic_folds_and_drops_neutral_operands() -> None:
    o, i = ir.var("o"), ir.var("i")
    assert str(o * 64 + i) == "add(mul(o, 64), i)"
    assert o * 1 + 0 is o
    assert (o * 0) is ir.index(0)
    assert str((o + 2) + 3) == "add(o, 5)"
    assert ir.index(6) // 4 is ir.index(1) and ir.index(6) % 4 is ir.index(2)
    assert str(ir.index(-7) // 2) == "div(-7, 2)"  # C truncates where Python floors: left to the target


def test_float_arithmetic_is_not_folded() -> None:
    x = ir.var("x", DType.F32)
    assert str(x + 0.0) == "add(x, 0.0)"  # -0.0 + 0.0 is 0.0: dropping the add would change the sign
    assert str(ir.const(0.1, DType.F32) + 0.2) == "add(0.1, 0.2)"  # fp32 rounding is the target's


def test_types_flow_from_the_arguments() -> None:
    h = ir.load(Buffer("in0", DType.F16, 8), 0)
    assert h.dtype is DType.F32  # 16-bit floats compute in fp32
    assert ir.lt(h, 0.0).dtype is DType.BOOL
    assert ir.cast(h, DType.F16) is h  # same compute type: nothing to convert
    assert ir.cast(h, DType.I8).dtype is DType.I8
    with pytest.raises(TypeError, match="cast one side first"):
        ir.binary("add", h, ir.var("n"))


def test_select_simplifies_known_conditions() -> None:
    x = ir.var("x", DType.F32)
    assert ir.select(ir.const(1, DType.BOOL), x, 0.0) is x
    assert ir.select(ir.gt(x, 0.0), x, x) is x
    guarded = ir.select(ir.gt(x, 0.0), x, 0.0, guarded=True)
    assert guarded is not ir.select(ir.gt(x, 0.0), x, 0.0)  # the guard is part of the meaning


def test_substitute_replaces_tensor_reads() -> None:
    i = ir.var("i")
    e = ir.tensor_at("a", [i + 1], DType.F32) * 2.0 + ir.tensor_at("b", [i], DType.F32)
    buf = Buffer("in0", DType.F32, 16)
    out = ir.substitute(e, lambda t: ir.load(buf, t.index[0]) if t.tensor == "a" else None)
    assert str(out) == "add(mul(in0[add(i, 1)], 2.0), b@[i])"


def test_printer_shows_loops_marks_and_stores() -> None:
    o, i = ir.var("o"), ir.var("i1")
    src, dst = Buffer("in0", DType.F32, 256), Buffer("out0", DType.F16, 256)
    store = Store(dst, o * 16 + i, ir.unary("exp", ir.load(src, o * 16 + i)))
    body = (Loop(o, 16, (Let(ir.var("i0"), o // 4), Loop(i, 16, (store,), vector=True)), parallel=True),)
    text = format_kernel(Kernel("k", (src, dst), body, description="demo"))
    assert text == (
        "kernel k(in0: f32[256], out0: f16[256])\n"
        "  # demo\n"
        "  for o < 16 parallel:\n"
        "    i0 = div(o, 4)\n"
        "    for i1 < 16 vector:\n"
        "      out0[add(mul(o, 16), i1)] <- exp(in0[add(mul(o, 16), i1)])\n"
    )


def test_folds_carry_their_range_and_type() -> None:
    r, i = ir.var("r"), ir.var("i")
    x = ir.tensor_at("x", [i, r], DType.F16)
    total = ir.fold("sum", r, 0, 8, ir.cast(x, DType.F64))
    assert total.dtype is DType.F64 and str(total) == "sum(r from 0 to 8: f64(x@[i, r]))"
    best = ir.fold("argmax_last", r, 0, 8, x)
    assert best.dtype is DType.I64  # a position, whatever the values' type
    back = ir.fold("sum", r, 7, i - 1, x, step=-1)
    assert str(back) == "sum(r from 7 to sub(i, 1) step -1: x@[i, r])"
    with pytest.raises(ValueError, match="unknown fold"):
        ir.fold("mean", r, 0, 8, x)


def test_printed_text_stays_linear_in_a_shared_dag() -> None:
    """x, x*x, (x*x)*(x*x), ... : 40 squarings are a 2^40-leaf tree but 40 lines of text."""
    x = ir.load(Buffer("in0", DType.F32, 1), 0)
    e = x
    for _ in range(40):
        e = e * e
    text = format_kernel(
        Kernel("sq", (Buffer("in0", DType.F32, 1),), (Store(Buffer("out0", DType.F32, 1), 0, e),))
    )
    assert len(text) < 4000 and "%40 = mul(%39, %39)" in text


def test_select_of_two_python_floats_is_refused_not_made_int64() -> None:
    x = ir.var("x", DType.F32)
    assert ir.select(ir.gt(x, 0.0), 1, 0).dtype is DType.I64  # ints: index constants
    with pytest.raises(TypeError, match="IR constant"):
        ir.select(ir.gt(x, 0.0), 0.0, 1.0)
