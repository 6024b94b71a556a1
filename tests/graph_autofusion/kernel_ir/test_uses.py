"""`names_read`: which buffers statements read, the proof behind passing NULL for packed weights."""

from __future__ import annotations

from graph_autofusion.kernel_ir import Buffer, Call, DType, If, Loop, Store
from graph_autofusion.kernel_ir import nodes as ir
from graph_autofusion.kernel_ir.uses import names_read

W = Buffer("w", DType.F32, 64)
X = Buffer("x", DType.F32, 64)
OUT = Buffer("out", DType.F32, 64)
PACKED = Buffer("packed_w", DType.F32, 64, role="packed")


def test_loads_and_call_addresses_count_stores_do_not() -> None:
    i = ir.var("i")
    body = (
        Loop(i, 64, (Store(OUT, i, ir.load(X, i) * 2.0),)),
        Call("afc_gemm_bp", (ir.addr(PACKED, 0), ir.addr(OUT, 0))),
    )
    assert names_read(body) == {"x", "packed_w", "out"}
    assert "w" not in names_read(body)


def test_reads_hidden_in_conditions_indices_and_bounds_count() -> None:
    i, n = ir.var("i"), ir.cast(ir.load(Buffer("n", DType.I64, 1), 0), DType.I64)
    body = (
        If(ir.gt(ir.load(W, 0), 0.0), (Store(OUT, ir.cast(ir.load(X, 0), DType.I64), 1.0),)),
        Loop(i, n, ()),
    )
    assert names_read(body) == {"w", "x", "n"}


def test_raw_text_reads_every_identifier_it_names() -> None:
    body = (Store(OUT, 0, ir.raw("af_dot(w, x + 4)", DType.F32)),)
    assert {"w", "x", "af_dot"} <= names_read(body)
