"""Views and output Transposes after an anchor, compiled for real and compared with onnxruntime.

Every accepted case is also run through the planner's `classify`, so a group the planner forms is
one the generator compiles (an accepted group the generator refused would fall back at runtime).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from anchor_helpers import Case, check, contraction_calls, make_case, rand, spec_for
from onnx import helper

import graph_autofusion as gaf
from graph_autofusion import zoo
from graph_autofusion.backend.cpu.codegen.anchor import emit_anchor
from graph_autofusion.backend.cpu.codegen.common import CodegenUnsupported
from graph_autofusion.ir import Graph
from graph_autofusion.plan.templates import classify


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(4321)


def _node(op: str, ins: list[str], outs: list[str], **attrs: object):
    return helper.make_node(op, ins, outs, name=outs[0], **attrs)


def _i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def planned(case: Case) -> str | None:
    """The template the planner gives the whole graph as one group (None: refused)."""
    graph = Graph(case.model)
    template, _ = classify(graph, range(len(graph.nodes)))
    return template


def check_planned(case: Case, symbol: str, *, k: int, method: str | None = None):
    assert planned(case) == case.template
    return check(case, symbol, k=k, method=method)


# -- views among the epilogue ops ----------------------------------------------------------------


def test_matmul_bias_reshape_residual(rng: np.random.Generator) -> None:
    """BERT/ViT: MatMul -> Add(bias) -> Reshape [B*S, N] -> [B, S, N] -> Add(residual)."""
    case = make_case(
        [
            _node("MatMul", ["x", "w"], ["y"]),
            _node("Add", ["y", "b"], ["z"]),
            _node("Reshape", ["z", "shape"], ["z3"]),
            _node("Add", ["z3", "res"], ["o"]),
        ],
        {"x": rand(rng, 32, 48), "res": rand(rng, 2, 16, 40)},
        ["o"],
        {"w": rand(rng, 48, 40), "b": rand(rng, 40), "shape": _i64(2, 16, 40)},
    )
    kernel = check_planned(case, "mm_reshape_residual", k=48, method="gemm")
    assert "Add -> Reshape -> Add" in kernel.source
    assert re.search(r"in\d+\[\(\(r \* 40\) \+ c\)\]", kernel.source)  # residual: linear index, unit stride


def test_gemm_reshape_residual_gpt2_conv1d(rng: np.random.Generator) -> None:
    """GPT-2's Conv1D: Gemm(C = bias) -> Reshape -> Add(residual); also returns the Gemm output."""
    case = make_case(
        [
            _node("Gemm", ["x", "w", "b"], ["y"]),
            _node("Reshape", ["y", "shape"], ["y3"]),
            _node("Add", ["y3", "res"], ["o"]),
        ],
        {"x": rand(rng, 24, 32), "res": rand(rng, 3, 8, 20)},
        ["o", "y"],
        {"w": rand(rng, 32, 20), "b": rand(rng, 20), "shape": _i64(3, 8, 20)},
    )
    check_planned(case, "gemm_reshape_residual", k=32, method="gemm")


def test_bias_broadcasts_against_the_viewed_shape(rng: np.random.Generator) -> None:
    """After [M, H*D] -> [M, H, D] a [D] bias repeats inside each row and an [H, 1] scale is per head."""
    case = make_case(
        [
            _node("MatMul", ["x", "w"], ["y"]),
            _node("Reshape", ["y", "shape"], ["y3"]),
            _node("Add", ["y3", "bd"], ["a"]),
            _node("Mul", ["a", "sh"], ["m"]),
            _node("Relu", ["m"], ["o"]),
        ],
        {"x": rand(rng, 12, 16)},
        ["o"],
        {"w": rand(rng, 16, 24), "bd": rand(rng, 8), "sh": rand(rng, 3, 1), "shape": _i64(12, 3, 8)},
    )
    check_planned(case, "mm_view_bias", k=16, method="gemm")


def test_view_that_cuts_across_rows_uses_linear_index(rng: np.random.Generator) -> None:
    """[6, 10] viewed as [5, 12]: rows of the tile do not line up with rows of the view."""
    case = make_case(
        [
            _node("MatMul", ["x", "w"], ["y"]),
            _node("Reshape", ["y", "shape"], ["v"]),
            _node("Add", ["v", "row"], ["a"]),
            _node("Mul", ["a", "col"], ["o"]),
        ],
        {"x": rand(rng, 6, 16)},
        ["o"],
        {"w": rand(rng, 16, 10), "row": rand(rng, 12), "col": rand(rng, 5, 1), "shape": _i64(5, 12)},
    )
    kernel = check_planned(case, "mm_view_across_rows", k=16, method="gemm")
    assert re.search(r"in\d+\[.*\(\(r \* 10\) \+ c\)", kernel.source)


def test_values_before_and_after_a_view_both_returned(rng: np.random.Generator) -> None:
    case = make_case(
        [
            _node("MatMul", ["x", "w"], ["y"]),
            _node("Add", ["y", "b"], ["z"]),
            _node("Flatten", ["z"], ["f"], axis=2),
            _node("Sigmoid", ["f"], ["o"]),
        ],
        {"x": rand(rng, 2, 4, 6, 16)},
        ["z", "o"],
        {"w": rand(rng, 16, 12), "b": rand(rng, 12)},
    )
    check_planned(case, "mm_flatten_two_outputs", k=16, method="gemm")


def test_squeeze_unsqueeze_between_epilogue_ops(rng: np.random.Generator) -> None:
    case = make_case(
        [
            _node("MatMul", ["x", "w"], ["y"]),
            _node("Unsqueeze", ["y", "ax"], ["u"]),
            _node("Add", ["u", "b"], ["a"]),
            _node("Squeeze", ["a", "ax"], ["s"]),
            _node("Tanh", ["s"], ["o"]),
        ],
        {"x": rand(rng, 10, 16)},
        ["o"],
        {"w": rand(rng, 16, 14), "b": rand(rng, 1, 14), "ax": _i64(0)},
    )
    check_planned(case, "mm_unsqueeze_squeeze", k=16, method="gemm")


def test_conv_reshape_position_add(rng: np.random.Generator) -> None:
    """ViT's patch embedding: Conv -> Reshape [N, C, H*W] -> Add(position [C, H*W])."""
    case = make_case(
        [
            _node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[2, 2], strides=[2, 2]),
            _node("Reshape", ["y", "shape"], ["f"]),
            _node("Add", ["f", "pos"], ["o"]),
        ],
        {"x": rand(rng, 2, 3, 8, 8)},
        ["o"],
        {"w": rand(rng, 6, 3, 2, 2), "b": rand(rng, 6), "pos": rand(rng, 6, 16), "shape": _i64(2, 6, 16)},
    )
    assert planned(case) == "anchor"
    check(case, "conv_reshape_pos", k=12)


def test_chain_with_view_after_second_matmul(rng: np.random.Generator) -> None:
    case = make_case(
        [
            _node("MatMul", ["x", "w1"], ["h"]),
            _node("Relu", ["h"], ["hr"]),
            _node("MatMul", ["hr", "w2"], ["y"]),
            _node("Add", ["y", "b"], ["z"]),
            _node("Reshape", ["z", "shape"], ["z3"]),
            _node("Add", ["z3", "res"], ["o"]),
        ],
        {"x": rand(rng, 32, 16), "res": rand(rng, 4, 8, 12)},
        ["o"],
        {"w1": rand(rng, 16, 24), "w2": rand(rng, 24, 12), "b": rand(rng, 12), "shape": _i64(4, 8, 12)},
        template="anchor_chain",
    )
    check_planned(case, "chain_view_tail", k=24 * 4, method="matmul_chain")


def test_chain_with_view_inside_first_epilogue(rng: np.random.Generator) -> None:
    """MatMul -> Reshape -> Add -> Relu -> MatMul: the view between the first GEMM's epilogue ops
    keeps the row-block chain (the intermediate is linear in the per-thread block)."""
    case = make_case(
        [
            _node("MatMul", ["x", "w1"], ["h"]),
            _node("Reshape", ["h", "shape"], ["h3"]),
            _node("Add", ["h3", "b1"], ["ha"]),
            _node("Relu", ["ha"], ["hr"]),
            _node("MatMul", ["hr", "w2"], ["o"]),
        ],
        {"x": rand(rng, 24, 16)},
        ["o"],
        {
            "w1": rand(rng, 16, 20),
            "shape": _i64(4, 6, 20),
            "b1": rand(rng, 6, 20),
            "w2": rand(rng, 20, 12),
        },
        template="anchor_chain",
    )
    check_planned(case, "chain_view_inside", k=20 * 4, method="matmul_chain")


# -- an output Transpose folded into the GEMM's stores -------------------------------------------


def test_attention_context_stores_transposed(rng: np.random.Generator) -> None:
    """probs [B,H,S,S] x V [B,H,S,D] -> Transpose(0,2,1,3) -> Reshape [B, S, H*D], no copy."""
    b, h, s, d = 2, 3, 16, 8
    case = make_case(
        [
            _node("MatMul", ["p", "v"], ["ctx"]),
            _node("Transpose", ["ctx"], ["t"], perm=[0, 2, 1, 3]),
            _node("Reshape", ["t", "shape"], ["o"]),
        ],
        {"p": rand(rng, b, h, s, s), "v": rand(rng, b, h, s, d)},
        ["o"],
        {"shape": _i64(b, s, h * d)},
    )
    kernel = check_planned(case, "ctx_transposed", k=s, method="batched_gemm")
    assert contraction_calls(kernel.source)[0].endswith(f", {h * d});")  # ldc = H*D: head rows H*D apart
    assert "stored transposed" in kernel.source and "malloc" not in kernel.source


def test_epilogue_then_transpose_with_dense_side_output(rng: np.random.Generator) -> None:
    """Scale and bias run on the product's layout; the pre-Transpose value is also returned."""
    case = make_case(
        [
            _node("MatMul", ["a", "bm"], ["y"]),
            _node("Mul", ["y", "scale"], ["ys"]),
            _node("Add", ["ys", "bias"], ["z"]),
            _node("Transpose", ["z"], ["t"], perm=[1, 0, 2, 3]),
        ],
        {"a": rand(rng, 2, 3, 5, 12), "bm": rand(rng, 2, 3, 12, 7)},
        ["t", "z"],
        {"scale": np.array(0.25, dtype=np.float32), "bias": rand(rng, 7)},
    )
    check_planned(case, "bmm_epi_transpose", k=12, method="batched_gemm")


def test_shared_weights_do_not_fold_batch_into_rows_when_transposed(rng: np.random.Generator) -> None:
    """[B, S, K] x [K, N] would be one [B*S, K] GEMM, but Transpose(1, 0, 2) puts rows B*N apart."""
    case = make_case(
        [
            _node("MatMul", ["x", "w"], ["y"]),
            _node("Relu", ["y"], ["r"]),
            _node("Transpose", ["r"], ["o"], perm=[1, 0, 2]),
        ],
        {"x": rand(rng, 4, 6, 16)},
        ["o"],
        {"w": rand(rng, 16, 10)},
    )
    check_planned(case, "mm_shared_w_transposed", k=16, method="batched_gemm")


def test_view_before_transpose_and_broadcast_batch(rng: np.random.Generator) -> None:
    """Unsqueeze then Transpose(0, 1, 3, 2, 4) of a broadcast-batched product: still a stride change."""
    case = make_case(
        [
            _node("MatMul", ["a", "bm"], ["y"]),
            _node("Unsqueeze", ["y", "ax"], ["u"]),
            _node("Transpose", ["u"], ["t"], perm=[0, 1, 3, 2, 4]),
            _node("Flatten", ["t"], ["o"], axis=3),
        ],
        {"a": rand(rng, 2, 1, 6, 8), "bm": rand(rng, 1, 3, 8, 5)},
        ["o"],
        {"ax": _i64(0)},
    )
    check_planned(case, "bmm_unsqueeze_transpose", k=8, method="batched_gemm")


def test_gemm_identity_transpose(rng: np.random.Generator) -> None:
    case = make_case(
        [_node("Gemm", ["x", "w", "c"], ["y"], transB=1), _node("Transpose", ["y"], ["o"], perm=[0, 1])],
        {"x": rand(rng, 9, 16)},
        ["o"],
        {"w": rand(rng, 11, 16), "c": rand(rng, 11)},
    )
    check_planned(case, "gemm_identity_transpose", k=16, method="gemm")


def test_large_transposed_store_runs_parallel_tiles(rng: np.random.Generator) -> None:
    """Enough work for a thread team: tiles of several heads land interleaved in one buffer."""
    b, h, s, d = 1, 4, 128, 64
    case = make_case(
        [
            _node("MatMul", ["p", "v"], ["ctx"]),
            _node("Transpose", ["ctx"], ["t"], perm=[0, 2, 1, 3]),
            _node("Reshape", ["t", "shape"], ["o"]),
        ],
        {"p": rand(rng, b, h, s, s), "v": rand(rng, b, h, s, d)},
        ["o"],
        {"shape": _i64(b, s, h * d)},
    )
    kernel = check_planned(case, "ctx_transposed_large", k=s, method="batched_gemm")
    assert "#pragma omp parallel" in kernel.source


# -- what stays refused (the planner refuses these too; see tests/graph_autofusion/plan) ----------


def _refused(case: Case, symbol: str, match: str) -> None:
    assert planned(case) is None
    spec, _ = spec_for(case, symbol)
    with pytest.raises(CodegenUnsupported, match=match):
        emit_anchor(spec)


def test_transpose_moving_last_axis_is_refused(rng: np.random.Generator) -> None:
    case = make_case(
        [_node("MatMul", ["a", "bm"], ["y"]), _node("Transpose", ["y"], ["o"], perm=[0, 2, 1])],
        {"a": rand(rng, 2, 4, 8), "bm": rand(rng, 2, 8, 6)},
        ["o"],
    )
    _refused(case, "bad_perm", "moves the last axis")


def test_elementwise_after_transpose_is_refused(rng: np.random.Generator) -> None:
    case = make_case(
        [
            _node("MatMul", ["a", "bm"], ["y"]),
            _node("Transpose", ["y"], ["t"], perm=[1, 0, 2]),
            _node("Relu", ["t"], ["o"]),
        ],
        {"a": rand(rng, 2, 4, 8), "bm": rand(rng, 2, 8, 6)},
        ["o"],
    )
    _refused(case, "relu_after_t", "after the output Transpose")


def test_head_split_before_transpose_is_refused(rng: np.random.Generator) -> None:
    """[B, S, H*D] -> [B, S, H, D] -> Transpose(0,2,1,3): the product's rows would be scattered."""
    case = make_case(
        [
            _node("MatMul", ["x", "w"], ["y"]),
            _node("Reshape", ["y", "shape"], ["y4"]),
            _node("Transpose", ["y4"], ["o"], perm=[0, 2, 1, 3]),
        ],
        {"x": rand(rng, 2, 5, 8)},
        ["o"],
        {"w": rand(rng, 8, 12), "shape": _i64(2, 5, 3, 4)},
    )
    _refused(case, "head_split", "contiguous")


def test_conv_then_transpose_is_refused(rng: np.random.Generator) -> None:
    case = make_case(
        [
            _node("Conv", ["x", "w"], ["y"], kernel_shape=[1, 1]),
            _node("Transpose", ["y"], ["o"], perm=[0, 2, 1, 3]),
        ],
        {"x": rand(rng, 1, 3, 4, 4)},
        ["o"],
        {"w": rand(rng, 5, 3, 1, 1)},
    )
    _refused(case, "conv_transpose_tail", "Transpose 'o' after Conv 'y' would need a copy")


def test_two_transposed_outputs_are_refused(rng: np.random.Generator) -> None:
    case = make_case(
        [
            _node("MatMul", ["a", "bm"], ["y"]),
            _node("Transpose", ["y"], ["t"], perm=[1, 0, 2]),
            _node("Reshape", ["t", "shape"], ["o"]),
        ],
        {"a": rand(rng, 2, 4, 8), "bm": rand(rng, 2, 8, 6)},
        ["t", "o"],
        {"shape": _i64(4, 12)},
    )
    _refused(case, "two_views_out", "leave the kernel")


# -- end to end --------------------------------------------------------------------------------


def test_gpt2_tails_fuse_and_verify() -> None:
    """GPT-2's Gemm -> Reshape -> Add(residual) and the context Transpose join their anchors, and
    the compiled model still matches onnxruntime. (Attention off: by default the context
    Transpose's MatMul is inside the attention kernel.)"""
    model = zoo.build("gpt2", num_layers=1, hidden=64, heads=2, seq_len=16, vocab=100)
    fused = gaf.fuse(model, gaf.FusionConfig(disabled_patterns=["attention"]))
    graph = fused.plan.graph
    bodies = [
        [graph.nodes[i].op_type for i in grp.members]
        for grp in fused.plan.kernels
        if grp.template == "anchor"
    ]
    assert any("Gemm" in ops and "Add" in ops and "Reshape" in ops for ops in bodies), bodies
    assert any(ops.count("Transpose") == 2 and "MatMul" in ops for ops in bodies), bodies
    result = fused.verify()
    assert result.passed, result.to_dict()
    assert not fused._compiled.unsupported
