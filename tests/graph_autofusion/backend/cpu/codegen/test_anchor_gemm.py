"""MatMul / Gemm anchor kernels (with epilogues and stride-only prologues) against onnxruntime."""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from anchor_helpers import ATOL_PER_SQRT_K, RTOL, check, make_case, rand, run_kernel, run_ort, spec_for
from cpu_backend_helpers import assert_close, make_model, ort_run, random_feeds
from onnx import helper, numpy_helper

import graph_autofusion as gaf
from graph_autofusion.backend.cpu.blas import BLAS_PREAMBLE
from graph_autofusion.backend.cpu.codegen.anchor import AnchorKernel, emit_anchor
from graph_autofusion.backend.cpu.codegen.common import CodegenUnsupported
from graph_autofusion.backend.cpu.compiler import KernelSource, compiler_identity, kernel_flags
from graph_autofusion.backend.cpu.runtime import compile_model


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def _node(op: str, ins: list[str], outs: list[str], **attrs: object):
    return helper.make_node(op, ins, outs, **attrs)


def _gelu_erf(x: str, out: str) -> list:
    """The decomposed GELU exporters emit: x * 0.5 * (1 + erf(x / sqrt(2)))."""
    return [
        _node("Div", [x, "sqrt2"], ["g_div"]),
        _node("Erf", ["g_div"], ["g_erf"]),
        _node("Add", ["g_erf", "one"], ["g_add"]),
        _node("Mul", [x, "g_add"], ["g_mul"]),
        _node("Mul", ["g_mul", "half"], [out]),
    ]


GELU_CONSTS = {
    "sqrt2": np.array(1.4142135381698608, dtype=np.float32),
    "one": np.array(1.0, dtype=np.float32),
    "half": np.array(0.5, dtype=np.float32),
}


def test_matmul_bias_relu_flattens_batch_into_one_gemm(rng: np.random.Generator) -> None:
    case = make_case(
        [_node("MatMul", ["x", "w"], ["y"]), _node("Add", ["y", "b"], ["z"]), _node("Relu", ["z"], ["o"])],
        {"x": rand(rng, 2, 16, 32)},
        ["o"],
        {"w": rand(rng, 32, 24), "b": rand(rng, 24)},
    )
    kernel = check(case, "mm_bias_relu", k=32, method="gemm")
    assert "epilogue" in kernel.source and kernel.uses_blas
    assert "#pragma omp parallel" not in kernel.source  # too small for a fork/join
    assert kernel.source.count("AF_SGEMM(AfRowMajor") == 1


def test_matmul_bias_gelu_erf_form_tiled_and_parallel(rng: np.random.Generator, tmp_path: Path) -> None:
    # Large enough for several tiles (tiles over rows and columns, epilogue on each tile).
    case = make_case(
        [_node("MatMul", ["x", "w"], ["y"]), _node("Add", ["y", "b"], ["z"]), *_gelu_erf("z", "o")],
        {"x": rand(rng, 160, 64)},
        ["o"],
        {"w": rand(rng, 64, 300), "b": rand(rng, 300), **GELU_CONSTS},
    )
    kernel = check(case, "mm_bias_gelu", k=64, method="gemm")
    assert "#pragma omp parallel" in kernel.source  # several tiles, worth a thread team
    assert "schedule(dynamic, 1)" in kernel.source
    assert "erff(" in kernel.source and "0.5f" in kernel.source  # vectorizable erf, scalars baked in
    _assert_epilogue_vectorized(kernel, tmp_path)


def _assert_epilogue_vectorized(kernel: AnchorKernel, tmp_path: Path) -> None:
    """Compile the kernel as the project does, asking gcc which loops it vectorized: every
    epilogue's inner loop (over a tile row) must be one of them, or the fused kernel would pay
    more for its epilogue than the separate pointwise kernels it replaces."""
    info = compiler_identity()
    if "clang" in info.version.lower() or "gcc" not in info.path.lower():
        pytest.skip("-fopt-info-vec is a gcc option")
    src = tmp_path / "k.c"
    src.write_text(kernel.source)
    flags = kernel_flags(KernelSource("k", kernel.source, uses_blas=kernel.uses_blas))
    flags = [f for f in flags if f not in ("-shared", "-pipe")]
    proc = subprocess.run(
        [*info.command, *flags, "-c", "-fopt-info-vec-optimized", str(src), "-o", str(tmp_path / "k.o")],
        capture_output=True,
        text=True,
        check=True,
    )
    # The kernel IR's epilogue: `for (int64_t c = n0; ...)` (MatMul/Gemm), `c = p0` (Conv)
    epilogue_loop = re.compile(r"for \(int64_t c = (n0|p0); c < (n1|p1); \+\+c\)")
    loops = [n for n, line in enumerate(kernel.source.splitlines(), 1) if epilogue_loop.search(line)]
    assert loops, "no epilogue loop found"
    vectorized = {int(m) for m in re.findall(r"k\.c:(\d+):\d+: optimized: loop vectorized", proc.stderr)}
    # gcc names a loop by its `for` line, or (an `omp simd` loop) by the first line of its body
    assert all(n in vectorized or n + 1 in vectorized for n in loops), proc.stderr


def test_conv_bias_relu_residual_epilogue_vectorizes(rng: np.random.Generator, tmp_path: Path) -> None:
    # A ResNet bottleneck tail: 1x1 conv + bias -> Add(residual) -> Relu, rows = output channels.
    case = make_case(
        [
            _node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[1, 1]),
            _node("Add", ["y", "skip"], ["z"]),
            _node("Relu", ["z"], ["o"]),
        ],
        {"x": rand(rng, 1, 16, 8, 8), "skip": rand(rng, 1, 24, 8, 8)},
        ["o"],
        {"w": rand(rng, 24, 16, 1, 1), "b": rand(rng, 24)},
    )
    kernel = check(case, "conv_bias_add_relu", k=16)
    _assert_epilogue_vectorized(kernel, tmp_path)


def test_gemm_bias_epilogue_vectorizes_with_broadcast_bias(rng: np.random.Generator, tmp_path: Path) -> None:
    # Bias broadcast along the contiguous axis: read as a unit-stride run, no index arithmetic.
    case = make_case(
        [_node("MatMul", ["x", "w"], ["y"]), _node("Add", ["y", "b"], ["o"])],
        {"x": rand(rng, 1, 40, 32)},
        ["o"],
        {"w": rand(rng, 32, 48), "b": rand(rng, 48)},
    )
    kernel = check(case, "mm_bias", k=32, method="gemm")
    inner = kernel.source.split("for (int64_t c = n0", 1)[1].split("}", 1)[0]  # the epilogue's row loop
    assert "/" not in inner and "%" not in inner
    _assert_epilogue_vectorized(kernel, tmp_path)


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_flags(rng: np.random.Generator, trans_a: int, trans_b: int) -> None:
    m, n, k = 12, 20, 16
    a = rand(rng, k, m) if trans_a else rand(rng, m, k)
    b = rand(rng, n, k) if trans_b else rand(rng, k, n)
    case = make_case(
        [_node("Gemm", ["a", "b", "c"], ["y"], alpha=0.5, beta=2.0, transA=trans_a, transB=trans_b)],
        {"a": a},
        ["y"],
        {"b": b, "c": rand(rng, n)},
    )
    check(case, f"gemm_t{trans_a}{trans_b}", k=k, method="gemm")


@pytest.mark.parametrize("c_shape", [(), (1,), (12, 1), (12, 20), None])
def test_gemm_c_broadcast(rng: np.random.Generator, c_shape: tuple[int, ...] | None) -> None:
    inits = {"b": rand(rng, 16, 20)}
    ins = ["a", "b"]
    if c_shape is not None:
        inits["c"] = rand(rng, *c_shape)
        ins.append("c")
    case = make_case(
        [_node("Gemm", ins, ["y"], beta=1.0), _node("Relu", ["y"], ["o"])],
        {"a": rand(rng, 12, 16)},
        ["o"],
        inits,
    )
    check(case, f"gemm_c{len(c_shape) if c_shape is not None else 'none'}_{np.prod(c_shape or 0)}", k=16)


def test_batched_matmul_4d_with_broadcast(rng: np.random.Generator) -> None:
    case = make_case(
        [_node("MatMul", ["a", "b"], ["y"]), _node("Sigmoid", ["y"], ["o"])],
        {"a": rand(rng, 2, 1, 8, 16), "b": rand(rng, 1, 3, 16, 12)},
        ["o"],
    )
    check(case, "bmm_4d_bcast", k=16, method="batched_gemm")


def test_batched_matmul_3d(rng: np.random.Generator) -> None:
    case = make_case(
        [_node("MatMul", ["a", "b"], ["y"]), _node("Add", ["y", "r"], ["o"])],
        {"a": rand(rng, 4, 24, 40), "b": rand(rng, 4, 40, 36), "r": rand(rng, 4, 24, 36)},
        ["o"],
    )
    check(case, "bmm_3d_residual", k=40, method="batched_gemm")


@pytest.mark.parametrize(
    ("a_shape", "b_shape"),
    [((16,), (16, 8)), ((3, 5, 16), (16,)), ((16,), (16,)), ((2, 16), (3, 16, 4)), ((16,), (2, 16, 5))],
)
def test_matmul_1d_operands(rng: np.random.Generator, a_shape: tuple, b_shape: tuple) -> None:
    case = make_case(
        [_node("MatMul", ["a", "b"], ["y"]), _node("Mul", ["y", "s"], ["o"])],
        {"a": rand(rng, *a_shape), "b": rand(rng, *b_shape)},
        ["o"],
        {"s": np.array(3.0, dtype=np.float32)},
    )
    check(case, f"mm1d_{len(a_shape)}_{len(b_shape)}_{a_shape[0]}", k=16)


def test_attention_scores_fold_head_split_and_k_transpose(rng: np.random.Generator) -> None:
    """Reshape -> Transpose(0,2,1,3) on Q and Reshape -> Transpose(0,2,3,1) on K become strides."""
    b, s, h, d = 2, 8, 4, 6
    shape = np.array([b, s, h, d], dtype=np.int64)
    case = make_case(
        [
            _node("Reshape", ["q", "shape"], ["q4"]),
            _node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
            _node("Reshape", ["k", "shape"], ["k4"]),
            _node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
            _node("MatMul", ["qt", "kt"], ["scores"]),
            _node("Mul", ["scores", "scale"], ["scaled"]),
            _node("Add", ["scaled", "mask"], ["o"]),
        ],
        {"q": rand(rng, b, s, h * d), "k": rand(rng, b, s, h * d), "mask": rand(rng, b, 1, 1, s)},
        ["o"],
        {"shape": shape, "scale": np.array(1.0 / np.sqrt(d), dtype=np.float32)},
    )
    kernel = check(case, "attn_scores", k=d, method="batched_gemm")
    assert "AfTrans" in kernel.source  # K^T read in place, not copied
    assert "pa[" not in kernel.source and "pb[" not in kernel.source


def test_attention_context_with_value_transpose(rng: np.random.Generator) -> None:
    b, s, h, d = 2, 8, 4, 6
    case = make_case(
        [
            _node("Reshape", ["v", "shape"], ["v4"]),
            _node("Transpose", ["v4"], ["vt"], perm=[0, 2, 1, 3]),
            _node("MatMul", ["p", "vt"], ["o"]),
        ],
        {"p": rand(rng, b, h, s, s), "v": rand(rng, b, s, h * d)},
        ["o"],
        {"shape": np.array([b, s, h, d], dtype=np.int64)},
        template="single",
    )
    check(case, "attn_context", k=s, method="batched_gemm")


def test_view_blas_cannot_read_is_refused(rng: np.random.Generator) -> None:
    # Transpose(2,0,1) of [M,K,B] gives [B,M,K] with no unit-stride axis: a gather, not a stride
    # change, so no anchor match (the packed lowering is tested in tests/.../lower/test_anchor.py).
    case = make_case(
        [
            _node("Transpose", ["a"], ["at"], perm=[2, 0, 1]),
            _node("MatMul", ["at", "w"], ["y"]),
            _node("Relu", ["y"], ["o"]),
        ],
        {"a": rand(rng, 10, 16, 3)},
        ["o"],
        {"w": rand(rng, 16, 7)},
    )
    spec, _ = spec_for(case, "mm_packed")
    with pytest.raises(CodegenUnsupported, match="not a stride change"):
        emit_anchor(spec)


def test_epilogue_writes_every_returned_value(rng: np.random.Generator) -> None:
    # The raw product and the activated value are both kernel outputs; Clip bounds are inputs.
    case = make_case(
        [_node("MatMul", ["x", "w"], ["y"]), _node("Clip", ["y", "lo", "hi"], ["o"])],
        {"x": rand(rng, 20, 16) * 4},
        ["y", "o"],
        {"w": rand(rng, 16, 12), "lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32)},
    )
    check(case, "mm_two_outputs", k=16, scale=4.0)


def test_chain_linear_gelu_linear(rng: np.random.Generator) -> None:
    case = make_case(
        [
            _node("MatMul", ["x", "w1"], ["h"]),
            _node("Add", ["h", "b1"], ["hb"]),
            *_gelu_erf("hb", "a"),
            _node("MatMul", ["a", "w2"], ["y"]),
            _node("Add", ["y", "b2"], ["z"]),
            _node("Add", ["z", "x"], ["o"]),
        ],
        {"x": rand(rng, 2, 40, 32)},
        ["o"],
        {
            "w1": rand(rng, 32, 64),
            "b1": rand(rng, 64),
            "w2": rand(rng, 64, 32) * 0.25,
            "b2": rand(rng, 32),
            **GELU_CONSTS,
        },
        template="anchor_chain",
    )
    kernel = check(case, "chain_gelu", k=64, method="matmul_chain")
    body = kernel.source[len(BLAS_PREAMBLE) :]
    assert body.count("af_sgemm_tile(") == 2  # both products, per row block, in one kernel


@pytest.mark.parametrize("new_shape", [(24, 48), (96, 12), (12, 96)])
def test_chain_linear_reshape_linear(rng: np.random.Generator, new_shape: tuple[int, int]) -> None:
    # [3, 8, 16] x [16, 48] -> Relu -> Reshape to new_shape -> x [new_shape[1], 10] (Gemm + bias).
    case = make_case(
        [
            _node("MatMul", ["x", "w1"], ["h"]),
            _node("Relu", ["h"], ["hr"]),
            _node("Reshape", ["hr", "shape"], ["h2"]),
            _node("Gemm", ["h2", "w2", "b2"], ["o"], transB=1, alpha=0.5),
        ],
        {"x": rand(rng, 3, 8, 16)},
        ["o"],
        {
            "w1": rand(rng, 16, 48),
            "shape": np.array(new_shape, dtype=np.int64),
            "w2": rand(rng, 10, new_shape[1]),
            "b2": rand(rng, 10),
        },
        template="anchor_chain",
    )
    if new_shape[1] == 48:  # rows of the first product are rows of the second's operand
        check(case, f"chain_reshape_{new_shape[1]}", k=max(16, new_shape[1]) * 4, method="matmul_chain")
        return
    # The planner forms no chain whose reshape changes the row length (plan/anchor_match.py), and
    # the second Gemm cannot read the first stage through a reshape prologue either.
    spec, _ = spec_for(case, f"chain_reshape_{new_shape[1]}")
    with pytest.raises(CodegenUnsupported, match="does not keep rows"):
        emit_anchor(spec)


def test_non_elementwise_epilogue_is_refused(rng: np.random.Generator) -> None:
    case = make_case(
        [_node("MatMul", ["x", "w"], ["y"]), _node("Softmax", ["y"], ["o"], axis=-1)],
        {"x": rand(rng, 4, 8)},
        ["o"],
        {"w": rand(rng, 8, 8)},
    )
    spec, _ = spec_for(case, "bad_epilogue")
    with pytest.raises(CodegenUnsupported, match="Softmax"):
        emit_anchor(spec)


def test_epilogue_that_broadcasts_the_product_is_refused(rng: np.random.Generator) -> None:
    case = make_case(
        [_node("MatMul", ["x", "w"], ["y"]), _node("Add", ["y", "r"], ["o"])],
        {"x": rand(rng, 4, 8), "r": rand(rng, 3, 4, 8)},
        ["o"],
        {"w": rand(rng, 8, 8)},
    )
    spec, _ = spec_for(case, "bad_broadcast")
    with pytest.raises(CodegenUnsupported, match="changes the domain"):
        emit_anchor(spec)


def test_chain_intermediate_also_returned(rng: np.random.Generator) -> None:
    # The activated hidden layer is a kernel output too: the planner forms no row-block chain
    # around it (plan/anchor_match.py), so the two stages run one after the other and stage 1
    # writes it, each tile while hot.
    case = make_case(
        [
            _node("Gemm", ["x", "w1", "b1"], ["h"]),
            _node("Relu", ["h"], ["a"]),
            _node("MatMul", ["a", "w2"], ["o"]),
        ],
        {"x": rand(rng, 50, 24)},
        ["a", "o"],
        {"w1": rand(rng, 24, 40), "b1": rand(rng, 40), "w2": rand(rng, 40, 8)},
        template="anchor_chain",
    )
    check(case, "chain_two_outputs", k=40, method="matmul_chain_staged")


def test_two_anchor_kernels_share_one_translation_unit(rng: np.random.Generator) -> None:
    """Whole models compile their kernels combined: helpers must not clash across anchors."""
    gemm = make_case(
        [_node("MatMul", ["x", "w"], ["y"]), _node("Relu", ["y"], ["o"])],
        {"x": rand(rng, 8, 16)},
        ["o"],
        {"w": rand(rng, 16, 4)},
    )
    conv = make_case(
        [_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]), _node("Relu", ["y"], ["o"])],
        {"x": rand(rng, 1, 3, 6, 6)},
        ["o"],
        {"w": rand(rng, 4, 3, 3, 3)},
    )
    spec_a, _ = spec_for(gemm, "unit_gemm")
    spec_b, _ = spec_for(conv, "unit_conv")
    ka, kb = emit_anchor(spec_a), emit_anchor(spec_b)
    both = AnchorKernel(ka.source + kb.source, "combined", True)
    for case, spec in ((gemm, spec_a), (conv, spec_b)):
        inits = {i.name: numpy_helper.to_array(i) for i in case.model.graph.initializer}
        values = [case.feeds.get(t.name, inits.get(t.name)) for t in spec.inputs]
        got = run_kernel(both, spec, values, unit=f"unit_{spec.symbol}")
        np.testing.assert_allclose(got[0], run_ort(case)[0], rtol=RTOL, atol=1e-5)


def test_chain_with_batched_weights_runs_in_two_stages(rng: np.random.Generator) -> None:
    # Scores = Q K^T, scaled, then x V: per-head weights rule out shared row blocks.
    case = make_case(
        [
            _node("MatMul", ["q", "kt"], ["s"]),
            _node("Mul", ["s", "scale"], ["ss"]),
            _node("MatMul", ["ss", "v"], ["y"]),
            _node("Add", ["y", "r"], ["o"]),
        ],
        {
            "q": rand(rng, 2, 3, 8, 6),
            "kt": rand(rng, 2, 3, 6, 8),
            "v": rand(rng, 2, 3, 8, 6),
            "r": rand(rng, 2, 3, 8, 6),
        },
        ["o"],
        {"scale": np.array(0.5, dtype=np.float32)},
        template="anchor_chain",
    )
    kernel = check(case, "chain_staged", k=8, method="matmul_chain_staged")
    assert "chain_staged_s1(a1);" in kernel.source and "free(mid);" in kernel.source


def _gemv_mlp(rng: np.random.Generator) -> tuple:
    """A batch-1 MLP block, x @ w1 + b1 -> Relu -> @ w2: one row, so the row-block chain declines
    for streaming and the chain runs as two stages that each split their columns."""
    nodes = [
        _node("MatMul", ["x", "w1"], ["h"]),
        _node("Add", ["h", "b1"], ["hb"]),
        _node("Relu", ["hb"], ["a"]),
        _node("MatMul", ["a", "w2"], ["o"]),
    ]
    # enough weight floats to stream for a parallel split (lower/chain.py: _streams_alone)
    weights = {"w1": rand(rng, 128, 384), "b1": rand(rng, 384), "w2": rand(rng, 384, 96)}
    return nodes, {"x": rand(rng, 1, 128)}, weights


def test_staged_gemv_chain_contracts_on_weights_packed_once(rng: np.random.Generator) -> None:
    """Both stages of a staged chain read their weights packed (one argument, the first stage's
    block, then the second's), not raw through BLAS: the packed argument is filled with NaN
    before prepack, so a stage reading another's block or an unpacked gap fails the comparison."""
    nodes, feeds, weights = _gemv_mlp(rng)
    case = make_case(nodes, feeds, ["o"], weights, template="anchor_chain")
    kernel = check(case, "gemv_chain", k=384, method="matmul_chain_staged", weights=True)
    assert not kernel.uses_blas
    for stage in ("gemv_chain_s1", "gemv_chain_s2"):
        assert f"{stage}_prepack(p" in kernel.source
    # w1 and w2 (parameters 1 and 3) are read only packed; the bias b1 (2) is read raw
    assert "const int64_t gemv_chain_prepack_only = 10;" in kernel.source


def test_staged_gemv_chain_releases_its_raw_weights(rng: np.random.Generator, kernel_cache) -> None:
    """Through the runtime: the chain's matrices are held only packed, the bias raw."""
    nodes, feeds, weights = _gemv_mlp(rng)
    model = make_model(nodes, {"x": [1, 128]}, ["o"], weights)
    compiled = compile_model(gaf.fuse(model).model, cache=kernel_cache, threads=2)
    assert [k["template"] for k in compiled.stats["per_kernel"]] == ["anchor_chain"]
    assert compiled.released_weights == ["w1", "w2"]
    got, want = compiled.run(feeds)["o"], ort_run(model, feeds)["o"]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL_PER_SQRT_K * math.sqrt(384))


def test_where_epilogue_with_a_constant_mask_reads_its_operands_unconditionally(kernel_cache) -> None:
    """gcc 12.2 -O3 -march=x86-64-v3 turned `mask[c] ? other[c] : x` (mask a uint8 table, 2
    columns) into masked loads that returned 0 for some lanes. The epilogue loads operands into
    locals first. Found by the differential test (seed 1705: MatMul > Where, max error 1.59)."""
    mask = np.array([0, 0, 1, 1, 1, 1, 0, 1, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0] * 2, dtype=bool)
    nodes = [_node("MatMul", ["x", "w"], ["y"]), _node("Where", ["m", "other", "y"], ["o"])]
    inits = {"w": np.float32([[-1.1, -0.65], [0.87, 1.17]]), "m": mask.reshape(1, 12, 2, 2)}
    model = make_model(nodes, {"x": [1, 12, 2, 2], "other": [1, 12, 2, 2]}, ["o"], inits)
    compiled = compile_model(gaf.fuse(model).model, cache=kernel_cache, threads=1)
    assert [(k["template"], k["ops"]) for k in compiled.stats["per_kernel"]] == [("anchor", 2)]
    feeds = random_feeds(model)
    assert_close(compiled(feeds), ort_run(model, feeds))
