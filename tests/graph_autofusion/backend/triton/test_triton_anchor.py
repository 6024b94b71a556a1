"""Triton anchor kernels render the planner's `AnchorMatch`: operand views read in place, the
contraction's batch and vector shapes, Gemm's alpha/beta/transposes, the output tail, conv
geometry from 1-D to 3-D with auto_pad and groups; an anchor they cannot render is a listed host
op with the reason."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

import graph_autofusion as gaf

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:  # type: ignore[no-untyped-def]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, T.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, T.FLOAT, None) for n in outputs],
        [onnx.numpy_helper.from_array(v, k) for k, v in dict(inits).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    return onnx.shape_inference.infer_shapes(model)


def _weights(*shape: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * 0.3).astype(np.float32)


def _runs_as_one_anchor(model: onnx.ModelProto, cache) -> gaf.FusedGraph:  # type: ignore[no-untyped-def]
    fused = gaf.fuse(model)
    compiled = fused.compile(target="cuda", cache_dir=cache)
    assert compiled.stats["host_ops"] == [], compiled.stats["host_ops"]
    templates = [k["template"] for k in compiled.stats["per_kernel"]]
    assert "anchor" in templates, templates
    result = fused.verify(target="cuda")
    assert result.passed, [o.to_dict() for o in result.outputs]
    return fused


def test_transposed_operand(triton_cache) -> None:  # type: ignore[no-untyped-def]
    nodes = [
        helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["xt", "w"], ["m"]),
        helper.make_node("Relu", ["m"], ["y"]),
    ]
    _runs_as_one_anchor(_model(nodes, {"x": [2, 6, 5]}, ["y"], {"w": _weights(6, 8)}), triton_cache)


def test_output_tail_is_stored_through_strides(triton_cache) -> None:  # type: ignore[no-untyped-def]
    """[B,H,S,K] x W -> [B,H,S,D] -> Transpose(0,2,1,3) -> [B,S,H*D]: one kernel, no copy."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Add", ["m", "bias"], ["a"]),
        helper.make_node("Transpose", ["a"], ["t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["t", "shape"], ["y"]),
    ]
    inits = {"w": _weights(6, 4), "bias": _weights(4, seed=2), "shape": np.array([2, 5, 12], np.int64)}
    fused = _runs_as_one_anchor(_model(nodes, {"x": [2, 3, 5, 6]}, ["y"], inits), triton_cache)
    compiled = fused.compile(target="cuda", cache_dir=triton_cache)
    assert [k["ops"] for k in compiled.stats["per_kernel"]] == [4]


def test_matmul_of_vectors(triton_cache) -> None:  # type: ignore[no-untyped-def]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Sigmoid", ["m"], ["y"]),
        helper.make_node("MatMul", ["v", "x2"], ["z"]),
    ]
    inputs = {"x": [3, 4, 6], "v": [5], "x2": [2, 5, 7]}
    _runs_as_one_anchor(_model(nodes, inputs, ["y", "z"], {"w": _weights(6)}), triton_cache)


def test_gemm_alpha_beta_and_transposes(triton_cache) -> None:  # type: ignore[no-untyped-def]
    nodes = [
        helper.make_node("Gemm", ["a", "b", "c"], ["g"], alpha=0.5, beta=2.0, transA=1, transB=1),
        helper.make_node("Tanh", ["g"], ["y"]),
    ]
    inits = {"b": _weights(9, 7), "c": _weights(9)}
    _runs_as_one_anchor(_model(nodes, {"a": [7, 5]}, ["y"], inits), triton_cache)


@pytest.mark.parametrize(
    ("x", "w", "attrs"),
    [
        ([1, 3, 11], [4, 3, 3], {"pads": [1, 1], "strides": [2]}),  # 1-D
        ([1, 4, 7, 6], [6, 2, 3, 3], {"group": 2, "auto_pad": "SAME_UPPER"}),  # grouped, auto_pad
        ([1, 2, 4, 5, 5], [3, 2, 2, 3, 3], {"dilations": [1, 2, 1]}),  # 3-D
    ],
)
def test_conv_geometries(x, w, attrs, triton_cache) -> None:  # type: ignore[no-untyped-def]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    inits = {"w": _weights(*w), "b": _weights(w[0], seed=1)}
    _runs_as_one_anchor(_model(nodes, {"x": x}, ["y"], inits), triton_cache)


def test_conv_transpose_is_a_listed_host_op(triton_cache) -> None:  # type: ignore[no-untyped-def]
    nodes = [helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2])]
    fused = gaf.fuse(_model(nodes, {"x": [1, 2, 4, 4]}, ["y"], {"w": _weights(2, 3, 3, 3)}))
    compiled = fused.compile(target="cuda", cache_dir=triton_cache)
    hosts = compiled.stats["host_ops"]
    assert [h["code"] for h in hosts] == ["codegen_unsupported"]
    assert "ConvTranspose anchors are not rendered for the Triton targets" in hosts[0]["reason"]
    assert fused.verify(target="cuda").passed
