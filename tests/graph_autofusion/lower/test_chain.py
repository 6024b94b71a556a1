"""Two chained MatMul/Gemm anchors lowered from the planner's `ChainMatch` (lower/chain.py):
per row block both products and both epilogues, the intermediate in a per-thread workspace
slice. Every kernel is compiled, called the way the runtime calls it (prepack once, packed
array, workspace) and compared with onnxruntime, on OpenBLAS and on the contraction library."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from lowered_kernels import calls
from onnx import helper

from graph_autofusion.backend.cpu.contraction import CONTRACTION_ENV
from graph_autofusion.kernel_ir import Loop
from graph_autofusion.lower.anchor import CONTRACTION_ROUTINE, PACKED_B_ROUTINE
from graph_autofusion.lower.chain import StreamingChain, lower_chain
from graph_autofusion.lower.values import Unsupported

# The anchor kernels' harness (build a case, run it against onnxruntime) lives with their tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "backend" / "cpu" / "codegen"))
from anchor_helpers import check, make_case, rand, spec_for

N = helper.make_node
GELU = {
    "sqrt2": np.array(1.4142135381698608, dtype=np.float32),
    "one": np.array(1.0, dtype=np.float32),
    "half": np.array(0.5, dtype=np.float32),
}


@pytest.fixture(params=["blas", "library"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(CONTRACTION_ENV, request.param)
    return str(request.param)


def _check_chain(case, symbol: str, k: int, mode: str) -> None:  # type: ignore[no-untyped-def]
    """The lowered chain runs both products per row block through the routine the mode picks
    (both weights packed at load on the library), and computes what onnxruntime computes."""
    spec, _ = spec_for(case, symbol, weights=True)
    kernel = lower_chain(spec)
    (loop,) = kernel.body
    assert isinstance(loop, Loop) and [b.name for b in loop.scratch] == ["h"]
    routine = PACKED_B_ROUTINE if mode == "library" else CONTRACTION_ROUTINE
    assert [c.function for c in calls(kernel.body)] == [routine, routine]
    assert len(kernel.packed) == (2 if mode == "library" else 0)
    check(case, symbol, k=k, method="matmul_chain", weights=True)


def test_relu_between_odd_sizes(mode: str) -> None:
    rng = np.random.default_rng(1)
    case = make_case(
        [N("MatMul", ["x", "w1"], ["h"]), N("Relu", ["h"], ["a"]), N("MatMul", ["a", "w2"], ["o"])],
        {"x": rand(rng, 37, 29)},
        ["o"],
        {"w1": rand(rng, 29, 53), "w2": rand(rng, 53, 19)},
        template="anchor_chain",
    )
    _check_chain(case, f"chain_relu_{mode}", 53, mode)


def test_no_middle_epilogue_and_a_bias_after(mode: str) -> None:
    """Nothing between the products: the first writes the workspace and the second reads it raw."""
    rng = np.random.default_rng(2)
    case = make_case(
        [N("MatMul", ["x", "w1"], ["h"]), N("MatMul", ["h", "w2"], ["y"]), N("Add", ["y", "b"], ["o"])],
        {"x": rand(rng, 2, 21, 24)},
        ["o"],
        {"w1": rand(rng, 24, 40), "w2": rand(rng, 40, 13), "b": rand(rng, 13)},
        template="anchor_chain",
    )
    _check_chain(case, f"chain_plain_{mode}", 40, mode)


def test_reshape_between_and_gemm_trans_b(mode: str) -> None:
    """A row-keeping Reshape between the products, and a Gemm (transB, alpha, bias) second."""
    rng = np.random.default_rng(3)
    case = make_case(
        [
            N("MatMul", ["x", "w1"], ["h"]),
            N("Relu", ["h"], ["hr"]),
            N("Reshape", ["hr", "shape"], ["h2"]),
            N("Gemm", ["h2", "w2", "b2"], ["o"], transB=1, alpha=0.5),
        ],
        {"x": rand(rng, 3, 11, 20)},
        ["o"],
        {
            "w1": rand(rng, 20, 36),
            "shape": np.array([33, 36], dtype=np.int64),
            "w2": rand(rng, 17, 36),
            "b2": rand(rng, 17),
        },
        template="anchor_chain",
    )
    _check_chain(case, f"chain_reshape_{mode}", 36 * 4, mode)


def test_gelu_between_and_many_row_blocks(mode: str) -> None:
    """GELU reads the first product on three branches; 610 rows make four row blocks of 156 (the
    last one partial, 142), run by the thread team."""
    rng = np.random.default_rng(4)
    case = make_case(
        [
            N("MatMul", ["x", "w1"], ["h"]),
            N("Add", ["h", "b1"], ["hb"]),
            N("Div", ["hb", "sqrt2"], ["g_div"]),
            N("Erf", ["g_div"], ["g_erf"]),
            N("Add", ["g_erf", "one"], ["g_add"]),
            N("Mul", ["hb", "g_add"], ["g_mul"]),
            N("Mul", ["g_mul", "half"], ["a"]),
            N("MatMul", ["a", "w2"], ["y"]),
            N("Add", ["y", "b2"], ["z"]),
            N("Add", ["z", "x"], ["o"]),
        ],
        {"x": rand(rng, 610, 64)},
        ["o"],
        {
            "w1": rand(rng, 64, 200),
            "b1": rand(rng, 200),
            "w2": rand(rng, 200, 64) * 0.25,
            "b2": rand(rng, 64),
            **GELU,
        },
        template="anchor_chain",
    )
    spec, _ = spec_for(case, "probe")
    (loop,) = lower_chain(spec).body
    assert isinstance(loop, Loop) and loop.parallel and loop.stop == 4
    _check_chain(case, f"chain_gelu_{mode}", 200, mode)


def test_row_blocks_balance_the_two_threads(mode: str) -> None:
    """ViT-B/16's 197 tokens: two blocks of 100 rows (97 in the second), not blocks of 56, 56, 56
    and 29 that leave one thread two blocks and the other one and a half (`row_blocks`)."""
    rng = np.random.default_rng(5)
    case = make_case(
        [
            N("MatMul", ["x", "w1"], ["h"]),
            N("Relu", ["h"], ["a"]),
            N("MatMul", ["a", "w2"], ["y"]),
        ],
        {"x": rand(rng, 197, 256)},
        ["y"],
        {"w1": rand(rng, 256, 512) * 0.1, "w2": rand(rng, 512, 64) * 0.1},
        template="anchor_chain",
    )
    spec, _ = spec_for(case, "probe")
    (loop,) = lower_chain(spec).body
    assert isinstance(loop, Loop) and loop.parallel and loop.stop == 2
    assert [b.size for b in loop.scratch] == [100 * 512]  # a block's intermediate, per thread
    _check_chain(case, f"chain_balanced_{mode}", 512, mode)


def test_residual_and_layer_norm_after_the_second_product(mode: str) -> None:
    """GPT-2's MLP block with the next LayerNormalization: the chain computes whole rows of the
    second product, so each row block is normalised in place after its epilogue; the residual
    sum leaves too (the residual stream), and 45 columns are no multiple of a vector width."""
    rng = np.random.default_rng(5)
    case = make_case(
        [N("MatMul", ["x", "w1"], ["h"]), N("Relu", ["h"], ["a"]), N("MatMul", ["a", "w2"], ["y"]),
         N("Add", ["y", "res"], ["s"]), N("LayerNormalization", ["s", "g", "b"], ["o"], axis=-1)],
        {"x": rand(rng, 70, 24), "res": rand(rng, 70, 45)},
        ["o", "s"],
        {"w1": rand(rng, 24, 64), "w2": rand(rng, 64, 45), "g": rand(rng, 45), "b": rand(rng, 45)},
        template="anchor_chain",
    )  # fmt: skip
    _check_chain(case, f"chain_norm_{mode}", 64, mode)


def test_a_single_row_chain_streaming_large_weights_runs_as_two_parallel_stages(mode: str) -> None:
    """A batch-1 MLP block: one row makes one row block, which one thread would run, streaming
    both weights alone (164K multiply-adds, under PARALLEL_MIN_MACS, as many weight floats). The
    chain declines; its two products run one after the other, each splitting its columns over
    the threads (the first's 131K weight floats are worth it), and compute what onnxruntime does."""
    rng = np.random.default_rng(6)
    case = make_case(
        [N("MatMul", ["x", "w1"], ["h"]), N("Relu", ["h"], ["a"]), N("MatMul", ["a", "w2"], ["o"])],
        {"x": rand(rng, 1, 512)},
        ["o"],
        {"w1": rand(rng, 512, 256) * 0.1, "w2": rand(rng, 256, 128) * 0.1},
        template="anchor_chain",
    )
    spec, _ = spec_for(case, f"chain_gemv_{mode}", weights=True)
    with pytest.raises(Unsupported, match="one row block"):
        lower_chain(spec)
    kernel = check(case, f"chain_gemv_{mode}", k=512, weights=True)
    assert kernel.source.count("#pragma omp parallel for") >= 1  # the first product at least


def test_a_streaming_chain_the_stages_cannot_run_stays_a_chain(mode: str) -> None:
    """The same single row with a Reshape before a Gemm, which a stage cannot take as its
    prologue: the chain declines (`StreamingChain`), the stages fail, and the row-block chain runs
    after all, on one thread, rather than leaving the kernel to the host."""
    rng = np.random.default_rng(7)
    case = make_case(
        [
            N("MatMul", ["x", "w1"], ["h"]),
            N("Relu", ["h"], ["hr"]),
            N("Reshape", ["hr", "shape"], ["h2"]),
            N("Gemm", ["h2", "w2", "b2"], ["o"], transB=1),
        ],
        {"x": rand(rng, 1, 512)},
        ["o"],
        {
            "w1": rand(rng, 512, 256) * 0.1,
            "shape": np.array([1, 256], dtype=np.int64),
            "w2": rand(rng, 128, 256) * 0.1,
            "b2": rand(rng, 128),
        },
        template="anchor_chain",
    )
    spec, _ = spec_for(case, f"chain_streaming_reshape_{mode}", weights=True)
    with pytest.raises(StreamingChain):
        lower_chain(spec)
    check(case, f"chain_streaming_reshape_{mode}", k=512, method="matmul_chain", weights=True)
