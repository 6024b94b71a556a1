"""Reduction (row) template: reduce-*, softmax, layer norm, global pooling, with fused neighbours.

Tolerance (fp32): rtol 1e-5, atol 1e-6 against onnxruntime with optimizations disabled.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from cpu_backend_helpers import check, make_model
from onnx import helper

from graph_autofusion.backend.cpu.codegen.reduction import emit_reduction
from graph_autofusion.backend.cpu.extract import extract

F = onnx.TensorProto.FLOAT


def i64(*v: int) -> np.ndarray:
    return np.array(v, dtype=np.int64)


@pytest.mark.parametrize(
    "op",
    [
        "ReduceMean",
        "ReduceSum",
        "ReduceMax",
        "ReduceMin",
        "ReduceProd",
        "ReduceL2",
        "ReduceL1",
        "ReduceSumSquare",
        "ReduceLogSumExp",
    ],
)
@pytest.mark.parametrize(("axes", "keepdims"), [([-1], 1), ([1, 2], 0), ([0], 1)])
def test_reduce_ops(kernel_cache, op, axes, keepdims) -> None:
    nodes = [helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims)]
    model = make_model(nodes, {"x": [3, 4, 6]}, ["y"], {"axes": i64(*axes)})
    feeds = {"x": np.random.default_rng(2).uniform(0.5, 1.5, (3, 4, 6)).astype(np.float32)}
    check(model, kernel_cache, feeds=feeds)


@pytest.mark.parametrize("axis", [-1, 1, 0])
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_any_axis(kernel_cache, op, axis) -> None:
    check(make_model([helper.make_node(op, ["x"], ["y"], axis=axis)], {"x": [2, 5, 7]}, ["y"]), kernel_cache)


def test_attention_softmax_with_scale_and_mask_is_one_kernel(kernel_cache) -> None:
    nodes = [
        helper.make_node("Mul", ["s", "scale"], ["a"]),
        helper.make_node("Add", ["a", "mask"], ["b"]),
        helper.make_node("Softmax", ["b"], ["y"], axis=-1),
    ]
    model = make_model(nodes, {"s": [2, 2, 8, 8], "mask": [2, 1, 1, 8]}, ["y"], {"scale": np.float32(0.125)})
    compiled = check(model, kernel_cache, "reduction")
    assert compiled.stats["kernels"] == 1


def test_decomposed_softmax_is_one_kernel(kernel_cache) -> None:
    nodes = [
        helper.make_node("ReduceMax", ["x", "ax"], ["m"], keepdims=1),
        helper.make_node("Sub", ["x", "m"], ["d"]),
        helper.make_node("Exp", ["d"], ["e"]),
        helper.make_node("ReduceSum", ["e", "ax"], ["s"], keepdims=1),
        helper.make_node("Div", ["e", "s"], ["y"]),
    ]
    model = make_model(nodes, {"x": [6, 33]}, ["y"], {"ax": i64(-1)})
    compiled = check(model, kernel_cache, "reduction")
    source = emit_reduction(next(iter(extract(compiled.model).specs.values())))
    assert "row buffer" in source and "1 row buffer(s)" in source  # exp is computed once, kept in a row


def test_decomposed_layernorm_is_one_kernel(kernel_cache) -> None:
    hidden = 48
    rng = np.random.default_rng(3)
    nodes = [
        helper.make_node("Add", ["x", "res"], ["h"]),
        helper.make_node("ReduceMean", ["h", "ax"], ["mean"], keepdims=1),
        helper.make_node("Sub", ["h", "mean"], ["d"]),
        helper.make_node("Pow", ["d", "two"], ["d2"]),
        helper.make_node("ReduceMean", ["d2", "ax"], ["var"], keepdims=1),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["sd"]),
        helper.make_node("Div", ["d", "sd"], ["n"]),
        helper.make_node("Mul", ["n", "gamma"], ["g"]),
        helper.make_node("Add", ["g", "beta"], ["y"]),
    ]
    inits = {
        "ax": i64(-1),
        "two": np.float32(2.0),
        "eps": np.float32(1e-5),
        "gamma": rng.standard_normal(hidden).astype(np.float32),
        "beta": rng.standard_normal(hidden).astype(np.float32),
    }
    model = make_model(nodes, {"x": [2, 5, hidden], "res": [2, 5, hidden]}, ["h", "y"], inits)
    compiled = check(model, kernel_cache, "reduction")
    assert compiled.stats["kernels"] == 1


@pytest.mark.parametrize(("shape", "axis"), [([4, 16], -1), ([2, 3, 4, 5], 2), ([3, 10], 0)])
def test_layernormalization_op(kernel_cache, shape, axis) -> None:
    rng = np.random.default_rng(4)
    norm = shape[axis:]
    inits = {
        "g": rng.standard_normal(norm).astype(np.float32),
        "b": rng.standard_normal(norm).astype(np.float32),
    }
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=axis, epsilon=1e-5)]
    check(make_model(nodes, {"x": shape}, ["y"], inits, opset=17), kernel_cache)


def test_batchnorm_affine_global_average_pool_add(kernel_cache) -> None:
    rng = np.random.default_rng(5)
    nodes = [
        helper.make_node("Mul", ["x", "scale"], ["a"]),
        helper.make_node("Add", ["a", "shift"], ["b"]),
        helper.make_node("Relu", ["b"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        helper.make_node("Add", ["p", "bias"], ["y"]),
    ]
    inits = {
        "scale": rng.standard_normal((4, 1, 1)).astype(np.float32),
        "shift": rng.standard_normal((4, 1, 1)).astype(np.float32),
        "bias": rng.standard_normal((4, 1, 1)).astype(np.float32),
    }
    model = make_model(nodes, {"x": [2, 4, 5, 6]}, ["y"], inits)
    compiled = check(model, kernel_cache, "reduction")
    assert compiled.stats["kernels"] == 1


def test_global_max_pool_and_large_rows_parallel(kernel_cache) -> None:
    check(
        make_model([helper.make_node("GlobalMaxPool", ["x"], ["y"])], {"x": [1, 3, 7, 7]}, ["y"]),
        kernel_cache,
    )
    model = make_model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], {"x": [64, 1024]}, ["y"])
    source = emit_reduction(next(iter(extract(model).specs.values())))
    assert "omp parallel" in source and "omp simd reduction" in source
    check(model, kernel_cache)


def test_long_sum_stays_accurate(kernel_cache) -> None:
    model = make_model(
        [helper.make_node("ReduceSum", ["x", "ax"], ["y"], keepdims=0)],
        {"x": [2, 50000]},
        ["y"],
        {"ax": i64(1)},
    )
    feeds = {"x": (np.random.default_rng(6).standard_normal((2, 50000)) + 3).astype(np.float32)}
    compiled = check(model, kernel_cache, feeds=feeds)
    exact = feeds["x"].astype(np.float64).sum(axis=1)
    np.testing.assert_allclose(compiled(feeds)["y"], exact, rtol=1e-6)


@pytest.mark.parametrize(
    "move",
    [
        helper.make_node("Transpose", ["a"], ["m"], perm=[1, 0]),
        helper.make_node("Gather", ["a", "idx"], ["m"], axis=1),
    ],
    ids=["transpose", "gather"],
)
def test_an_expensive_value_read_through_a_move_is_not_row_buffered(kernel_cache, move) -> None:
    """Asin (costly, buffered) feeds a Transpose/Slice before LayerNormalization: the buffer held
    Asin's values by flat offset, not at the row positions the Transpose maps to.

    Found by the differential test (seed 1188: Tanh > Mul > Asin > Squeeze > Transpose >
    LayerNormalization, max error 2.8; seed 736 likewise through a Gather).
    """
    nodes = [
        helper.make_node("Tanh", ["x"], ["t"]),
        helper.make_node("Asin", ["t"], ["a"]),
        move,
        helper.make_node("LayerNormalization", ["m", "g", "b"], ["y"], axis=1),
    ]
    norm = (5,) if move.op_type == "Transpose" else (2, 2)
    inits = {
        "g": np.linspace(0.5, 1.5, int(np.prod(norm)), dtype=np.float32).reshape(norm),
        "b": np.linspace(-0.2, 0.2, int(np.prod(norm)), dtype=np.float32).reshape(norm),
    }
    if move.op_type == "Gather":
        inits["idx"] = np.array([[3, 0], [1, 2]], dtype=np.int64)
    check(make_model(nodes, {"x": [5, 4]}, ["y"], inits), kernel_cache, "reduction")
