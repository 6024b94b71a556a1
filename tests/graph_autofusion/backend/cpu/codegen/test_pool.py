"""Pool template: MaxPool/AveragePool windows with an elementwise epilogue, vs onnxruntime.

Tolerance (fp32): rtol 1e-5, atol 1e-6 against onnxruntime with optimizations disabled.
"""

from __future__ import annotations

import numpy as np
import pytest
from cpu_backend_helpers import check, make_model
from onnx import helper

CASES = [
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 2], "pads": [1, 0, 2, 1], "strides": [1, 2]},
    {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
]


@pytest.mark.parametrize("attrs", CASES)
def test_maxpool_with_relu_epilogue(kernel_cache, attrs) -> None:
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], **attrs), helper.make_node("Relu", ["p"], ["y"])]
    check(make_model(nodes, {"x": [2, 3, 9, 8]}, ["y"]), kernel_cache, "pool")


@pytest.mark.parametrize("include_pad", [0, 1])
@pytest.mark.parametrize("attrs", CASES)
def test_average_pool(kernel_cache, attrs, include_pad) -> None:
    nodes = [
        helper.make_node("AveragePool", ["x"], ["p"], count_include_pad=include_pad, **attrs),
        helper.make_node("Add", ["p", "b"], ["y"]),
    ]
    b = np.arange(3, dtype=np.float32).reshape(3, 1, 1)
    check(make_model(nodes, {"x": [2, 3, 9, 8]}, ["y"], {"b": b}), kernel_cache, "pool")


def test_maxpool_dilations_1d(kernel_cache) -> None:
    nodes = [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3], dilations=[2], pads=[2, 2])]
    check(make_model(nodes, {"x": [1, 2, 11]}, ["y"]), kernel_cache)


WIDE = [
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 3], "strides": [3, 3], "ceil_mode": 1},
    {"kernel_shape": [5, 5], "strides": [1, 1], "pads": [2, 2, 2, 2], "dilations": [1, 2]},
    {"kernel_shape": [7, 7], "strides": [2, 2]},
]


@pytest.mark.parametrize("attrs", WIDE)
def test_rows_split_into_border_and_interior_match_onnxruntime(kernel_cache, attrs) -> None:
    """Rows long enough for an interior (windows inside the input) run it as its own loop."""
    nodes = [helper.make_node("MaxPool", ["x"], ["y"], **attrs)]
    check(make_model(nodes, {"x": [1, 2, 13, 40]}, ["y"]), kernel_cache, "pool")
    if "dilations" not in attrs:  # AveragePool takes dilations from opset 19 only
        nodes = [helper.make_node("AveragePool", ["x"], ["y"], count_include_pad=1, **attrs)]
        check(make_model(nodes, {"x": [1, 2, 13, 40]}, ["y"]), kernel_cache, "pool")


def test_the_interior_loop_has_constant_window_bounds() -> None:
    """ResNet-50's first MaxPool: column 0 clamps its window, columns 1..55 read 3 taps unclamped;
    the rows' window has a constant trip count everywhere, its positions clamped into the input
    (a fold with clamped bounds inside the column loop kept it from vectorizing)."""
    import onnx

    from graph_autofusion.backend.cpu.extract import extract
    from graph_autofusion.kernel_ir import Loop, format_kernel
    from graph_autofusion.lower.pointwise import lower_pointwise

    nodes = [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)]
    model = onnx.shape_inference.infer_shapes(make_model(nodes, {"x": [1, 64, 112, 112]}, ["y"]))
    (spec,) = extract(model).specs.values()
    kernel = lower_pointwise(spec)
    (outer,) = kernel.body
    assert isinstance(outer, Loop)
    rows = [s for s in outer.body if isinstance(s, Loop)]
    assert [(r.start, r.stop) for r in rows] == [(0, 1), (1, 56)]
    text = format_kernel(kernel)
    assert "max(w1_2615 from 0 to 3:" in text.split("1 <= i3 < 56")[1]
    assert text.count("max(w0_2615 from 0 to 3:") == 2
    assert "min(max(add(sub(mul(i2, 2), 1), w0_2615), 0), 111)" in text


@pytest.mark.parametrize(
    "attrs",
    [
        # positions -1, 1, 3: -1 clamped would be 0, outside the window
        {"kernel_shape": [3], "dilations": [2], "pads": [1, 1]},
        {"kernel_shape": [3], "dilations": [3], "pads": [2, 2], "strides": [2]},
    ],
)
def test_dilated_max_windows_never_read_a_clamped_position(kernel_cache, attrs) -> None:
    """A window's clamped position is one of its own only when it is undilated: input 0 (the
    largest of a descending ramp) must not win a window it is not in."""
    nodes = [helper.make_node("MaxPool", ["x"], ["y"], **attrs)]
    model = make_model(nodes, {"x": [1, 2, 11]}, ["y"])
    ramp = -np.arange(2 * 11, dtype=np.float32).reshape(1, 2, 11)
    check(model, kernel_cache, "pool", feeds={"x": ramp})
    check(model, kernel_cache, "pool", feeds={"x": ramp[..., ::-1].copy()})
