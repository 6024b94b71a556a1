"""Builders and an onnxruntime oracle shared by the canonicalization tests."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from graph_autofusion.verify import random_inputs

ORT_IR_VERSION = 10  # onnx 1.23 writes IR 14 by default; onnxruntime 1.31 reads up to IR 13


def build_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    initializers: dict[str, np.ndarray] | None = None,
    opset: int = 17,
) -> onnx.ModelProto:
    graph = helper.make_graph(
        list(nodes),
        "test",
        list(inputs),
        list(outputs),
        [numpy_helper.from_array(np.asarray(v), k) for k, v in (initializers or {}).items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ORT_IR_VERSION)


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def random_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """The engine's own verification inputs: N(0,1) floats, ids bounded by the tables they index."""
    return random_inputs(model, seed=seed)


def assert_same_outputs(
    before: onnx.ModelProto,
    after: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    rtol: float = 1e-5,
    atol: float = 1e-5,
) -> None:
    assert [o.name for o in before.graph.output] == [o.name for o in after.graph.output]
    for expected, actual in zip(run_ort(before, feeds), run_ort(after, feeds), strict=True):
        assert expected.shape == actual.shape
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)


def ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def tensor(name: str, shape: Sequence[int | str | None] | None, elem: int = TensorProto.FLOAT):
    """`tensor("x", [1, 3])` → a float ValueInfo; `tensor("ids", ["batch", 8], TensorProto.INT64)`."""
    return helper.make_tensor_value_info(name, elem, shape)


def fuse_and_check(model: onnx.ModelProto, tmp_path) -> tuple[int, int]:
    """Fuse `model`, run the compiled kernels against onnxruntime, and return (kernels planned,
    the plan's lower bound: one kernel per contraction or reduction of the canonical graph)."""
    import graph_autofusion as gaf
    from graph_autofusion.backend.cpu.cache import KernelCache
    from graph_autofusion.backend.cpu.runtime import compile_model
    from graph_autofusion.ops import OpKind

    fused = gaf.fuse(model)
    compiled = compile_model(fused.model, cache=KernelCache(tmp_path), threads=1)
    assert compiled.stats["host_ops"] == []
    assert fused.verify(runner="onnxruntime").passed
    assert fused.verify().passed
    bound = sum(1 for n in fused.plan.graph.nodes if n.kind in (OpKind.ANCHOR, OpKind.REDUCE))
    return fused.get_kernel_count(), bound
