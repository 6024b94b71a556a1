"""Lowering Conv and ConvTranspose anchors to kernel IR (lower/conv.py): each method's tile loop,
its contraction calls through the one choice point (OpenBLAS, or the library on a weight packed
once at load), and the rendered kernels computing what onnxruntime computes, in both contraction
modes."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from lowered_kernels import calls, run
from onnx import helper, numpy_helper

from graph_autofusion.backend.cpu.contraction import CONTRACTION_ENV
from graph_autofusion.backend.cpu.kernel_spec import KernelSpec, TensorInfo
from graph_autofusion.backend.cpu.render_c import render_kernel
from graph_autofusion.kernel_ir import Loop
from graph_autofusion.lower.anchor import CONTRACTION_ROUTINE, PACKED_A_ROUTINE, PACKED_B_ROUTINE, method_of
from graph_autofusion.lower.conv import lower_conv

F = onnx.TensorProto.FLOAT
MODES = ("library", "blas")
IM2COL, GEMM1X1, DEPTHWISE = "conv_im2col_tiled", "conv1x1_gemm", "conv_depthwise"


def _model(
    x_shape, w_shape, *, bias: bool, relu: bool, op: str = "Conv", **attrs
) -> tuple[onnx.ModelProto, dict]:
    rng = np.random.default_rng(7)
    w = rng.standard_normal(w_shape).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w")]
    ins = ["x", "w"]
    if bias:
        cout = w_shape[1] * int(attrs.get("group", 1)) if op == "ConvTranspose" else w_shape[0]
        inits.append(numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), "b"))
        ins.append("b")
    nodes = [helper.make_node(op, ins, ["y"], **attrs)]
    out = "y"
    if relu:
        nodes.append(helper.make_node("Relu", ["y"], ["o"]))
        out = "o"
    graph = helper.make_graph(
        nodes,
        "conv",
        [helper.make_tensor_value_info("x", F, list(x_shape))],
        [helper.make_tensor_value_info(out, F, None)],
        inits,
    )
    model = onnx.shape_inference.infer_shapes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    )
    feeds = {"x": rng.standard_normal(x_shape).astype(np.float32)}
    return model, feeds


def _spec(model: onnx.ModelProto) -> tuple[KernelSpec, list[np.ndarray]]:
    g = model.graph
    infos: dict[str, TensorInfo] = {}
    for vi in (*g.input, *g.value_info, *g.output):
        dims = tuple(int(d.dim_value) for d in vi.type.tensor_type.shape.dim)
        infos[vi.name] = TensorInfo(vi.name, dims, F)
    inits = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    for name, value in inits.items():
        infos[name] = TensorInfo(name, value.shape, F)
    spec = KernelSpec(
        symbol="conv_k",
        template="anchor",
        nodes=tuple(g.node),
        inputs=(infos["x"], *(infos[n] for n in inits)),
        outputs=tuple(infos[o.name] for o in g.output),
        tensors=infos,
        weights=frozenset(inits),
    )
    return spec, list(inits.values())


CASES = {
    "3x3_s1_p1": ((2, 8, 11, 11), (12, 8, 3, 3), {"pads": [1, 1, 1, 1]}, IM2COL),
    "3x3_s2_asym": ((1, 6, 13, 10), (10, 6, 3, 3), {"strides": [2, 2], "pads": [0, 1, 2, 1]}, IM2COL),
    "same_upper_s2": ((1, 4, 9, 8), (8, 4, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}, IM2COL),
    "same_lower_k4": ((1, 4, 9, 8), (8, 4, 4, 4), {"auto_pad": "SAME_LOWER"}, IM2COL),
    "valid_k5": ((1, 3, 12, 12), (5, 3, 5, 5), {"auto_pad": "VALID"}, IM2COL),
    "dilated": ((1, 4, 15, 15), (6, 4, 3, 3), {"dilations": [2, 3], "pads": [2, 3, 2, 3]}, IM2COL),
    "stem_7x7_s2": ((1, 3, 64, 64), (16, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}, IM2COL),
    "grouped": ((2, 8, 9, 9), (12, 4, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}, IM2COL),
    "channel_multiplier": ((1, 4, 8, 8), (8, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}, IM2COL),
    "1x1": ((2, 24, 10, 10), (40, 24, 1, 1), {}, GEMM1X1),
    "1x1_grouped": ((1, 16, 7, 7), (16, 4, 1, 1), {"group": 4}, GEMM1X1),
    "1x1_s2": ((1, 16, 14, 14), (32, 16, 1, 1), {"strides": [2, 2]}, IM2COL),
    "depthwise_3x3": ((2, 16, 14, 14), (16, 1, 3, 3), {"group": 16, "pads": [1, 1, 1, 1]}, DEPTHWISE),
    "depthwise_s2_asym": (
        (1, 8, 15, 12), (8, 1, 3, 3), {"group": 8, "strides": [2, 2], "pads": [1, 0, 0, 1]}, DEPTHWISE
    ),
    "depthwise_9x9_looped": ((1, 4, 12, 12), (4, 1, 9, 9), {"group": 4, "pads": [4, 4, 4, 4]}, DEPTHWISE),
    "conv1d": ((2, 6, 30), (8, 6, 3), {"strides": [2], "pads": [1, 2]}, IM2COL),
    "conv3d": ((1, 3, 6, 7, 8), (5, 3, 3, 3, 3), {"pads": [1, 0, 1, 1, 2, 1]}, IM2COL),
    "big_parallel": ((1, 32, 40, 40), (64, 32, 3, 3), {"pads": [1, 1, 1, 1]}, IM2COL),
}  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_conv_matches_onnxruntime(
    name: str, mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CONTRACTION_ENV, mode)
    x_shape, w_shape, attrs, method = CASES[name]
    model, feeds = _model(x_shape, w_shape, bias=True, relu=True, **attrs)
    spec, weights = _spec(model)
    kernel = lower_conv(spec)
    assert method_of(kernel) == method
    routines = {c.function for c in calls(kernel.body)}
    if method == "conv_depthwise":
        assert not routines and not kernel.packed  # a direct loop, no contraction
    elif mode == "library":
        # pixels as rows (B-panels of W^T) for one group of fewer than 64 pixels, not 32 (up to
        # 256 when im2col builds the operand)
        pixels = math.prod(spec.tensors[spec.nodes[0].output[0]].shape[2:])
        few = pixels < 64 or (pixels <= 256 and method == IM2COL)
        rows = attrs.get("group", 1) == 1 and pixels % 32 and few
        assert routines == {PACKED_B_ROUTINE if rows else PACKED_A_ROUTINE} and len(kernel.packed) == 1
    else:
        assert routines == {CONTRACTION_ROUTINE} and not kernel.packed
    (got,) = run(kernel, [feeds["x"], *weights], tmp_path)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    (want,) = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    k = math.prod(w_shape[1:])
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=2e-5 * math.sqrt(k) * 8)


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs", "rows"),
    [
        ((2, 32, 7, 7), (40, 32, 3, 3), {"pads": [1, 1, 1, 1]}, True),  # 49 pixels, channel tiles 32 + 8
        ((1, 48, 7, 7), (80, 48, 1, 1), {}, True),  # 1x1 on the activation read transposed
        ((1, 16, 8, 8), (24, 16, 3, 3), {"pads": [1, 1, 1, 1]}, False),  # 64 pixels: whole panels
        # 196 pixels: two pixel tiles (104 + 92 rows), channel tiles 32 + 8 inside each task
        ((1, 16, 14, 14), (40, 16, 3, 3), {"pads": [1, 1, 1, 1]}, True),
        ((2, 16, 14, 14), (40, 16, 3, 3), {"pads": [1, 1, 1, 1]}, True),
        ((1, 16, 14, 14), (40, 16, 1, 1), {}, False),  # 1x1 of 196 pixels: pixels as columns
    ],
)
def test_narrow_convs_put_the_pixels_in_the_rows(
    x_shape, w_shape, attrs, rows: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CONTRACTION_ENV, "library")
    model, feeds = _model(x_shape, w_shape, bias=True, relu=True, **attrs)
    spec, weights = _spec(model)
    kernel = lower_conv(spec)
    assert {c.function for c in calls(kernel.body)} == {PACKED_B_ROUTINE if rows else PACKED_A_ROUTINE}
    (task,) = [s for s in kernel.body if isinstance(s, Loop)]
    assert ("tile" in [b.name for b in task.scratch]) == rows  # the transposed product's workspace
    (got,) = run(kernel, [feeds["x"], *weights], tmp_path)
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-3)


def test_raw_conv_output_stores_the_product_without_an_epilogue(tmp_path: Path) -> None:
    model, feeds = _model((1, 8, 10, 10), (8, 8, 3, 3), bias=False, relu=False, pads=[1, 1, 1, 1])
    spec, weights = _spec(model)
    kernel = lower_conv(spec)
    assert not any(isinstance(s, Loop) and s.var.name == "r" for s in _walk(kernel.body))
    (got,) = run(kernel, [feeds["x"], *weights], tmp_path)
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-3)


def test_im2col_uses_a_workspace_slice_not_an_allocation() -> None:
    model, _ = _model((1, 8, 20, 20), (16, 8, 3, 3), bias=True, relu=True, pads=[1, 1, 1, 1])
    spec, _ = _spec(model)
    kernel = lower_conv(spec)
    (task,) = [s for s in kernel.body if isinstance(s, Loop)]
    assert [b.name for b in task.scratch] == ["col"]
    assert "malloc" not in render_kernel(kernel)


TRANSPOSE_CASES = {
    "s2_output_padding": (
        (1, 8, 5, 5), (8, 6, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}
    ),
    "asym_pads_dilated": (
        (2, 4, 6, 5), (4, 3, 3, 2), {"strides": [1, 2], "pads": [0, 1, 2, 0], "dilations": [2, 1]}
    ),
    "grouped": ((1, 6, 4, 4), (6, 2, 3, 3), {"group": 3, "strides": [2, 2]}),
    "same_upper": ((1, 4, 5, 6), (4, 5, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    "conv1d": ((1, 4, 9), (4, 3, 4), {"strides": [3], "pads": [1, 1]}),
}  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(TRANSPOSE_CASES))
def test_conv_transpose_matches_onnxruntime(
    name: str, mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CONTRACTION_ENV, mode)
    x_shape, w_shape, attrs = TRANSPOSE_CASES[name]
    model, feeds = _model(x_shape, w_shape, bias=True, relu=True, op="ConvTranspose", **attrs)
    spec, weights = _spec(model)
    kernel = lower_conv(spec)
    assert method_of(kernel) == "conv_transpose_col2im"
    # W_g is read transposed in place: OpenBLAS in both modes, the column buffer a workspace slice
    assert {c.function for c in calls(kernel.body)} == {CONTRACTION_ROUTINE} and not kernel.packed
    (task,) = [s for s in kernel.body if isinstance(s, Loop)]
    assert [b.name for b in task.scratch] == ["col"]
    (got,) = run(kernel, [feeds["x"], *weights], tmp_path)
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-3)


def _walk(body):
    for s in body:
        yield s
        if isinstance(s, Loop):
            yield from _walk(s.body)
