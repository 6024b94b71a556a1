"""Conv / ConvTranspose anchor kernels (every method, with epilogues) against onnxruntime."""

from __future__ import annotations

import math

import numpy as np
import pytest
from anchor_helpers import Case, check, make_case, rand, spec_for
from onnx import TensorProto, helper, numpy_helper

from graph_autofusion.backend.cpu.codegen.anchor import emit_anchor
from graph_autofusion.backend.cpu.codegen.common import CodegenUnsupported


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(2024)


def _conv_case(
    rng: np.random.Generator,
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    *,
    bias: bool = True,
    relu: bool = True,
    op: str = "Conv",
    extra: list | None = None,
    extra_inits: dict | None = None,
    extra_inputs: dict | None = None,
    **attrs: object,
):
    ins = ["x", "w"] + (["b"] if bias else [])
    inits = {"w": rand(rng, *w_shape)}
    if bias:
        inits["b"] = rand(
            rng, w_shape[1] * int(attrs.get("group", 1)) if op == "ConvTranspose" else w_shape[0]
        )
    nodes = [helper.make_node(op, ins, ["y"], **attrs)]
    last = "y"
    if relu:
        nodes.append(helper.make_node("Relu", ["y"], ["r"]))
        last = "r"
    for node in extra or []:
        nodes.append(node)
        last = node.output[0]
    inits.update(extra_inits or {})
    return make_case(nodes, {"x": rand(rng, *x_shape), **(extra_inputs or {})}, [last], inits)


def _k(w_shape: tuple[int, ...], group: int = 1, transpose: bool = False) -> int:
    return (w_shape[0] // group if transpose else w_shape[1]) * math.prod(w_shape[2:])


def test_conv1x1_is_a_direct_gemm(rng: np.random.Generator) -> None:
    case = _conv_case(rng, (2, 24, 10, 10), (16, 24, 1, 1))
    kernel = check(case, "conv1x1", k=24, method="conv1x1_gemm")
    assert "im2col" not in kernel.source


def test_conv3x3_stride1_pad1_bias_relu(rng: np.random.Generator) -> None:
    case = _conv_case(rng, (1, 16, 12, 12), (24, 16, 3, 3), pads=[1, 1, 1, 1])
    check(case, "conv3x3_s1", k=_k((24, 16, 3, 3)), method="conv_im2col_tiled")


def _bn_residual_case(
    rng: np.random.Generator, x_shape: tuple[int, ...], cout: int, out_hw: int, **attrs: object
) -> Case:
    """A 3x3 conv (pad 1) with a folded BatchNorm as Mul + Add, a residual Add and ReLU after it."""
    n, cin = x_shape[:2]
    return _conv_case(
        rng,
        x_shape,
        (cout, cin, 3, 3),
        bias=False,
        relu=False,
        pads=[1, 1, 1, 1],
        extra=[
            helper.make_node("Mul", ["y", "scale"], ["ys"]),
            helper.make_node("Add", ["ys", "shift"], ["yb"]),
            helper.make_node("Add", ["yb", "res"], ["ya"]),
            helper.make_node("Relu", ["ya"], ["o"]),
        ],
        extra_inits={"scale": rand(rng, cout, 1, 1), "shift": rand(rng, cout, 1, 1)},
        extra_inputs={"res": rand(rng, n, cout, out_hw, out_hw)},
        **attrs,
    )


def test_conv3x3_stride2_with_batchnorm_affine_and_residual(rng: np.random.Generator) -> None:
    case = _bn_residual_case(rng, (2, 8, 9, 9), 12, 5, strides=[2, 2])
    check(case, "conv3x3_s2_bn_res", k=_k((12, 8, 3, 3)), method="conv_im2col_tiled")


def test_conv3x3_rows_with_batchnorm_affine_and_residual(rng: np.random.Generator) -> None:
    # ResNet-50's 3x3 in miniature: stride 1, 40-pixel rows, the pixels as rows of the product in
    # tiles of whole output rows, each tap read from the input band in place, the tile stored
    # transposed, with the whole epilogue
    case = _bn_residual_case(rng, (2, 16, 40, 40), 24, 40)
    method = "conv_im2col_tiled"
    kernel = check(case, "conv3x3_rows_bn_res", k=_k((24, 16, 3, 3)), method=method, weights=True)
    assert "afc_conv_bp(" in kernel.source and "afc_store_t(" in kernel.source
    assert "pixels as rows" in kernel.source


def test_conv3x3_direct_with_batchnorm_affine_and_residual(rng: np.random.Generator) -> None:
    # with more output channels than afc_conv_bp reads a band in place for, the band's runs are the
    # vector loads instead (several row tiles, panels straddling row ends)
    case = _bn_residual_case(rng, (2, 16, 40, 40), 136, 40)
    kernel = check(case, "conv3x3_direct_bn_res", k=_k((136, 16, 3, 3)), method="conv_direct", weights=True)
    assert "afc_conv_ap(" in kernel.source and "tiles of" in kernel.source


def test_conv3x3_stride2_direct_reads_phase_planes(rng: np.random.Generator) -> None:
    # stride 2 into 33-pixel rows: the band in four phase planes, the same epilogue
    case = _bn_residual_case(rng, (1, 8, 66, 66), 136, 33, strides=[2, 2])
    kernel = check(case, "conv3x3_s2_direct", k=_k((136, 8, 3, 3)), method="conv_direct", weights=True)
    assert "2x2 phases" in kernel.source


def test_conv3x3_winograd_with_batchnorm_affine_and_residual(rng: np.random.Generator) -> None:
    # a 3x3 of stride 1 with channels in whole vectors runs as Winograd F(2x2, 3x3); the folded
    # BatchNorm is no post-op, so the epilogue runs after the transformed tiles are stored
    case = _bn_residual_case(rng, (2, 16, 40, 40), 32, 40)
    kernel = check(case, "conv3x3_wino_bn_res", k=_k((32, 16, 3, 3)), method="conv_winograd", weights=True)
    assert "afc_wino3x3(" in kernel.source and "afc_wino3x3_pack(" in kernel.source


def test_conv3x3_winograd_post_ops_on_a_wide_image(rng: np.random.Generator) -> None:
    # bias, residual and Relu as the library's post-ops on the store; rows of 14 (7 tiles), 6 rows
    case = _conv_case(
        rng,
        (1, 32, 6, 14),
        (48, 32, 3, 3),
        relu=False,
        pads=[1, 1, 1, 1],
        extra=[helper.make_node("Add", ["y", "res"], ["ya"]), helper.make_node("Relu", ["ya"], ["o"])],
        extra_inputs={"res": rand(rng, 1, 48, 6, 14)},
    )
    kernel = check(case, "conv3x3_wino_post", k=_k((48, 32, 3, 3)), method="conv_winograd", weights=True)
    (call,) = [line for line in kernel.source.splitlines() if line.strip().startswith("afc_wino3x3(")]
    assert "NULL" not in call  # the bias and the residual are the call's post-ops


def test_conv3x3_winograd_splits_output_channels_of_a_small_image(rng: np.random.Generator) -> None:
    # 4x4 pixels are two tile rows: the tasks split the 128 output channels too, each task
    # transforming the input again
    case = _conv_case(rng, (1, 64, 4, 4), (128, 64, 3, 3), pads=[1, 1, 1, 1])
    kernel = check(case, "conv3x3_wino_split", k=_k((128, 64, 3, 3)), method="conv_winograd", weights=True)
    assert "channel tiles of 64" in kernel.source or "channel tiles of 32" in kernel.source


@pytest.mark.parametrize(
    ("x_shape", "attrs"),
    [((1, 16, 7, 7), {"pads": [1, 1, 1, 1]}), ((1, 16, 8, 8), {"pads": [1, 1, 1, 1], "strides": [2, 2]})],
    ids=["odd_size", "stride2"],
)
def test_conv3x3_outside_winograd_keeps_the_direct_sum(
    rng: np.random.Generator, x_shape: tuple[int, ...], attrs: dict
) -> None:
    case = _conv_case(rng, x_shape, (16, 16, 3, 3), **attrs)
    kernel = check(case, "conv3x3_not_wino", k=_k((16, 16, 3, 3)), weights=True)
    assert kernel.method != "conv_winograd"


def test_conv_many_pixel_tiles_stem(rng: np.random.Generator) -> None:
    # ResNet stem in miniature: 7x7 stride 2 pad 3, 3 input channels, many pixel tiles.
    case = _conv_case(rng, (1, 3, 96, 96), (16, 3, 7, 7), strides=[2, 2], pads=[3, 3, 3, 3])
    kernel = check(case, "conv_stem", k=_k((16, 3, 7, 7)), method="conv_im2col_tiled")
    assert "pixel tiles of" in kernel.source


def test_conv_small_image_splits_output_channels(rng: np.random.Generator) -> None:
    # 7x7 pixels fit one tile: output channels are split so the threads still get work.
    case = _conv_case(rng, (1, 64, 7, 7), (128, 64, 3, 3), pads=[1, 1, 1, 1])
    kernel = check(case, "conv_small_image", k=_k((128, 64, 3, 3)), method="conv_im2col_tiled")
    assert "x 1 channel tiles" not in kernel.source


@pytest.mark.parametrize(("k", "stride"), [(3, 1), (3, 2), (5, 1)])
def test_depthwise(rng: np.random.Generator, k: int, stride: int) -> None:
    # MobileNetV2-style depthwise conv + Clip(0, 6).
    case = _conv_case(
        rng,
        (1, 16, 14, 14),
        (16, 1, k, k),
        relu=False,
        group=16,
        strides=[stride, stride],
        pads=[k // 2] * 4,
        extra=[helper.make_node("Clip", ["y", "lo", "hi"], ["o"])],
        extra_inits={"lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32)},
    )
    kernel = check(case, f"dw{k}_s{stride}", k=k * k, method="conv_depthwise")
    assert not kernel.uses_blas


@pytest.mark.parametrize(("k", "stride", "dilation"), [(3, 2, 2), (9, 1, 1), (4, 3, 1)])
def test_depthwise_general_window(rng: np.random.Generator, k: int, stride: int, dilation: int) -> None:
    # Stride 2 with dilation 2 (both taps of a pair in one column phase), a 9x9 window (too many
    # taps to unroll: the looped form), an even window with stride 3 and asymmetric pads.
    case = _conv_case(
        rng,
        (2, 6, 15, 13),
        (6, 1, k, k),
        group=6,
        strides=[stride, stride],
        dilations=[dilation, dilation],
        pads=[k // 2, 1, k // 2 - 1, 0],
    )
    check(case, f"dw_general_{k}_{stride}_{dilation}", k=k * k, method="conv_depthwise")


def test_grouped_conv(rng: np.random.Generator) -> None:
    case = _conv_case(rng, (2, 16, 8, 8), (24, 4, 3, 3), group=4, pads=[1, 1, 1, 1])
    check(case, "conv_grouped", k=_k((24, 4, 3, 3)), method="conv_im2col_tiled")


def test_dilated_conv(rng: np.random.Generator) -> None:
    case = _conv_case(rng, (1, 8, 13, 11), (8, 8, 3, 3), dilations=[2, 2], pads=[2, 1, 2, 1])
    check(case, "conv_dilated", k=_k((8, 8, 3, 3)), method="conv_im2col_tiled")


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_conv_auto_pad(rng: np.random.Generator, auto_pad: str) -> None:
    case = _conv_case(rng, (1, 4, 10, 10), (6, 4, 4, 4), auto_pad=auto_pad, strides=[2, 2])
    check(case, f"conv_{auto_pad.lower()}", k=_k((6, 4, 4, 4)), method="conv_im2col_tiled")


def test_conv1d(rng: np.random.Generator) -> None:
    case = _conv_case(rng, (2, 6, 30), (10, 6, 5), pads=[2, 2], strides=[2])
    check(case, "conv1d", k=_k((10, 6, 5)), method="conv_im2col_tiled")


def test_conv_1x1_strided_goes_through_im2col(rng: np.random.Generator) -> None:
    case = _conv_case(rng, (1, 16, 9, 9), (8, 16, 1, 1), strides=[2, 2])
    check(case, "conv1x1_s2", k=16, method="conv_im2col_tiled")


@pytest.mark.parametrize(
    ("attrs", "x_shape", "w_shape"),
    [
        ({"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}, (1, 8, 5, 5), (8, 6, 3, 3)),
        ({"strides": [2, 2], "group": 2}, (2, 8, 4, 4), (8, 3, 2, 2)),
        ({"strides": [2, 2], "auto_pad": "SAME_UPPER"}, (1, 4, 5, 5), (4, 4, 3, 3)),
        ({"strides": [1, 1], "dilations": [2, 2], "pads": [1, 1, 1, 1]}, (1, 4, 6, 6), (4, 5, 3, 3)),
    ],
)
def test_conv_transpose(rng: np.random.Generator, attrs: dict, x_shape: tuple, w_shape: tuple) -> None:
    case = _conv_case(rng, x_shape, w_shape, op="ConvTranspose", **attrs)
    group = int(attrs.get("group", 1))
    check(
        case,
        f"convt_{len(attrs)}_{x_shape[0]}_{w_shape[1]}",
        k=_k(w_shape, group, transpose=True),
        method="conv_transpose_col2im",
    )


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs", "method"),
    [
        (
            (1, 3, 6, 7, 5),
            (4, 3, 3, 3, 3),
            {"pads": [1, 1, 1, 1, 1, 1], "strides": [2, 1, 2]},
            "conv_im2col_tiled",
        ),
        ((2, 4, 3, 4, 5), (6, 4, 1, 1, 1), {}, "conv1x1_gemm"),
        (
            (1, 4, 5, 5, 5),
            (4, 1, 3, 3, 3),
            {"group": 4, "dilations": [2, 1, 1], "pads": [2, 1, 1, 2, 1, 1]},
            "conv_im2col_tiled",
        ),
    ],
)
def test_conv3d(rng: np.random.Generator, x_shape: tuple, w_shape: tuple, attrs: dict, method: str) -> None:
    case = _conv_case(rng, x_shape, w_shape, **attrs)
    check(case, f"conv3d_{w_shape[2]}_{len(attrs)}", k=_k(w_shape), method=method)


def test_conv_transpose3d(rng: np.random.Generator) -> None:
    case = _conv_case(
        rng, (1, 3, 3, 4, 2), (3, 2, 3, 2, 3), op="ConvTranspose", strides=[2, 1, 2], pads=[1, 0, 1, 0, 1, 1]
    )
    check(case, "convt3d", k=_k((3, 2, 3, 2, 3), transpose=True), method="conv_transpose_col2im")


def test_conv_with_four_spatial_dims_is_refused(rng: np.random.Generator) -> None:
    x = rand(rng, 1, 1, 2, 2, 2, 2)
    case = Case(
        helper.make_model(
            helper.make_graph(
                [helper.make_node("Conv", ["x", "w"], ["o"])],
                "conv4d",
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                [helper.make_tensor_value_info("o", TensorProto.FLOAT, [1, 1, 1, 1, 1, 1])],
                [numpy_helper.from_array(rand(rng, 1, 1, 2, 2, 2, 2), "w")],
            )
        ),
        {"x": x},
    )
    spec, _ = spec_for(case, "conv4d")
    with pytest.raises(CodegenUnsupported, match="spatial"):
        emit_anchor(spec)


@pytest.mark.parametrize("view", ["Reshape", "Transpose"])
def test_conv_takes_no_prologue(rng: np.random.Generator, view: str) -> None:
    """As the planner rules (plan/anchor_match.py): a view into a conv is a kernel of its own (a
    transposing one would be a gather, which an anchor kernel never allocates memory for)."""
    if view == "Reshape":
        first = helper.make_node("Reshape", ["src", "shape"], ["x"])
        feeds, consts = {"src": rand(rng, 2, 4 * 6 * 6)}, {"shape": np.array([2, 4, 6, 6], dtype=np.int64)}
    else:
        first = helper.make_node("Transpose", ["src"], ["x"], perm=[0, 3, 1, 2])
        feeds, consts = {"src": rand(rng, 2, 6, 6, 4)}, {}
    case = make_case(
        [
            first,
            helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["y"], ["o"]),
        ],
        feeds,
        ["o"],
        {**consts, "w": rand(rng, 5, 4, 3, 3)},
    )
    spec, _ = spec_for(case, f"conv_after_{view.lower()}")
    with pytest.raises(CodegenUnsupported, match="Conv takes no fused prologue"):
        emit_anchor(spec)
