"""Pointwise kernels on every element type the kernel IR stores: fp64, fp32, fp16, bf16, signed and
unsigned integers of 8-64 bits, bool.

16-bit floats compute in fp32 and round once per store, so the reference is the fp32 model run
on the widened inputs, rounded to the storage type: the results must match it bit for bit.
Integer and bool kernels must match exactly too.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from cpu_backend_helpers import fuse_all, make_model, ort_run
from onnx import TensorProto as T
from onnx import helper
from onnx.reference import ReferenceEvaluator

from graph_autofusion.backend.cpu.runtime import compile_model

FLOATS = {T.DOUBLE: np.float64, T.FLOAT16: np.float16, T.BFLOAT16: ml_dtypes.bfloat16}
INTS = {
    T.INT8: np.int8, T.INT16: np.int16, T.INT32: np.int32, T.INT64: np.int64,
    T.UINT8: np.uint8, T.UINT16: np.uint16, T.UINT32: np.uint32, T.UINT64: np.uint64,
}  # fmt: skip


def _chain(elem: int) -> onnx.ModelProto:
    nodes = [
        helper.make_node("Add", ["x", "y"], ["a"]),
        helper.make_node("Mul", ["a", "x"], ["m"]),
        helper.make_node("Max", ["m", "y"], ["z"]),
        helper.make_node("Transpose", ["z"], ["t"], perm=[2, 0, 1]),
    ]
    return make_model(nodes, {"x": ([2, 3, 5], elem), "y": ([3, 1], elem)}, ["t"])


def _as(model: onnx.ModelProto, elem: int) -> onnx.ModelProto:
    """The same model declared with another element type."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for vi in [*out.graph.input, *out.graph.output, *out.graph.value_info]:
        vi.type.tensor_type.elem_type = elem
    return out


@pytest.mark.parametrize("elem", list(FLOATS), ids=lambda e: T.DataType.Name(e))
def test_float_types_compute_wide_and_round_once(kernel_cache, elem) -> None:
    np_type = FLOATS[elem]
    rng = np.random.default_rng(1)
    feeds = {"x": (rng.standard_normal((2, 3, 5)) * 4).astype(np_type),
             "y": (rng.standard_normal((3, 1)) * 4).astype(np_type)}  # fmt: skip
    model = _chain(elem)
    compiled = compile_model(fuse_all(model, "pointwise"), cache=kernel_cache)
    assert compiled.stats["host_ops"] == []
    got = compiled(feeds)["t"]
    wide = _as(model, T.FLOAT if elem != T.DOUBLE else T.DOUBLE)
    wide_feeds = {k: v.astype(np.float32 if elem != T.DOUBLE else np.float64) for k, v in feeds.items()}
    want = ReferenceEvaluator(wide).run(None, wide_feeds)[0].astype(np_type)
    assert got.dtype == want.dtype
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()


@pytest.mark.parametrize("elem", list(INTS), ids=lambda e: T.DataType.Name(e))
def test_integer_types_are_exact(kernel_cache, elem) -> None:
    np_type = INTS[elem]
    rng = np.random.default_rng(2)
    feeds = {
        "x": rng.integers(0, 12, (2, 3, 5)).astype(np_type),
        "y": rng.integers(0, 12, (3, 1)).astype(np_type),
    }
    model = _chain(elem)
    compiled = compile_model(fuse_all(model, "pointwise"), cache=kernel_cache)
    assert compiled.stats["host_ops"] == []
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    np.testing.assert_array_equal(compiled(feeds)["t"], want)


def test_bool_logic_and_where(kernel_cache) -> None:
    nodes = [
        helper.make_node("Greater", ["x", "y"], ["g"]),
        helper.make_node("Not", ["g"], ["n"]),
        helper.make_node("Xor", ["n", "b"], ["q"]),
        helper.make_node("Where", ["q", "x", "y"], ["w"]),
    ]
    model = make_model(nodes, {"x": [4, 6], "y": [4, 6], "b": ([6], T.BOOL)}, ["q", "w"])
    rng = np.random.default_rng(3)
    x, y = (rng.standard_normal((4, 6)).astype(np.float32) for _ in range(2))
    feeds = {"x": x, "y": y, "b": rng.integers(0, 2, 6).astype(bool)}
    compiled = compile_model(fuse_all(model, "pointwise"), cache=kernel_cache)
    got, want = compiled(feeds), ort_run(model, feeds)
    np.testing.assert_array_equal(got["q"], want["q"])
    np.testing.assert_array_equal(got["w"], want["w"])


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("elem", [T.INT32, T.INT64])
def test_integer_mod_follows_fmod(kernel_cache, fmod, elem) -> None:
    """fmod=1 truncates (the dividend's sign), fmod=0 floors (the divisor's sign)."""
    model = make_model(
        [helper.make_node("Mod", ["a", "b"], ["r"], fmod=fmod)], {"a": ([12], elem), "b": ([12], elem)}, ["r"]
    )
    np_type = INTS[elem]
    feeds = {"a": np.array([7, -7, 7, -7, 0, 5, -5, 9, -9, 13, -13, 1], np_type),
             "b": np.array([3, 3, -3, -3, 4, 5, 5, -4, 4, 6, -6, 1], np_type)}  # fmt: skip
    compiled = compile_model(fuse_all(model, "pointwise"), cache=kernel_cache)
    np.testing.assert_array_equal(compiled(feeds)["r"], ort_run(model, feeds)["r"])


@pytest.mark.parametrize("elem", [T.FLOAT16, T.BFLOAT16], ids=lambda e: T.DataType.Name(e))
def test_16_bit_row_reductions_accumulate_wide(kernel_cache, elem) -> None:
    """Sums run in fp32 blocks and a double total, then round once: within one unit in the last
    place of the fp32 result rounded to 16 bits."""
    nodes = [
        helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=0),
        helper.make_node("Softmax", ["x"], ["p"], axis=-1),
    ]
    model = make_model(nodes, {"x": ([4, 64], elem)}, ["s", "p"], {"axes": np.array([1], np.int64)})
    np_type = FLOATS[elem]
    x = np.random.default_rng(4).standard_normal((4, 64)).astype(np_type)
    compiled = compile_model(fuse_all(model, "reduction"), cache=kernel_cache)
    assert compiled.stats["host_ops"] == []
    got = compiled({"x": x})
    wide = x.astype(np.float64)
    e = np.exp(wide - wide.max(1, keepdims=True))
    ulp = 2.0**-10 if elem == T.FLOAT16 else 2.0**-7
    for name, want in (("s", wide.sum(1)), ("p", e / e.sum(1, keepdims=True))):
        err = np.abs(got[name].astype(np.float64) - want)
        assert (err <= ulp * np.abs(want) + 1e-7).all(), (name, err.max())


def test_16_bit_anchors_run_on_the_host_with_their_reason(kernel_cache) -> None:
    """Contractions are not lowered through the IR yet: fp16 there is a listed host op, never
    arithmetic on raw bits."""
    model = make_model(
        [helper.make_node("MatMul", ["a", "b"], ["c"])],
        {"a": ([4, 8], T.FLOAT16), "b": ([8, 3], T.FLOAT16)},
        ["c"],
    )
    compiled = compile_model(model, cache=kernel_cache)
    (host,) = compiled.stats["host_ops"]
    assert "FLOAT16" in host["reason"]
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((4, 8)).astype(np.float16), rng.standard_normal((8, 3)).astype(np.float16)
    np.testing.assert_allclose(
        compiled({"a": a, "b": b})["c"].astype(np.float32),
        a.astype(np.float32) @ b.astype(np.float32),
        rtol=5e-3,
        atol=5e-3,
    )
