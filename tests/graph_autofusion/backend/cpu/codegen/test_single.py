"""Single-op kernels outside the fused templates (ArgMax/ArgMin, CumSum), vs onnxruntime.

Tolerance (fp32): rtol 1e-5, atol 1e-6 against onnxruntime with optimizations disabled.
"""

from __future__ import annotations

import numpy as np
import pytest
from cpu_backend_helpers import check, make_model
from onnx import helper


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize(("axis", "keepdims", "last"), [(1, 1, 0), (-1, 0, 1), (0, 0, 0)])
def test_arg_reductions(kernel_cache, op, axis, keepdims, last) -> None:
    node = helper.make_node(op, ["x"], ["y"], axis=axis, keepdims=keepdims, select_last_index=last)
    model = make_model([node], {"x": [3, 5, 4]}, ["y"])
    feeds = {"x": np.random.default_rng(0).integers(0, 3, (3, 5, 4)).astype(np.float32)}  # ties on purpose
    compiled = check(model, kernel_cache, feeds=feeds)
    assert compiled.stats["per_kernel"][0]["template"] == "single"


@pytest.mark.parametrize(("exclusive", "reverse"), [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumsum(kernel_cache, exclusive, reverse) -> None:
    node = helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
    model = make_model([node], {"x": [2, 7, 3]}, ["y"], {"axis": np.array(1, dtype=np.int64)})
    check(model, kernel_cache)
