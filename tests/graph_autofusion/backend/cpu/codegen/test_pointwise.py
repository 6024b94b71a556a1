"""Pointwise template: elementwise, broadcast and injective ops, fused and alone, vs onnxruntime.

Tolerance (fp32): rtol 1e-5, atol 1e-6 against onnxruntime with optimizations disabled.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from cpu_backend_helpers import check, make_model
from onnx import helper

from graph_autofusion.backend.cpu.codegen.pointwise import emit_pointwise
from graph_autofusion.backend.cpu.extract import extract

F = onnx.TensorProto.FLOAT
I64 = onnx.TensorProto.INT64


def i64(*v: int) -> np.ndarray:
    return np.array(v, dtype=np.int64)


def test_chain_with_broadcast_is_one_kernel(kernel_cache) -> None:
    nodes = [
        helper.make_node("Add", ["x", "b"], ["a"]),
        helper.make_node("Mul", ["a", "s"], ["m"]),
        helper.make_node("Tanh", ["m"], ["g"]),
        helper.make_node("Sigmoid", ["g"], ["y"]),
    ]
    model = make_model(
        nodes, {"x": [2, 3, 8, 5], "s": [3, 1, 1]}, ["y"], {"b": np.linspace(-1, 1, 5, dtype=np.float32)}
    )
    compiled = check(model, kernel_cache, "pointwise")
    assert compiled.stats["kernels"] == 1


@pytest.mark.parametrize("perm", [[0, 2, 1], [2, 0, 1], [1, 2, 0]])
def test_transpose_then_elementwise(kernel_cache, perm) -> None:
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=perm), helper.make_node("Relu", ["t"], ["y"])]
    check(make_model(nodes, {"x": [3, 4, 5]}, ["y"]), kernel_cache, "pointwise")


@pytest.mark.parametrize(
    ("starts", "ends", "axes", "steps"),
    [
        ([1], [4], [1], [1]),
        ([-1], [-100], [2], [-1]),
        ([0, 1], [5, 9], [1, 2], [2, 3]),
        ([2], [100], [0], [1]),
    ],
)
def test_slice(kernel_cache, starts, ends, axes, steps) -> None:
    nodes = [
        helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["s"]),
        helper.make_node("Neg", ["s"], ["y"]),
    ]
    inits = {"st": i64(*starts), "en": i64(*ends), "ax": i64(*axes), "sp": i64(*steps)}
    check(make_model(nodes, {"x": [4, 6, 9]}, ["y"], inits), kernel_cache, "pointwise")


def test_concat_of_computed_inputs(kernel_cache) -> None:
    nodes = [
        helper.make_node("Exp", ["a"], ["ea"]),
        helper.make_node("Abs", ["b"], ["ab"]),
        helper.make_node("Concat", ["ea", "ab", "c"], ["y"], axis=1),
    ]
    check(
        make_model(nodes, {"a": [2, 3, 4], "b": [2, 1, 4], "c": [2, 5, 4]}, ["y"]), kernel_cache, "pointwise"
    )


def test_concat_on_last_axis_alone(kernel_cache) -> None:
    nodes = [helper.make_node("Concat", ["a", "b"], ["y"], axis=-1)]
    check(make_model(nodes, {"a": [3, 2], "b": [3, 7]}, ["y"]), kernel_cache)


def test_gather_constant_indices_with_negatives(kernel_cache) -> None:
    nodes = [helper.make_node("Gather", ["x", "idx"], ["g"], axis=1), helper.make_node("Relu", ["g"], ["y"])]
    inits = {"idx": np.array([[0, -1], [2, -3]], dtype=np.int64)}
    check(make_model(nodes, {"x": [2, 5, 3]}, ["y"], inits), kernel_cache, "pointwise")


def test_gather_runtime_indices_embedding(kernel_cache) -> None:
    table = np.random.default_rng(1).standard_normal((10, 6)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["e"]),
        helper.make_node("Add", ["e", "pos"], ["y"]),
    ]
    model = make_model(nodes, {"ids": ([2, 4], I64), "pos": [4, 6]}, ["y"], {"table": table})
    feeds = {
        "ids": np.array([[0, 9, -1, 3], [5, 5, 2, -10]], dtype=np.int64),
        "pos": np.ones((4, 6), dtype=np.float32),
    }
    check(model, kernel_cache, "pointwise", feeds=feeds)


def test_expand_where_cast(kernel_cache) -> None:
    nodes = [
        helper.make_node("Expand", ["x", "shape"], ["e"]),
        helper.make_node("Greater", ["e", "z"], ["c"]),
        helper.make_node("Cast", ["c"], ["cf"], to=F),
        helper.make_node("Where", ["c", "e", "cf"], ["y"]),
    ]
    model = make_model(nodes, {"x": [3, 1]}, ["y"], {"shape": i64(2, 3, 4), "z": np.float32(0.0)})
    check(model, kernel_cache, "pointwise")


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect"])
def test_pad(kernel_cache, mode) -> None:
    ins = ["x", "pads", "v"] if mode == "constant" else ["x", "pads"]
    nodes = [helper.make_node("Pad", ins, ["p"], mode=mode), helper.make_node("Sqrt", ["p"], ["y"])]
    inits = {"pads": i64(0, 1, 2, 0, 2, 1)}
    if mode == "constant":
        inits["v"] = np.float32(1.5)
    model = make_model(nodes, {"x": [2, 4, 5]}, ["y"], inits)
    feeds = {"x": np.abs(np.random.default_rng(0).standard_normal((2, 4, 5))).astype(np.float32)}
    check(model, kernel_cache, "pointwise", feeds=feeds)


def test_split_tile_trilu_alone(kernel_cache) -> None:
    nodes = [
        helper.make_node("Split", ["x", "sizes"], ["s0", "s1"], axis=1),
        helper.make_node("Tile", ["s0", "reps"], ["t"]),
        helper.make_node("Trilu", ["s1"], ["u"], upper=0),
    ]
    model = make_model(nodes, {"x": [2, 5, 4]}, ["t", "u"], {"sizes": i64(2, 3), "reps": i64(1, 2, 3)})
    compiled = check(model, kernel_cache)
    assert compiled.stats["kernels"] == 3


def test_reshape_between_ops_inside_kernel(kernel_cache) -> None:
    nodes = [
        helper.make_node("Add", ["x", "x"], ["a"]),
        helper.make_node("Reshape", ["a", "shape"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3]),
        helper.make_node("Mul", ["t", "t"], ["y"]),
    ]
    model = make_model(nodes, {"x": [2, 6, 8]}, ["y"], {"shape": i64(2, 6, 2, 4)})
    check(model, kernel_cache, "pointwise")


def test_large_kernel_is_parallel_and_small_is_not() -> None:
    for shape, parallel in (([4, 8], False), ([64, 1024], True)):
        model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": shape}, ["y"])
        spec = next(iter(extract(model).specs.values()))
        source = emit_pointwise(spec)
        assert ("omp parallel" in source) is parallel
        assert "* ops: Relu" in source  # the comment atop the kernel names its ops


def test_broadcast_only_kernels_coalesce_dims(kernel_cache) -> None:
    nodes = [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    model = make_model(nodes, {"x": [2, 8, 7, 7]}, ["y"], {"b": np.ones((8, 1, 1), np.float32)})
    fused = check(model, kernel_cache, "pointwise")
    source = emit_pointwise(next(iter(extract(fused.model).specs.values())))
    assert "< 49; ++i2" in source  # (2, 8, 7, 7) + (8, 1, 1) runs as (2, 8, 49) + (8, 1)


def test_outputs_of_several_shapes_each_get_their_own_nest(kernel_cache) -> None:
    """A qkv split: one output keeps a leading axis, two lose it (different loop nests), and one
    of those is scaled. Values resolved for one nest must never leak into the next."""
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[2, 0, 3, 1, 4]),
        helper.make_node("Split", ["t", "sizes"], ["q", "k", "v"], axis=0),
        helper.make_node("Squeeze", ["q", "zero"], ["q2"]),
        helper.make_node("Squeeze", ["k", "zero"], ["k2"]),
        helper.make_node("Mul", ["q2", "scale"], ["qs"]),
    ]
    inits = {"shape": i64(1, 5, 3, 2, 16), "sizes": i64(1, 1, 1), "zero": i64(0), "scale": np.float32(0.25)}
    model = make_model(nodes, {"x": [1, 5, 96]}, ["v", "k2", "qs"], inits)
    check(model, kernel_cache, "pointwise")


def test_broadcast_across_a_size_one_dim_is_not_coalesced_away(kernel_cache) -> None:
    """(2, 6) + (3, 1, 2, 6): the size-1 dim must not let the broadcast batch dim merge with the
    full ones (it did: the kernel read b[i] for i < 36 out of a 12-element array)."""
    nodes = [helper.make_node("Add", ["b", "x"], ["y"])]
    b = np.arange(12, dtype=np.float32).reshape(2, 6)
    compiled = check(make_model(nodes, {"x": [3, 1, 2, 6]}, ["y"], {"b": b}), kernel_cache)
    compiled.poison(0)  # the old read past b would now give NaN
    x = np.ones((3, 1, 2, 6), np.float32)
    np.testing.assert_array_equal(compiled({"x": x})["y"], x + b)


@pytest.mark.parametrize("fmod", [0, 1])
def test_integer_mod_follows_fmod(kernel_cache, fmod) -> None:
    """fmod=1 on integers is C's truncating remainder (sign of the dividend), fmod=0 Python's."""
    a = np.array([-4, 7, 5, 4, -7, 8, -9], dtype=np.int64)
    d = np.array([2, -3, 8, -2, 3, 5, 4], dtype=np.int64)
    nodes = [helper.make_node("Mod", ["a", "d"], ["y"], fmod=fmod)]
    model = make_model(nodes, {"a": ([7], I64), "d": ([7], I64)}, ["y"])
    compiled = check(model, kernel_cache, feeds={"a": a, "d": d})
    want = np.fmod(a, d) if fmod else np.mod(a, d)
    np.testing.assert_array_equal(compiled({"a": a, "d": d})["y"], want)


def test_pad_value_given_as_a_one_element_tensor(kernel_cache) -> None:
    """Attention's expansion passes Pad's constant_value as float[1], not a scalar, computed at
    run time (a kernel parameter, not a folded constant)."""
    nodes = [helper.make_node("Pad", ["x", "p", "v"], ["y"])]
    check(
        make_model(nodes, {"x": [2, 3], "v": [1]}, ["y"], {"p": i64(0, 1, 0, 2)}), kernel_cache, "pointwise"
    )


def test_a_group_of_views_alone_compiles_as_a_copy(kernel_cache) -> None:
    """The planner may hand over a group of views only (template `view`): it is a copy in the new
    shape, compiled like a pointwise kernel, never a host op."""
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Squeeze", ["r", "axes"], ["y"]),
    ]
    model = make_model(nodes, {"x": [2, 3, 4]}, ["y"], {"shape": i64(1, 6, 4), "axes": i64(0)})
    compiled = check(model, kernel_cache, "view")
    assert compiled.stats["kernels"] == 1
