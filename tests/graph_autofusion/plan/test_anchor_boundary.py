"""Anchor kernels are fp32: a bool/int tensor crossing the group's boundary makes it a misfit.

Otherwise the generator declines the whole group and the contraction runs on the host path.
Found by the differential test (57 of 3000 random graphs had an anchor on the host for this).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from graphs import model, node
from onnx import TensorProto, helper

import graph_autofusion as gaf
from graph_autofusion.backend.cpu.runtime import compile_model
from graph_autofusion.ir import Graph
from graph_autofusion.lower.values import Unsupported
from graph_autofusion.plan.anchor_match import match_anchor
from graph_autofusion.plan.reduction_match import group_spec
from graph_autofusion.plan.templates import classify


def _matmul_where_mask() -> onnx.ModelProto:
    m = model(
        [node("MatMul", ["x", "w"], ["y"], "mm"), node("Where", ["mask", "y", "x"], ["o"], "where")],
        [("x", [4, 8])],
        ["o"],
        [("w", np.eye(8, dtype=np.float32))],
    )
    m.graph.input.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, [4, 8]))
    del m.graph.output[:]
    m.graph.output.append(helper.make_tensor_value_info("o", TensorProto.FLOAT, [4, 8]))
    return m


def test_a_runtime_bool_mask_keeps_where_out_of_the_anchor_kernel() -> None:
    g = Graph(onnx.shape_inference.infer_shapes(_matmul_where_mask()))
    kind, why = classify(g, range(len(g.nodes)))
    assert kind is None and "'mask' crosses an anchor kernel's boundary as BOOL" in why, why


def test_the_matmul_then_compiles_and_matches_onnxruntime(tmp_path) -> None:
    from graph_autofusion.backend.cpu.cache import KernelCache

    fused = gaf.fuse(_matmul_where_mask())
    compiled = compile_model(fused.model, cache=KernelCache(tmp_path), threads=1)
    assert compiled.stats["host_ops"] == []
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((4, 8)).astype(np.float32), "mask": rng.random((4, 8)) < 0.5}
    assert fused.verify(feeds, raise_on_failure=True).passed
    np.testing.assert_allclose(
        compiled(feeds)["o"], np.where(feeds["mask"], feeds["x"], feeds["x"]), rtol=1e-6
    )


def test_float_types_widen_the_boundary_for_a_backend_that_takes_16_bit_operands() -> None:
    m = model(
        [node("MatMul", ["x", "w"], ["y"], "mm")],
        [("x", [4, 8])],
        ["y"],
        [("w", np.eye(8, dtype=np.float16))],
    )
    m.graph.input[0].type.tensor_type.elem_type = TensorProto.FLOAT16
    del m.graph.output[:]
    m.graph.output.append(helper.make_tensor_value_info("y", TensorProto.FLOAT16, [4, 8]))
    g = Graph(onnx.shape_inference.infer_shapes(m))
    spec = group_spec(g, range(len(g.nodes)))
    with pytest.raises(
        Unsupported, match="crosses an anchor kernel's boundary as FLOAT16; anchor kernels take FLOAT"
    ):
        match_anchor(spec)
    wide = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16})
    assert match_anchor(spec, float_types=wide).contraction is not None
