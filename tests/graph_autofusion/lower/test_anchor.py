"""Lowering MatMul/Gemm anchors to kernel IR: the tile loop, one contraction call per tile, the
epilogue loop nest; and the rendered kernels computing what numpy computes."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from lowered_kernels import anchor_spec, calls, check_strided_operand_matmul, run, strided_operand_matmul
from onnx import helper

from graph_autofusion.backend.cpu.contraction import PANEL_QUANTUM
from graph_autofusion.backend.cpu.render_c import render_kernel
from graph_autofusion.kernel_ir import Loop, format_kernel
from graph_autofusion.lower.anchor import (
    CONTRACTION_ROUTINE,
    MIN_TILES,
    PARALLEL_MIN_MACS,
    STREAMED_WEIGHT_MACS,
    lower_anchor,
    method_of,
    parallel_work,
    tile_sizes,
)
from graph_autofusion.plan.anchor_match import match_anchor


def test_tiles_are_dynamic_parallel_tasks_with_one_contraction_call_and_a_vector_epilogue() -> None:
    spec = anchor_spec(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "b"], ["z"]),
         helper.make_node("Relu", ["z"], ["o"])],
        {"x": (160, 64), "w": (64, 300), "b": (300,)},
        {"o": (160, 300)},
        {"y": (160, 300), "z": (160, 300)},
    )  # fmt: skip
    kernel = lower_anchor(spec)
    (loop,) = kernel.body
    assert isinstance(loop, Loop) and loop.parallel and loop.dynamic and loop.stop == 4  # 2 x 2 tiles
    (call,) = calls(kernel.body)
    assert call.function == CONTRACTION_ROUTINE
    text = format_kernel(kernel)
    # its multiply-adds ride along, for the runtime's bar on waking the team (Loop.macs)
    assert loop.macs == 160 * 64 * 300 and f"for task < 4 parallel dynamic macs({loop.macs}):" in text
    assert "for n0 <= c < n1 vector:" in text  # the epilogue runs over the hot tile's columns
    assert "in2[c]" in text  # the bias: a unit-stride run along the row
    assert "scratch" not in text and method_of(kernel) == "gemm"


def test_transformer_gemms_split_into_an_even_count_of_whole_panel_tiles() -> None:
    """BERT / GPT-2 / ViT projections (S = 128, 197; K x N = 768 x 768 / 2304 / 3072, 3072 x 768):
    two threads take equal shares of equal tiles, each a whole number of the library's panels.
    N = 2304 used to make 9 tiles of 240 columns and one of 144 (5 against 4.6 tiles' work)."""
    for m in (128, 197):
        for k, n in ((768, 768), (768, 2304), (768, 3072), (3072, 768)):
            spec = anchor_spec(
                [helper.make_node("MatMul", ["x", "w"], ["o"])],
                {"x": (1, m, k), "w": (k, n)},
                {"o": (1, m, n)},
            )
            p = match_anchor(spec).contraction
            assert p is not None
            mb, nb = tile_sizes(p)
            tiles = -(-m // mb) * -(-n // nb)
            assert nb % PANEL_QUANTUM == 0 and n % nb == 0, (m, k, n, nb)
            assert tiles >= MIN_TILES and tiles % 2 == 0, (m, k, n, mb, nb)
            # row tiles differ by at most one row (197 tokens: 99 + 98, not 104 + 93)
            assert -(-m // mb) * mb - m < -(-m // mb), (m, mb)
            if (m, n) == (128, 2304):
                assert (mb, nb) == (128, 192)


def test_small_products_stay_on_the_calling_thread() -> None:
    spec = anchor_spec(
        [helper.make_node("MatMul", ["x", "w"], ["o"])], {"x": (4, 8), "w": (8, 3)}, {"o": (4, 3)}
    )
    kernel = lower_anchor(spec)
    (loop,) = kernel.body
    assert not loop.parallel and not loop.dynamic
    assert len(calls(kernel.body)) == 1
    assert "for r" not in format_kernel(kernel)  # the product is the output: no epilogue at all


def test_a_gemv_streaming_a_large_weight_splits_its_columns_over_the_threads() -> None:
    """One row against a 512 x 256 weight: 131K multiply-adds, under PARALLEL_MIN_MACS, but each
    of the 131K weight floats is streamed once (`parallel_work`), which two cores do faster."""
    spec = anchor_spec(
        [helper.make_node("MatMul", ["x", "w"], ["o"])], {"x": (1, 512), "w": (512, 256)}, {"o": (1, 256)}
    )
    p = match_anchor(spec).contraction
    assert p is not None and p.macs < PARALLEL_MIN_MACS <= parallel_work(p)
    (loop,) = lower_anchor(spec).body
    assert isinstance(loop, Loop) and loop.parallel and loop.stop >= MIN_TILES
    assert loop.macs == 512 * 256 * STREAMED_WEIGHT_MACS


def test_batched_broadcast_matmul_with_gemm_addend_runs_like_numpy(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    spec = anchor_spec(
        [helper.make_node("MatMul", ["a", "b"], ["y"]), helper.make_node("Mul", ["y", "s"], ["o"])],
        {"a": (2, 1, 24, 16), "b": (3, 16, 40), "s": (40,)},
        {"o": (2, 3, 24, 40)},
        {"y": (2, 3, 24, 40)},
    )
    a, b, s = rng.standard_normal((2, 1, 24, 16)), rng.standard_normal((3, 16, 40)), rng.standard_normal(40)
    (got,) = run(lower_anchor(spec), [a, b, s], tmp_path)
    np.testing.assert_allclose(got.reshape(2, 3, 24, 40), np.matmul(a, b) * s, rtol=1e-5, atol=1e-4)

    gemm = anchor_spec(
        [helper.make_node("Gemm", ["x", "w", "c"], ["o"], alpha=0.5, beta=2.0, transA=1)],
        {"x": (9, 33), "w": (9, 70), "c": (33, 1)},
        {"o": (33, 70)},
        symbol="g",
    )
    x, w, c = rng.standard_normal((9, 33)), rng.standard_normal((9, 70)), rng.standard_normal((33, 1))
    (got,) = run(lower_anchor(gemm), [x, w, c], tmp_path)
    np.testing.assert_allclose(got.reshape(33, 70), 0.5 * x.T @ w + 2.0 * c, rtol=1e-5, atol=1e-4)


def test_operand_blas_cannot_address_is_packed_into_the_workspace(tmp_path: Path) -> None:
    """A view with no unit-stride axis (which the planner does not form today) is copied, a tile
    at a time, into the thread's workspace slice: scratch of the task loop, never malloc."""
    kernel = strided_operand_matmul()
    text = format_kernel(kernel)
    assert "scratch pa: f32" in text and method_of(kernel) == "batched_gemm_packed"
    assert "malloc" not in render_kernel(kernel).split("void k(", 1)[1]
    check_strided_operand_matmul(kernel, tmp_path, seed=1, rtol=1e-5)


def test_output_transpose_is_the_destination_layout(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    b, h, s, d = 2, 3, 8, 4
    spec = anchor_spec(
        [
            helper.make_node("MatMul", ["p", "v"], ["ctx"]),
            helper.make_node("Add", ["ctx", "bias"], ["cb"]),
            helper.make_node("Transpose", ["cb"], ["o"], perm=[0, 2, 1, 3]),
        ],
        {"p": (b, h, s, s), "v": (b, h, s, d), "bias": (d,)},
        {"o": (b, s, h, d)},
        {"ctx": (b, h, s, d), "cb": (b, h, s, d)},
    )
    kernel = lower_anchor(spec)
    (call,) = calls(kernel.body)
    assert str(call.args[-1]) == str(h * d)  # ldc: a head's rows are H*D apart in [B, S, H, D]
    pv = [rng.standard_normal(x) for x in ((b, h, s, s), (b, h, s, d), (d,))]
    (got,) = run(kernel, pv, tmp_path)
    want = (np.matmul(pv[0], pv[1]) + pv[2]).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(got.reshape(b, s, h, d), want, rtol=1e-5, atol=1e-4)
    assert math.prod(want.shape) == got.size
