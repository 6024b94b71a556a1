"""The C renderer of the kernel IR: what the text looks like, and what the compiled code computes.

Conversions of 16-bit floats are checked bit for bit against numpy (fp16) and ml_dtypes (bf16):
every one of the 65536 fp16 patterns widens exactly, and narrowing rounds to nearest even with
NaN, infinities, subnormals and overflow handled as IEEE 754 says.
"""

from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import pytest

from graph_autofusion.backend.cpu.compiler import KernelSource, compile_kernels
from graph_autofusion.backend.cpu.render_c import PREPACK_ONLY_SUFFIX, prepack_only, render_kernel
from graph_autofusion.kernel_ir import Assign, Buffer, Call, Declare, DType, If, Kernel, Loop, Store
from graph_autofusion.kernel_ir import nodes as ir


def _copy_kernel(name: str, src: DType, dst: DType, n: int) -> Kernel:
    i = ir.var("i")
    a, b = Buffer("in0", src, n), Buffer("out0", dst, n, "output")
    return Kernel(name, (a, b), (Loop(i, n, (Store(b, i, ir.load(a, i)),), vector=True),))


def _run(kernel: Kernel, cache, *arrays: np.ndarray) -> None:
    (art,) = compile_kernels([KernelSource(kernel.name, render_kernel(kernel))], cache=cache)
    fn = getattr(art.load(), kernel.name)
    args = (ctypes.c_void_p * len(arrays))(*(a.ctypes.data for a in arrays))
    fn(args)


def test_guarded_select_keeps_its_reads_inside_the_branch() -> None:
    i = ir.var("i")
    a, b = Buffer("in0", DType.F32, 8), Buffer("out0", DType.F32, 16, "output")
    inside = ir.lt(i, 8)
    body = (Loop(i, 16, (Store(b, i, ir.select(inside, ir.load(a, i), 0.0, guarded=True)),)),)
    text = render_kernel(Kernel("pad", (a, b), body)).split("void pad")[1]
    guard = text.index("if (")
    assert "in0[i]" in text[guard:] and "in0[" not in text[:guard]
    plain = render_kernel(
        Kernel("sel", (a, b), (Loop(i, 8, (Store(b, i, ir.select(inside, ir.load(a, i), 0.0)),)),))
    )
    assert "if (" not in plain.split("void sel")[1]  # an unguarded select is a ternary


def test_a_shared_value_is_computed_once() -> None:
    i = ir.var("i")
    a, b = Buffer("in0", DType.F32, 8), Buffer("out0", DType.F32, 8, "output")
    e = ir.unary("exp", ir.load(a, i))
    text = render_kernel(Kernel("twice", (a, b), (Loop(i, 8, (Store(b, i, e * e + e),), vector=True),)))
    body = text.split("void twice")[1]
    assert body.count("expf(") == 1 and "#pragma omp simd" in body


def test_double_kernels_call_double_libm() -> None:
    i = ir.var("i")
    a, b = Buffer("in0", DType.F64, 8), Buffer("out0", DType.F64, 8, "output")
    text = render_kernel(Kernel("d", (a, b), (Loop(i, 8, (Store(b, i, ir.unary("tanh", ir.load(a, i))),)),)))
    body = text.split("void d")[1]
    assert "const double t2 = tanh(t1);" in body and "tanhf(" not in body


def test_every_fp16_pattern_widens_exactly(kernel_cache) -> None:
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    out = np.empty(65536, dtype=np.float32)
    _run(_copy_kernel("h2f", DType.F16, DType.F32, 65536), kernel_cache, bits, out)
    want = bits.view(np.float16).astype(np.float32)
    same = (out.view(np.uint32) == want.view(np.uint32)) | (np.isnan(out) & np.isnan(want))
    assert same.all(), bits[~same][:8]


def _narrowing_cases() -> np.ndarray:
    rng = np.random.default_rng(7)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65519.99, 65520.0, 1e-8, 5.96e-8, 2.98e-8, 6.1e-5]
    ties = (np.arange(2048, dtype=np.float32) + 0.5) * np.float32(2.0**-10)  # halfway between fp16 neighbours
    noise = np.frombuffer(rng.bytes(4 * 4096), dtype=np.float32)  # every exponent, NaN payloads too
    cases = [special, ties, rng.standard_normal(4096) * 1e3, rng.standard_normal(4096) * 1e-6]
    return np.concatenate([np.asarray(c, dtype=np.float32) for c in cases] + [noise])


@pytest.mark.parametrize(("dtype", "reference"), [(DType.F16, np.float16), (DType.BF16, ml_dtypes.bfloat16)])
def test_narrowing_rounds_to_nearest_even(kernel_cache, dtype, reference) -> None:
    x = _narrowing_cases()
    out = np.empty(x.size, dtype=np.uint16)
    _run(_copy_kernel(f"f2{dtype.value}", DType.F32, dtype, x.size), kernel_cache, x, out)
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(reference).view(np.uint16)
    nan = np.isnan(x)
    assert (out[~nan] == want[~nan]).all(), x[~nan][out[~nan] != want[~nan]][:8]
    assert np.isnan(out[nan].view(reference).astype(np.float32)).all()


def test_branches_calls_and_accumulators_render_as_c() -> None:
    i, n = ir.var("i"), ir.var("n", DType.F64)
    a, b = Buffer("in0", DType.F32, 8), Buffer("out0", DType.F64, 1, "output")
    x = ir.cast(ir.load(a, i), DType.F64)
    body = (
        Declare(n, ir.const(0, DType.F64)),
        Loop(
            i,
            8,
            (If(ir.gt(x, 0.0), (Assign(n, n + x),), (Call("af_note", (i,)),)),),
            reductions=(("sum", n),),
        ),
        Store(b, 0, n),
    )
    text = render_kernel(Kernel("k", (a, b), body)).split("void k")[1]
    assert "double n = 0.0;" in text and "#pragma omp simd" not in text  # not marked vector
    assert "if ((t2 > 0.0)) {" in text and "= (n + t2);" in text and "} else {" in text
    assert "af_note(i);" in text and "out0[0] = n;" in text


@pytest.mark.parametrize("elem", ["float16", "bfloat16"])
def test_16_bit_constant_tables_hold_bit_patterns(kernel_cache, elem: str) -> None:
    """A folded fp16/bf16 causal mask (0 and -inf) feeding a Softmax: the uint16_t table must hold
    the bits (0xfc00 / 0xff80), not float literals converted as integers (-inf became 0 and the
    mask vanished: attention off by ~0.7)."""
    import onnx
    from cpu_backend_helpers import fuse_all, make_model
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    from graph_autofusion.backend.cpu.runtime import compile_model

    dtype = np.dtype(ml_dtypes.bfloat16) if elem == "bfloat16" else np.dtype(np.float16)
    elem_type = onnx.TensorProto.BFLOAT16 if elem == "bfloat16" else onnx.TensorProto.FLOAT16
    mask = np.triu(np.full((4, 6), -np.inf, np.float32), 1).astype(dtype)
    nodes = [
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(mask, "c")),
        helper.make_node("Add", ["x", "c"], ["a"]),
        helper.make_node("Softmax", ["a"], ["y"]),
    ]
    model = make_model(nodes, {"x": ([2, 4, 6], elem_type)}, ["y"])
    x = np.random.default_rng(0).standard_normal((2, 4, 6)).astype(dtype)
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    compiled = compile_model(fuse_all(model, "reduction"), cache=kernel_cache, threads=1)
    assert compiled.stats["host_ops"] == []
    got = compiled({"x": x})["y"].astype(np.float32)
    np.testing.assert_allclose(got, want.astype(np.float32), rtol=4 * 2.0**-7, atol=1e-6)
    assert (got[:, 0, 1:] == 0).all()  # the masked positions of the first row


def _packing_kernel(body_reads_raw: bool) -> Kernel:
    """out = packed(w) + x (+ w when `body_reads_raw`), with w copied into its packed block."""
    x, w, out = Buffer("x", DType.F32, 32), Buffer("w", DType.F32, 32), Buffer("out", DType.F32, 32, "output")
    packed = Buffer("pw", DType.F32, 32, "packed")
    i = ir.var("i")
    value = ir.load(packed, i) + ir.load(x, i) + (ir.load(w, i) if body_reads_raw else 0.0)
    return Kernel(
        "k_pack",
        (x, w, out),
        (Loop(i, 32, (Store(out, i, value),)),),
        packed=(packed,),
        prepack=(Loop(i, 32, (Store(packed, i, ir.load(w, i) * 3.0),)),),
    )


@pytest.mark.parametrize("body_reads_raw", [False, True])
def test_a_weight_read_only_packed_is_not_declared_and_is_flagged(kernel_cache, body_reads_raw: bool) -> None:
    """`<kernel>_prepack_only` flags w (bit 1) only when the body never reads it; then the body
    does not declare it, and the kernel runs with NULL in its place."""
    kernel = _packing_kernel(body_reads_raw)
    assert prepack_only(kernel) == (() if body_reads_raw else (1,))
    source = render_kernel(kernel)
    body = source.split("void k_pack(void *const *args) {", 1)[1]
    assert ("const float *restrict w =" in body) is body_reads_raw
    lib = compile_kernels([KernelSource("k_pack", source, uses_openmp=False)], cache=kernel_cache)[0].load()
    assert ctypes.c_int64.in_dll(lib, "k_pack" + PREPACK_ONLY_SUFFIX).value == (0 if body_reads_raw else 2)
    x, w, out = np.arange(32, dtype=np.float32), np.full(32, 2.0, np.float32), np.zeros(32, np.float32)
    packed = np.zeros(ctypes.c_int64.in_dll(lib, "k_pack_prepack_floats").value, np.float32)
    args = (ctypes.c_void_p * 3)(x.ctypes.data, w.ctypes.data, out.ctypes.data)
    lib.k_pack_prepack(args, ctypes.c_void_p(packed.ctypes.data))
    run = (ctypes.c_void_p * 4)(
        x.ctypes.data, w.ctypes.data if body_reads_raw else None, out.ctypes.data, packed.ctypes.data
    )
    lib.k_pack(run)
    np.testing.assert_array_equal(out, x + 6.0 + (2.0 if body_reads_raw else 0.0))


def test_a_loop_bound_that_needs_a_local_is_computed_before_the_pragma(kernel_cache) -> None:
    # A vector loop inside a branch whose trip count is a `minimum` (the last, shorter tile): the
    # bound's local must come before `#pragma omp simd`, which has to sit right above its `for`.
    t, i = ir.var("t"), ir.var("i")
    a, b = Buffer("in0", DType.F32, 13), Buffer("out0", DType.F32, 13, "output")
    start = t * 4
    stop = ir.minimum(start + 4, 13)
    inner = Loop(i, stop - start, (Store(b, start + i, ir.load(a, start + i) * 2.0),), vector=True)
    kernel = Kernel("tiles", (a, b), (Loop(t, 4, (If(ir.lt(start, 13), (inner,)),)),))
    text = render_kernel(kernel)
    lines = [line.strip() for line in text.splitlines()]
    for k, line in enumerate(lines):
        if line.startswith("#pragma omp simd"):
            assert lines[k + 1].startswith("for ("), text
    x = np.arange(13, dtype=np.float32)
    y = np.full(13, np.nan, dtype=np.float32)
    _run(kernel, kernel_cache, x, y)
    np.testing.assert_array_equal(y, 2 * x)


def test_a_contraction_loop_takes_the_team_only_at_or_above_the_runtime_bar(kernel_cache) -> None:
    # Loop.macs puts an `if` on the pragma: at or above af_parallel_min_macs the loop runs on
    # the team, below it on the calling thread alone (no worker woken); a loop without macs has
    # no such check. The body records the team size each iteration ran on.
    from graph_autofusion.backend.cpu.render_c import PARALLEL_MIN_MACS_SYMBOL
    from graph_autofusion.backend.cpu.threads import omp_threads

    t = ir.var("t")
    out = Buffer("out0", DType.F32, 8, "output")
    team = ir.raw("(float)omp_get_num_threads()", DType.F32)
    kernel = Kernel("bar", (out,), (Loop(t, 8, (Store(out, t, team),), parallel=True, macs=1000),))
    text = render_kernel(kernel)
    assert f"if(1000 >= {PARALLEL_MIN_MACS_SYMBOL})" in text
    plain = Kernel("nobar", (out,), (Loop(t, 8, (Store(out, t, team),), parallel=True),))
    assert " if(" not in render_kernel(plain).split("void nobar")[1]
    (art,) = compile_kernels([KernelSource(kernel.name, text)], cache=kernel_cache)
    lib = art.load()
    y = np.zeros(8, np.float32)
    args = (ctypes.c_void_p * 1)(y.ctypes.data)
    bar = ctypes.c_int64.in_dll(lib, PARALLEL_MIN_MACS_SYMBOL)
    assert bar.value == 0  # until a runtime sets it: every such loop takes the team
    with omp_threads(2):
        for value, threads in ((0, 2), (1000, 2), (1001, 1)):
            bar.value = value
            lib.bar(args)
            assert set(y.tolist()) == {float(threads)}, (value, y)
