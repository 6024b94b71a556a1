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
from graph_autofusion.kernel_ir import Kernel, Loop
from graph_autofusion.lower import conv as conv_module
from graph_autofusion.lower.anchor import (
    BEGIN_CALL_ROUTINE,
    CONTRACTION_ROUTINE,
    DEPTHWISE_3X3_ROUTINE,
    DEPTHWISE_3X3_S2_ROUTINE,
    DIRECT_CONV_ROUTINE,
    DIRECT_ROWS_CONV_ROUTINE,
    PACKED_A_INPUT_ROUTINE,
    PACKED_A_POST_ROUTINE,
    PACKED_A_ROUTINE,
    PACKED_B_INPUT_ROUTINE,
    PACKED_B_ROUTINE,
    PARALLEL_MIN_MACS,
    STORE_T_POST_ROUTINE,
    STORE_T_ROUTINE,
    WINOGRAD_ROUTINE,
    method_of,
)
from graph_autofusion.lower.conv import (
    EPILOGUE_CHUNK_ROWS,
    ROBUST_TASKS,
    ConvGeometry,
    _makespan,
    conv_geometry,
    conv_tiles,
    depthwise_in_library,
    direct_tiles,
    lower_conv,
)

F = onnx.TensorProto.FLOAT
MODES = ("library", "blas")
IM2COL, GEMM1X1, DEPTHWISE = "conv_im2col_tiled", "conv1x1_gemm", "conv_depthwise"
DIRECT = "conv_direct"  # with the library; OpenBLAS has no band to read, so im2col there
# im2col with OpenBLAS; with the library, pixels as rows in tiles of whole output rows whose taps
# afc_conv_bp reads from the band in place (the method is still named im2col)
BAND_ROWS = "band_rows"
# 3x3s of stride 1 with channels in whole vectors, with the library: Winograd F(2x2, 3x3)
WINOGRAD = "conv_winograd"


def _model(
    x_shape, w_shape, *, bias: bool, relu: bool, op: str = "Conv", act: str = "Relu", **attrs
) -> tuple[onnx.ModelProto, dict]:
    """A conv (`op`), with a bias when asked, then `act` (Relu; any unary op) when `relu`."""
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
        nodes.append(helper.make_node(act, ["y"], ["o"]))
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


def _geometry_1x1(cin: int, cout: int, hw: int) -> ConvGeometry:
    """The geometry of a stride-1 1x1 conv of one hw x hw image, as the tiling tests ask for it."""
    return ConvGeometry(n=1, cin=cin, cout=cout, group=1, h=hw, w=hw, oh=hw, ow=hw,
                        kh=1, kw=1, sh=1, sw=1, dh=1, dw=1, pt=0, pl=0)  # fmt: skip


def _assert_matches_onnxruntime(
    kernel: Kernel, weights: list[np.ndarray], model: onnx.ModelProto, feeds: dict, tmp_path: Path
) -> None:
    """The lowered kernel's output against onnxruntime's on the one-node model."""
    (got,) = run(kernel, [feeds["x"], *weights], tmp_path)
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-3)


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
    # many small planes: tasks of several planes each, the last task shorter (67 = 8 x 8 + 3)
    # padded planes past DEPTHWISE_BORDER_FLOATS (only their border zeroed) with rows of at least
    # DEPTHWISE_ROW_EPILOGUE_WIDTH outputs (the epilogue row by row); stride 2, asymmetric pads
    "depthwise_wide_plane": ((1, 3, 70, 66), (3, 1, 3, 3), {"group": 3, "pads": [1, 1, 1, 1]}, DEPTHWISE),
    "depthwise_wide_s2_asym": (
        (1, 2, 101, 120), (2, 1, 3, 3), {"group": 2, "strides": [2, 2], "pads": [1, 0, 0, 1]}, DEPTHWISE
    ),
    "depthwise_many_7x7": ((1, 67, 7, 7), (67, 1, 3, 3), {"group": 67, "pads": [1, 1, 1, 1]}, DEPTHWISE),
    # a stride-2 plane too tall for the library's AVX2 copy: the generated loop
    "depthwise_s2_generated": (
        (1, 2, 300, 40), (2, 1, 3, 3), {"group": 2, "strides": [2, 2], "pads": [1, 1, 1, 1]}, DEPTHWISE
    ),
    "depthwise_many_s2": (
        (1, 50, 14, 14), (50, 1, 3, 3), {"group": 50, "strides": [2, 2], "pads": [1, 1, 1, 1]}, DEPTHWISE
    ),
    # planes at most 8 wide are computed flat over row and column phases
    "depthwise_flat_dilated_s2": (
        (1, 6, 11, 11), (6, 1, 3, 3),
        {"group": 6, "strides": [2, 2], "dilations": [2, 2], "pads": [2, 1, 2, 1]}, DEPTHWISE,
    ),
    "depthwise_flat_9x9_looped": (
        (1, 3, 6, 7), (3, 1, 9, 9), {"group": 3, "pads": [4, 4, 4, 3]}, DEPTHWISE
    ),
    "depthwise_flat_s3_1row": (
        (1, 5, 3, 20), (5, 1, 3, 3), {"group": 5, "strides": [3, 3], "pads": [0, 1, 0, 1]}, DEPTHWISE
    ),
    "depthwise_9x9_looped": ((1, 4, 12, 12), (4, 1, 9, 9), {"group": 4, "pads": [4, 4, 4, 4]}, DEPTHWISE),
    # stride-1 3x3s over rows of up to 32 floats: the library's (afc_dw3x3), with unequal top and
    # bottom pads, the left pad 0 or 2, and planes of a second image
    "depthwise_library_asym": (
        (1, 5, 12, 20), (5, 1, 3, 3), {"group": 5, "pads": [2, 0, 0, 2]}, DEPTHWISE
    ),
    "depthwise_library_left2": ((1, 6, 9, 30), (6, 1, 3, 3), {"group": 6, "pads": [1, 2, 1, 0]}, DEPTHWISE),
    "depthwise_library_7x7_two_images": (
        (2, 40, 7, 7), (40, 1, 3, 3), {"group": 40, "pads": [1, 1, 1, 1]}, DEPTHWISE
    ),
    "conv1d": ((2, 6, 30), (8, 6, 3), {"strides": [2], "pads": [1, 2]}, IM2COL),
    "conv3d": ((1, 3, 6, 7, 8), (5, 3, 3, 3, 3), {"pads": [1, 0, 1, 1, 2, 1]}, IM2COL),
    "big_parallel": ((1, 32, 40, 40), (72, 32, 3, 3), {"pads": [1, 1, 1, 1]}, BAND_ROWS),
    # two images in bands of tile rows, 14-pixel rows; rows of 30 (15 tiles), 96 output channels
    "winograd": ((2, 32, 20, 14), (64, 32, 3, 3), {"pads": [1, 1, 1, 1]}, WINOGRAD),
    "winograd_wide_rows": ((1, 16, 6, 30), (96, 16, 3, 3), {"pads": [1, 1, 1, 1]}, WINOGRAD),
    # the taps read from the input band in place: dilated, asymmetric padding, rows of unequal
    # tiles, 28-pixel rows, one row
    "rows_dilated_asym": (
        (2, 6, 20, 70), (10, 6, 3, 5), {"dilations": [2, 1], "pads": [2, 0, 1, 3]}, BAND_ROWS
    ),
    "rows_valid_k5_few_channels": ((1, 3, 20, 80), (5, 3, 5, 5), {"auto_pad": "VALID"}, BAND_ROWS),
    "3x3_28_rows": ((1, 8, 28, 28), (16, 8, 3, 3), {"pads": [1, 1, 1, 1]}, BAND_ROWS),
    "rows_conv1d": ((1, 8, 300), (40, 8, 5), {"pads": [2, 2]}, BAND_ROWS),
    # stride 2 with enough input channels (ResNet-50's 128-channel 3x3 from 56x56 to 28x28): tiles
    # of at least BAND_MIN_PIXELS, two images, asymmetric padding, a last tile of fewer rows
    "rows_s2": ((1, 16, 40, 40), (24, 16, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, BAND_ROWS),
    "rows_s2_asym": ((2, 16, 31, 45), (12, 16, 3, 3), {"strides": [2, 2], "pads": [0, 1, 2, 1]}, BAND_ROWS),
    # more output channels than afc_conv_bp reads in place for, groups, or strides: the taps are
    # the vector loads of afc_conv_ap, from the band in phase planes where strided (a stem, a
    # dilated stride-2 with asymmetric padding, mixed)
    "direct_grouped": ((1, 8, 16, 32), (12, 4, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}, DIRECT),
    "direct_wide": ((1, 8, 20, 40), (136, 8, 3, 3), {"pads": [1, 1, 1, 1]}, DIRECT),
    "direct_stem_s2": ((1, 3, 100, 100), (16, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}, DIRECT),
    "direct_s2_dilated": (
        (2, 5, 40, 70), (12, 5, 3, 3), {"strides": [2, 2], "pads": [1, 0, 1, 2], "dilations": [2, 1]}, IM2COL
    ),
    "direct_s1x2": ((1, 6, 20, 66), (10, 6, 3, 3), {"strides": [1, 2], "pads": [1, 1, 1, 1]}, DIRECT),
    # one row: the output channels split in two tasks
    "direct_conv1d": ((1, 8, 300), (160, 8, 5), {"pads": [2, 2]}, DIRECT),
}  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_conv_matches_onnxruntime(
    name: str, mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CONTRACTION_ENV, mode)
    x_shape, w_shape, attrs, method = CASES[name]
    if method in (DIRECT, WINOGRAD) and mode == "blas":
        method = IM2COL
    band_rows = method == BAND_ROWS
    method = IM2COL if band_rows else method
    model, feeds = _model(x_shape, w_shape, bias=True, relu=True, **attrs)
    spec, weights = _spec(model)
    kernel = lower_conv(spec)
    assert method_of(kernel) == method
    routines = {c.function for c in calls(kernel.body)}
    if method == "conv_depthwise":
        # a direct loop, no contraction, or the library's flat planes
        g = conv_geometry(spec.nodes[0], _Shapes(spec))
        routine = DEPTHWISE_3X3_ROUTINE if g.sh == 1 else DEPTHWISE_3X3_S2_ROUTINE
        assert routines == ({routine} if depthwise_in_library(g) else set()) and not kernel.packed
    elif method == DIRECT:
        assert routines == {DIRECT_CONV_ROUTINE} and len(kernel.packed) == 1
    elif method == WINOGRAD:
        assert routines == {WINOGRAD_ROUTINE} and len(kernel.packed) == 1
    elif mode == "library":
        # pixels as rows (B-panels of W^T) for one group of fewer than 64 pixels, not 32 (up to
        # 256 when im2col builds the operand or the conv is a 1x1)
        pixels = math.prod(spec.tensors[spec.nodes[0].output[0]].shape[2:])
        few = pixels < 64 or (pixels <= 256 and method in (IM2COL, GEMM1X1))
        rows = band_rows or (attrs.get("group", 1) == 1 and pixels % 32 and few)
        # (with the pixels as rows over a padded band, the library gathers from the band itself;
        # the product's tile is then stored transposed, the bias and Relu applied on the way)
        expected = [
            {PACKED_B_ROUTINE, STORE_T_POST_ROUTINE},
            {DIRECT_ROWS_CONV_ROUTINE, STORE_T_POST_ROUTINE},
        ]
        if band_rows:
            expected = expected[1:]
        elif not rows:  # channels as rows: the library finishes each tile with bias and Relu
            expected = [{PACKED_A_POST_ROUTINE}]
        assert routines in expected and len(kernel.packed) == 1
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


def test_odd_task_counts_take_the_tile_the_threads_finish_soonest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ResNet-50's 512 -> 128 1x1 conv at 28x28: 784 pixels in whole 32-wide panels, where 160-pixel
    # tiles make 5 tasks (one thread runs three) and six tiles round back up to five (the balance as
    # such: with ROBUST_TASKS the conv takes 7 tiles of 128, `test_few_tasks_split_...` below)
    monkeypatch.setattr(conv_module, "ROBUST_TASKS", 1)
    g = _geometry_1x1(512, 128, 28)
    assert conv_tiles(g, 32) == (192, 5, 128, 1)  # 4 x 192 + 16: two and a half tiles a thread
    assert _makespan(784, 192, 1, 32) < _makespan(784, 160, 1, 32)
    monkeypatch.setenv(CONTRACTION_ENV, "library")
    model, feeds = _model((1, 512, 28, 28), (128, 512, 1, 1), bias=True, relu=True)
    spec, weights = _spec(model)
    _assert_matches_onnxruntime(lower_conv(spec), weights, model, feeds, tmp_path)


def _library_conv_is_described(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, x_shape: tuple, w_shape: tuple, described: str
) -> None:
    """A conv with bias and Relu, lowered for the contraction library: its description names
    `described` (the tiles), and its kernel matches onnxruntime."""
    monkeypatch.setenv(CONTRACTION_ENV, "library")
    model, feeds = _model(x_shape, w_shape, bias=True, relu=True)
    spec, weights = _spec(model)
    kernel = lower_conv(spec)
    assert described in kernel.description
    _assert_matches_onnxruntime(kernel, weights, model, feeds, tmp_path)


def test_few_tasks_split_into_narrower_pixel_tiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # MobileNetV2's 96 -> 24 and ResNet-50's 64 -> 64 1x1s at 56x56 took 4 tiles of 800 pixels (the
    # widest whose output fits OUT_TILE_FLOATS): one slowed thread then held up a quarter of the
    # conv. At least ROBUST_TASKS tasks where tiles of MIN_PIXEL_TILE allow it:
    assert ROBUST_TASKS == 8
    assert conv_tiles(_geometry_1x1(96, 24, 56), 32) == (384, 9, 24, 1)
    assert conv_tiles(_geometry_1x1(144, 24, 56), 32) == (384, 9, 24, 1)  # was 7 of 512
    # OpenBLAS packs the weight per call, so its tiles stay as wide as they were
    assert conv_tiles(_geometry_1x1(96, 24, 56), 16) == (784, 4, 24, 1)
    # narrower tiles that would not make more tasks leave the split as it was (132 channels of 256
    # pixels: 4 channel tiles; 2 pixel tiles of 128 x 2 channel tiles would be 4 as well)
    assert conv_tiles(_geometry_1x1(64, 132, 16), 32) == (256, 1, 40, 4)
    _library_conv_is_described(
        monkeypatch, tmp_path, (1, 64, 56, 56), (64, 64, 1, 1), "9 pixel tiles of 384 x 1 channel tiles of 64"
    )


@pytest.mark.parametrize("mode", MODES)
def test_split_channel_tiles_are_whole_a_panels(
    mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 132 channels of one 256-pixel tile in four tiles (tasks for the threads): 40 x 3 + 12, not
    # 33 x 4, each computed as whole panels of 8 rows
    g = _geometry_1x1(64, 132, 16)
    assert conv_tiles(g, 32) == (256, 1, 40, 4)
    monkeypatch.setenv(CONTRACTION_ENV, mode)
    model, feeds = _model((1, 64, 16, 16), (132, 64, 1, 1), bias=True, relu=True)
    spec, weights = _spec(model)
    kernel = lower_conv(spec)
    assert "4 channel tiles of 40" in kernel.description
    _assert_matches_onnxruntime(kernel, weights, model, feeds, tmp_path)


@pytest.mark.parametrize("mode", MODES)
def test_packed_1x1_splits_pixels_so_all_channels_share_one_packed_activation(
    mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ResNet-50's 64 -> 256 1x1 at 56x56 ran 4 pixel tiles of 800 x 4 channel tiles of 64, the
    # library packing each pixel tile's activation four times; now 14 tiles of 224 x 256 channels
    g = _geometry_1x1(64, 256, 56)
    assert conv_tiles(g, 32) == (224, 14, 256, 1)
    assert conv_tiles(g, 16) == (784, 4, 64, 4)  # OpenBLAS packs the weight per call: unchanged
    # 256 -> 1024 at 14x14 would still need two channel tiles at the narrowest pixel tile: unchanged
    g = _geometry_1x1(256, 1024, 14)
    assert conv_tiles(g, 32) == (196, 1, 256, 4)
    monkeypatch.setenv(CONTRACTION_ENV, mode)
    model, feeds = _model((1, 24, 40, 40), (136, 24, 1, 1), bias=True, relu=True)
    spec, weights = _spec(model)
    kernel = lower_conv(spec)
    # 1600 pixels x 136 channels: at most 480 pixels a tile (481 fit OUT_TILE_FLOATS), 4 equal
    # tiles of whole panels, then at least ROBUST_TASKS tasks: 10 tiles of 160 (5 a thread); it was
    # one 1600-pixel tile x 4 channel tiles of 40, as OpenBLAS has it
    tiles = "10 pixel tiles of 160 x 1 channel tiles of 136" if mode == "library" else "4 channel tiles of 40"
    assert tiles in kernel.description
    _assert_matches_onnxruntime(kernel, weights, model, feeds, tmp_path)


@pytest.mark.parametrize("mode", MODES)
def test_pixels_split_before_channel_tiles_thinner_than_32(
    mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 384 -> 64 1x1 at 16x16 would run 4 channel tiles of 16, each packing all 256 pixels
    g = _geometry_1x1(384, 64, 16)
    assert conv_tiles(g, 32) == (128, 2, 32, 2)
    # its 192 -> 32 at 28x28: 2 pixel tiles of 416 x 2 channel tiles of 16 (and 7 tiles of 128
    # rather than 4 of 224 for ROBUST_TASKS)
    g = _geometry_1x1(192, 32, 28)
    assert conv_tiles(g, 32) == (128, 7, 32, 1)
    monkeypatch.setenv(CONTRACTION_ENV, mode)
    model, feeds = _model((1, 64, 16, 16), (64, 64, 1, 1), bias=True, relu=True)
    spec, weights = _spec(model)
    kernel = lower_conv(spec)
    tiles = "2 pixel tiles of 128 x 2 channel tiles of 32" if mode == "library" else "pixel tiles of 128"
    assert tiles in kernel.description
    _assert_matches_onnxruntime(kernel, weights, model, feeds, tmp_path)


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs", "padded"),
    [
        ((1, 16, 7, 7), (24, 16, 3, 3), {"pads": [1, 1, 1, 1]}, True),  # ResNet-50's last stage, small
        # pixel tiles that start mid-row, asymmetric padding, dilation
        ((1, 32, 41, 37), (48, 32, 3, 3), {"pads": [2, 0, 1, 3], "dilations": [1, 2]}, True),
        # stride 2: each input feeds about 2 im2col floats, too few to repay the band copy
        ((1, 16, 28, 28), (24, 16, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, False),
        ((1, 3, 40, 40), (8, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}, True),  # a stem
        ((1, 16, 14, 14), (32, 16, 1, 1), {"strides": [2, 2]}, False),  # 1x1: nothing to pad
        ((1, 64, 2000), (32, 64, 3), {"pads": [1, 1]}, False),  # band: a whole 2002-float row a tile
    ],
)
@pytest.mark.parametrize("mode", MODES)
def test_narrow_im2col_reads_a_padded_band(
    x_shape, w_shape, attrs, padded: bool, mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CONTRACTION_ENV, mode)
    model, feeds = _model(x_shape, w_shape, bias=False, relu=True, **attrs)
    spec, weights = _spec(model)
    kernel = lower_conv(spec)
    # a stride-1 conv of rows this wide reads the band in place where the library contracts
    # (the 2000-pixel row: a band of 64 x 2002 floats is over DIRECT_BAND_FLOATS, so im2col)
    assert method_of(kernel) == IM2COL
    (task,) = [s for s in kernel.body if isinstance(s, Loop)]
    # 196 pixels as rows (library): the band is the only copy of the activation, so it is built
    gathers = x_shape == (1, 16, 28, 28) and mode == "library"
    assert ("pad" in [b.name for b in task.scratch]) == (padded or gathers)
    _assert_matches_onnxruntime(kernel, weights, model, feeds, tmp_path)


def test_an_even_count_of_unequal_pixel_tiles_is_rebalanced() -> None:
    # ResNet-50's stride-2 downsample 256 -> 512: 784 pixels were 3 x 224 + 112 (4 tasks, 448
    # pixels on one thread against 336); 4 x 192 + 16 is 400 against 384
    g = ConvGeometry(n=1, cin=256, cout=512, group=1, h=56, w=56, oh=28, ow=28,
                     kh=1, kw=1, sh=2, sw=2, dh=1, dw=1, pt=0, pl=0)  # fmt: skip
    assert conv_tiles(g, 32) == (192, 5, 256, 2)


def test_pixel_tiles_as_rows_split_in_half_panels() -> None:
    # ResNet-50's 3x3 at 14x14: 196 pixels in two tiles of 100 + 96 rows (12.5 and 12 panels of
    # 8; the micro-kernel runs a half panel at half the cost), one per thread, not 104 + 92
    g = ConvGeometry(n=1, cin=256, cout=256, group=1, h=14, w=14, oh=14, ow=14,
                     kh=3, kw=3, sh=1, sw=1, dh=1, dw=1, pt=1, pl=1)  # fmt: skip
    assert conv_tiles(g, 32, rows=True) == (100, 2, 256, 1)


def test_a_pixel_tile_per_thread_keeps_its_channels_in_one_tile() -> None:
    # 14x14 1x1s with the pixels as rows: two pixel tiles (100 + 96), one per thread; up to
    # ROWS_WHOLE_CHANNELS output channels stay one tile, so each tile's activation is packed once
    # (MobileNetV2's projections, ResNet-50's 1024 -> 256); wider expansions (K of 64 or 96,
    # cheap to pack again) keep splitting their channels
    assert conv_tiles(_geometry_1x1(576, 96, 14), 32, rows=True) == (100, 2, 96, 1)
    assert conv_tiles(_geometry_1x1(384, 64, 14), 32, rows=True) == (100, 2, 64, 1)
    assert conv_tiles(_geometry_1x1(1024, 256, 14), 32, rows=True) == (100, 2, 256, 1)
    assert conv_tiles(_geometry_1x1(96, 576, 14), 32, rows=True) == (100, 2, 288, 2)


def test_channel_tiles_of_one_pixel_tile_as_rows_are_balanced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # MobileNetV2's 960 -> 160 1x1 at 7x7: 49 pixels (one tile of rows), the channels the only
    # split; whole panels were tiles of 64 + 64 + 32, one thread computing 96 channels. Two tiles
    # of 80 (two and a half panels) give each thread half; 320 channels two of 160 (were 96 x 3 +
    # 32); channels that split evenly keep their tiles
    assert conv_tiles(_geometry_1x1(960, 160, 7), 32, rows=True) == (49, 1, 80, 2)
    assert conv_tiles(_geometry_1x1(960, 320, 7), 32, rows=True) == (49, 1, 160, 2)
    assert conv_tiles(_geometry_1x1(320, 1280, 7), 32, rows=True) == (49, 1, 320, 4)
    _library_conv_is_described(
        monkeypatch, tmp_path, (1, 960, 7, 7), (160, 960, 1, 1), "1 pixel tiles of 49 x 2 channel tiles of 80"
    )


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs", "rows"),
    [
        ((2, 32, 7, 7), (40, 32, 3, 3), {"pads": [1, 1, 1, 1]}, True),  # 49 pixels, channel tiles 32 + 8
        ((1, 48, 7, 7), (80, 48, 1, 1), {}, True),  # 1x1 on the activation read transposed
        ((1, 16, 8, 8), (24, 16, 3, 3), {"pads": [1, 1, 1, 1]}, False),  # 64 pixels: whole panels
        # 196 pixels: two pixel tiles (100 + 96 rows), channel tiles 32 + 8 inside each task
        ((1, 16, 14, 14), (40, 16, 3, 3), {"pads": [1, 1, 1, 1]}, True),
        ((2, 16, 14, 14), (40, 16, 3, 3), {"pads": [1, 1, 1, 1]}, True),
        ((1, 16, 14, 14), (40, 16, 1, 1), {}, True),  # 1x1 of 196 pixels: 25 row panels, not 7 x 32
        ((1, 16, 16, 16), (40, 16, 1, 1), {}, False),  # 1x1 of 256 pixels: whole column panels
    ],
)
def test_narrow_convs_put_the_pixels_in_the_rows(
    x_shape, w_shape, attrs, rows: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CONTRACTION_ENV, "library")
    model, feeds = _model(x_shape, w_shape, bias=True, relu=True, **attrs)
    spec, weights = _spec(model)
    kernel = lower_conv(spec)
    # 3x3s read their rows from the padded band (afc_conv_bp), a 1x1 from the activation, the
    # library's post-ops finishing each tile of the product
    if rows:
        routines = {
            DIRECT_ROWS_CONV_ROUTINE if w_shape[2:] == (3, 3) else PACKED_B_ROUTINE,
            STORE_T_POST_ROUTINE,
        }
    else:
        routines = {PACKED_A_POST_ROUTINE}
    # the product's tile stored transposed into NCHW, the bias and Relu applied on the way
    assert {c.function for c in calls(kernel.body)} == routines
    (task,) = [s for s in kernel.body if isinstance(s, Loop)]
    assert ("tile" in [b.name for b in task.scratch]) == rows  # the transposed product's workspace
    _assert_matches_onnxruntime(kernel, weights, model, feeds, tmp_path)


def _residual_model(
    x_shape: tuple, w_shape: tuple, **attrs
) -> tuple[onnx.ModelProto, dict, KernelSpec, list]:
    """Conv(x) + bias + r, then Relu (a ResNet block's tail), r a second input; its spec takes
    (x, r, the weights)."""
    model, feeds = _model(x_shape, w_shape, bias=True, relu=False, **attrs)
    g = model.graph
    out_shape = [d.dim_value for d in g.output[0].type.tensor_type.shape.dim]
    g.node.extend([helper.make_node("Add", ["y", "r"], ["s"]), helper.make_node("Relu", ["s"], ["o"])])
    g.input.append(helper.make_tensor_value_info("r", F, out_shape))
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("o", F, out_shape))
    model = onnx.shape_inference.infer_shapes(model)
    feeds["r"] = np.random.default_rng(3).standard_normal(out_shape).astype(np.float32)
    spec, weights = _spec(model)
    infos = spec.tensors
    spec = KernelSpec(
        symbol=spec.symbol, template=spec.template, nodes=spec.nodes,
        inputs=(infos["x"], infos["r"], *spec.inputs[1:]), outputs=spec.outputs, tensors=infos,
        weights=spec.weights,
    )  # fmt: skip
    return model, feeds, spec, weights


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs"),
    [
        ((1, 16, 14, 14), (40, 16, 3, 3), {"pads": [1, 1, 1, 1]}),  # two pixel tiles of 100 + 96
        ((1, 48, 7, 7), (80, 48, 1, 1), {}),  # a 1x1 of one pixel tile
    ],
)
def test_pixels_as_rows_tiles_add_the_residual_on_their_transposed_store(
    x_shape, w_shape, attrs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pixels-as-rows conv's bias, residual and Relu run on the transposed store of each tile
    (afc_store_t_post), the residual read at the output's own index: no pass after the store."""
    monkeypatch.setenv(CONTRACTION_ENV, "library")
    model, feeds, spec, weights = _residual_model(x_shape, w_shape, **attrs)
    kernel = lower_conv(spec)
    routines = {c.function for c in calls(kernel.body)}
    assert STORE_T_POST_ROUTINE in routines and STORE_T_ROUTINE not in routines
    (got,) = run(kernel, [feeds["x"], feeds["r"], *weights], tmp_path)
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-3)


def test_pixels_as_rows_tiles_with_another_epilogue_store_then_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An epilogue that is not the library's post-ops (a Sigmoid) is the generated pass after
    the plain transposed store."""
    monkeypatch.setenv(CONTRACTION_ENV, "library")
    model, feeds = _model((1, 48, 7, 7), (80, 48, 1, 1), bias=True, relu=True, act="Sigmoid")
    spec, weights = _spec(model)
    kernel = lower_conv(spec)
    assert {c.function for c in calls(kernel.body)} == {PACKED_B_ROUTINE, STORE_T_ROUTINE}
    _assert_matches_onnxruntime(kernel, weights, model, feeds, tmp_path)


def test_the_channel_tiles_of_one_pixel_tile_share_one_packing_of_the_activation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 1x1 conv at 7x7 (49 pixels, one tile) split in channel tiles: every task reads the same
    activation, which each thread packs once per call (afc_gemm_bp_in, after the call's start
    retires the previous call's packings) for all the tiles it takes."""
    monkeypatch.setenv(CONTRACTION_ENV, "library")
    model, feeds = _model((1, 320, 7, 7), (256, 320, 1, 1), bias=True, relu=True)
    spec, weights = _spec(model)
    kernel = lower_conv(spec)
    begin, task = kernel.body
    assert begin.function == BEGIN_CALL_ROUTINE and isinstance(task, Loop) and task.parallel
    assert task.stop > 1  # channel tiles, each a task
    assert {c.function for c in calls(task.body)} == {PACKED_B_INPUT_ROUTINE, STORE_T_POST_ROUTINE}
    _assert_matches_onnxruntime(kernel, weights, model, feeds, tmp_path)


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "bias", "act", "chunked"),
    [
        ((1, 40, 20, 30), (100, 40, 1, 1), True, "Relu", ""),  # post-ops: one call per tile, no chunks
        ((2, 200, 16, 20), (60, 200, 1, 1), True, "Sigmoid", "epilogue"),  # two depth blocks, two images
        ((1, 40, 20, 30), (100, 40, 1, 1), True, "Sigmoid", "epilogue"),  # not a post-op: the nest
        ((1, 512, 24, 24), (64, 512, 1, 1), True, "Relu", ""),  # the tile's pixels too deep to keep
        ((1, 40, 20, 30), (100, 40, 1, 1), False, "Relu", ""),  # no epilogue to finish
    ],
)
def test_a_1x1_tile_is_finished_chunk_by_chunk(
    x_shape, w_shape, bias: bool, act: str, chunked: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of EPILOGUE_CHUNK_ROWS channels against the tile's pixels packed once, each finished
    right after its product by the generated epilogue nest over the chunk's rows; an epilogue of
    the library's post-ops (bias, residual, Relu/Clip) needs no chunks: one call per tile."""
    monkeypatch.setenv(CONTRACTION_ENV, "library")
    model, feeds = _model(x_shape, w_shape, bias=bias, relu=bias, act=act)
    spec, weights = _spec(model)
    kernel = lower_conv(spec)
    assert method_of(kernel) == GEMM1X1
    chunks = [s for s in _walk(kernel.body) if isinstance(s, Loop) and s.var.name == "rc"]
    assert len(chunks) == int(bool(chunked))
    if chunked:
        (chunk,) = chunks
        assert chunk.step == EPILOGUE_CHUNK_ROWS
        # the chunk's product, then its epilogue over the chunk's channels, or both in one call
        assert [c.function for c in calls(chunk.body)] == [PACKED_A_INPUT_ROUTINE]
        assert any(isinstance(s, Loop) and s.var.name == "r" for s in _walk(chunk.body))
        assert isinstance(kernel.body[0], type(calls(chunk.body)[0]))
        assert kernel.body[0].function == BEGIN_CALL_ROUTINE  # the call's kept packings retired
    else:
        assert PACKED_A_INPUT_ROUTINE not in {c.function for c in calls(kernel.body)}
    _assert_matches_onnxruntime(kernel, weights, model, feeds, tmp_path)


@pytest.mark.parametrize(("act", "routine"), [("Relu", PACKED_A_POST_ROUTINE), ("Sigmoid", PACKED_A_ROUTINE)])
def test_an_im2col_tile_is_finished_by_the_library_where_its_epilogue_is_a_post_op(
    act: str, routine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bias and Relu are the library's post-ops, applied to each tile before its store; a Sigmoid
    is not, and the generated epilogue finishes the tile after the plain product."""
    monkeypatch.setenv(CONTRACTION_ENV, "library")
    attrs = {"strides": [2, 2], "pads": [1, 0, 1, 2], "dilations": [2, 1]}  # plain im2col tiles
    model, feeds = _model((2, 5, 40, 70), (12, 5, 3, 3), bias=True, relu=True, act=act, **attrs)
    spec, weights = _spec(model)
    kernel = lower_conv(spec)
    assert method_of(kernel) == IM2COL
    assert {c.function for c in calls(kernel.body)} == {routine}
    _assert_matches_onnxruntime(kernel, weights, model, feeds, tmp_path)


def test_raw_conv_output_stores_the_product_without_an_epilogue(tmp_path: Path) -> None:
    model, feeds = _model((1, 8, 10, 10), (8, 8, 3, 3), bias=False, relu=False, pads=[1, 1, 1, 1])
    spec, weights = _spec(model)
    kernel = lower_conv(spec)
    assert not any(isinstance(s, Loop) and s.var.name == "r" for s in _walk(kernel.body))
    _assert_matches_onnxruntime(kernel, weights, model, feeds, tmp_path)


def test_im2col_uses_a_workspace_slice_not_an_allocation() -> None:
    # (more output channels than afc_conv_bp reads a band in place for: im2col)
    model, _ = _model((1, 8, 20, 20), (136, 8, 3, 3), bias=True, relu=True, pads=[1, 1, 1, 1])
    spec, _ = _spec(model)
    kernel = lower_conv(spec)
    (task,) = [s for s in kernel.body if isinstance(s, Loop)]
    assert [b.name for b in task.scratch] == ["col", "pad"]  # the padded input band too
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
    _assert_matches_onnxruntime(kernel, weights, model, feeds, tmp_path)


def _walk(body):
    for s in body:
        yield s
        if isinstance(s, Loop):
            yield from _walk(s.body)


class _Shapes:
    def __init__(self, spec: KernelSpec) -> None:
        self.spec = spec

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.spec.tensors[name].shape)


def test_small_depthwise_planes_share_a_task_and_a_zeroed_border() -> None:
    """576 planes of 7x7 by a 5x5: a task per plane costs a zeroed plane as much as the plane's
    multiply-adds, so a task takes a run of planes and zeroes the padded plane once (the copies
    rewrite the same interior cells every plane). The equal tasks are split statically: taking
    each dynamically costs a good part of what one does."""
    model, _ = _model((1, 576, 7, 7), (576, 1, 5, 5), bias=True, relu=True, group=576, pads=[2, 2, 2, 2])
    spec, _ = _spec(model)
    (task,) = [s for s in lower_conv(spec).body if isinstance(s, Loop) and s.parallel]
    assert 8 <= task.stop < 576 and not task.dynamic
    zero, planes = task.body
    assert isinstance(zero, Loop) and zero.vector and isinstance(planes, Loop) and not planes.parallel
    # a big plane is a task of its own (96 planes of 112x112: at least 8 tasks to share out)
    model, _ = _model((1, 96, 112, 112), (96, 1, 3, 3), bias=True, relu=True, group=96, pads=[1, 1, 1, 1])
    spec, _ = _spec(model)
    (task,) = [s for s in lower_conv(spec).body if isinstance(s, Loop) and s.parallel]
    assert task.stop == 96


@pytest.mark.parametrize(
    ("planes", "size", "stride"),
    [
        *[(960, 7, 1), (67, 7, 1), (5, 7, 1), (1, 8, 1), (576, 14, 1), (192, 28, 1), (3, 31, 1)],
        *[(32, 112, 1), (576, 14, 2), (144, 56, 2), (96, 112, 2), (3, 9, 2)],
    ],
)
def test_depthwise_3x3s_run_in_the_library_in_short_runs(planes: int, size: int, stride: int) -> None:
    """3x3s of stride 1 whose output rows are as wide as the input's, and of stride 2
    (MobileNetV2's depthwise convs), are computed by afc_dw3x3 / afc_dw3x3_s2,
    a call per run of planes short enough that the epilogue finishing it finds it in L1, and
    runs enough to share out."""
    shape, strides = (1, planes, size, size), [stride, stride]
    model, _ = _model(
        shape, (planes, 1, 3, 3), bias=True, relu=True, group=planes, pads=[1, 1, 1, 1], strides=strides
    )
    spec, _ = _spec(model)
    kernel = lower_conv(spec)
    (task,) = [s for s in kernel.body if isinstance(s, Loop)]
    routine = DEPTHWISE_3X3_ROUTINE if stride == 1 else DEPTHWISE_3X3_S2_ROUTINE
    assert [c.function for c in calls(task.body)] == [routine]
    side = -(-size // stride)  # output rows and columns
    out = side * side
    assert task.stop >= min(planes, 8)
    assert task.parallel == (4 * planes * out * 9 >= PARALLEL_MIN_MACS) and not task.dynamic
    per_task = -(-planes // task.stop)
    assert per_task == 1 or per_task * out <= 4096  # a run's output within L1
    # stride 3, a 5x5, dilation, planes too large for AVX2's padded copies and output rows
    # narrower than the input's keep the generated loop
    for x_shape, attrs in (
        ((1, 4, 128, 128), {"pads": [1, 1, 1, 1]}),
        ((1, 4, 260, 130), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
        ((1, 4, 14, 14), {"pads": [2, 2, 2, 2], "kernel": 5}),
        ((1, 4, 14, 14), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
        ((1, 4, 14, 14), {"pads": [1, 1, 1, 1], "strides": [3, 3]}),
        ((1, 4, 2000, 8), {"pads": [1, 1, 1, 1]}),
        ((1, 4, 14, 14), {"pads": [1, 1, 1, 0]}),
    ):
        k = attrs.pop("kernel", 3)
        model, _ = _model(x_shape, (4, 1, k, k), bias=True, relu=True, group=4, **attrs)
        spec, _ = _spec(model)
        assert not calls(lower_conv(spec).body)


def test_direct_tiles_are_whole_rows_the_threads_finish_together() -> None:
    # ResNet-50's 3x3 convs: 56-pixel rows in a 58-column band, 28-pixel rows in a 30-column one
    g56 = ConvGeometry(n=1, cin=64, cout=64, group=1, h=56, w=56, oh=56, ow=56,
                       kh=3, kw=3, sh=1, sw=1, dh=1, dw=1, pt=1, pl=1)  # fmt: skip
    rt, rtn, ct, ctn = direct_tiles(g56)
    assert (ct, ctn) == (64, 1)
    assert rtn % 2 == 0 and rt * rtn == 56  # equal tiles, as many for each thread
    assert rt * 58 >= 256 and 64 * (rt + 2) * 58 <= 64 * 1024  # wide enough, band within L2
    g64 = ConvGeometry(n=1, cin=128, cout=128, group=1, h=64, w=64, oh=64, ow=64,
                       kh=3, kw=3, sh=1, sw=1, dh=1, dw=1, pt=1, pl=1)  # fmt: skip
    assert direct_tiles(g64) == (4, 16, 128, 1)  # 128 x 6 x 66 floats of band; 8 tasks a thread
    # one output row: too few tasks, so the channels split
    g1 = ConvGeometry(n=1, cin=8, cout=40, group=1, h=1, w=300, oh=1, ow=300,
                      kh=1, kw=5, sh=1, sw=1, dh=1, dw=1, pt=0, pl=2)  # fmt: skip
    assert direct_tiles(g1) == (1, 1, 24, 2)


@pytest.mark.parametrize(("channels", "size"), [(64, 56), (128, 28), (256, 14), (128, 4)])
def test_winograd_tasks_are_balanced_bands_of_whole_panel_channel_tiles(channels: int, size: int) -> None:
    """ResNet-50's stride-1 3x3s (and a 4x4 image, two tile rows): an even count of tasks that
    two threads share equally, at least ROBUST_TASKS of them but for a weight-bound conv (256
    channels at 14x14: 4 MiB of transforms), which takes the whole image per channel tile,
    channel tiles of whole B panels, and a block's transformed input within its budget."""
    g = ConvGeometry(n=1, cin=channels, cout=channels, group=1, h=size, w=size, oh=size, ow=size,
                     kh=3, kw=3, sh=1, sw=1, dh=1, dw=1, pt=1, pl=1)  # fmt: skip
    assert conv_module.winograd_shape(g)
    rt, bands, kt, kblocks, tr = conv_module.winograd_tiles(g)
    th = size // 2
    assert bands == -(-th // rt) and kt * kblocks == channels and (kblocks == 1 or kt % 32 == 0)
    tasks = bands * kblocks
    if 16 * channels * channels <= conv_module.WINO_L2_FLOATS:
        assert tasks >= ROBUST_TASKS and tasks % 2 == 0, (rt, bands, kt, kblocks)
    else:
        assert (bands, kblocks) == (1, 2), (rt, bands, kt, kblocks)
    # tile rows per thread, the tasks (bands outer, channel tiles inner) handed out from both
    # ends as the pool's two-thread dynamic loops do
    rows = [min(rt, th - b * rt) for b in range(bands) for _ in range(kblocks)]
    loads, i, j = [0, 0], 0, len(rows) - 1
    while i <= j:
        if loads[0] <= loads[1]:
            loads[0], i = loads[0] + rows[i], i + 1
        else:
            loads[1], j = loads[1] + rows[j], j - 1
    assert loads[0] == loads[1] == th * kblocks // 2, (rt, bands, kblocks)
    assert 16 * tr * (size // 2) * channels <= conv_module.WINO_BLOCK_FLOATS or tr == 1
    odd = ConvGeometry(n=1, cin=channels, cout=channels, group=1, h=7, w=7, oh=7, ow=7,
                       kh=3, kw=3, sh=1, sw=1, dh=1, dw=1, pt=1, pl=1)  # fmt: skip
    assert not conv_module.winograd_shape(odd)
