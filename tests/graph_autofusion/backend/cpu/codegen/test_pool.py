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
