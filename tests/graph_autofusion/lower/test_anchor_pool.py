"""Lowered anchors opening with a GlobalAveragePool (a CNN's classifier): each task averages the
entries its tile of the left operand reads into its workspace slice, then contracts; the rendered
kernels against onnxruntime on the same nodes, and small CNNs from the zoo fused and verified."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from lowered_kernels import run
from onnx import helper

import graph_autofusion as gaf
from graph_autofusion.backend.cpu.contraction import CONTRACTION_ENV
from graph_autofusion.backend.cpu.kernel_spec import KernelSpec, TensorInfo
from graph_autofusion.backend.cpu.runtime import host_steps
from graph_autofusion.kernel_ir import Loop, format_kernel
from graph_autofusion.lower.anchor import lower_anchor, method_of
from graph_autofusion.plan.anchor_match import match_anchor
from graph_autofusion.verify import run_onnxruntime

F = onnx.TensorProto.FLOAT


def _classifier(n: int = 3, c: int = 200, hw: tuple[int, int] = (7, 7), classes: int = 300) -> KernelSpec:
    """`GlobalAveragePool -> Flatten -> Gemm(W, b, transB=1)`, torchvision's classifier head."""
    shapes = {
        "x": (n, c, *hw),
        "w": (classes, c),
        "b": (classes,),
        "p": (n, c, 1, 1),
        "f": (n, c),
        "y": (n, classes),
    }
    tensors = {k: TensorInfo(k, v, F) for k, v in shapes.items()}
    return KernelSpec(
        symbol="k",
        template="anchor",
        nodes=(
            helper.make_node("GlobalAveragePool", ["x"], ["p"], name="pool"),
            helper.make_node("Flatten", ["p"], ["f"], name="flat", axis=1),
            helper.make_node("Gemm", ["f", "w", "b"], ["y"], name="fc", transB=1),
        ),
        inputs=(tensors["x"], tensors["w"], tensors["b"]),
        outputs=(tensors["y"],),
        tensors=tensors,
        constants={},
        weights=frozenset({"w"}),
    )


def _reference(spec: KernelSpec, feeds: list[np.ndarray]) -> np.ndarray:
    graph = helper.make_graph(
        list(spec.nodes),
        "g",
        [helper.make_tensor_value_info(t.name, F, t.shape) for t in spec.inputs],
        [helper.make_tensor_value_info(t.name, F, t.shape) for t in spec.outputs],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return run_onnxruntime(m, {t.name: x for t, x in zip(spec.inputs, feeds, strict=True)})["y"]


def test_the_match_reads_the_pooled_workspace_as_the_left_operand() -> None:
    match = match_anchor(_classifier())
    assert match.pool is not None and match.pool.entries == 3 * 200 and match.pool.window == 49
    a = match.operands[0]
    assert a.tensor == "p" and a.shape == (3, 200) and a.through == ("flat",)
    assert match.to_json()["pool"] == {
        "node": "pool",
        "tensor": "x",
        "value": "p",
        "entries": 600,
        "window": 49,
    }


@pytest.mark.parametrize("library", [False, True])
def test_pooled_classifier_runs_like_onnxruntime(
    library: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(CONTRACTION_ENV, "library" if library else "blas")
    spec = _classifier()
    kernel = lower_anchor(spec)
    (loop,) = kernel.body
    assert isinstance(loop, Loop) and [b.name for b in loop.scratch] == ["pooled"]
    assert "A pooled first (GlobalAveragePool of 49)" in format_kernel(kernel)
    assert method_of(kernel) == "gemm"  # the pooled workspace is no packed operand
    rng = np.random.default_rng(1)
    feeds = [rng.standard_normal(t.shape).astype(np.float32) for t in spec.inputs]
    (got,) = run(kernel, feeds, tmp_path)
    np.testing.assert_allclose(got.reshape(3, 300), _reference(spec, feeds), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("resnet50", {"image_size": 64, "width": 16, "layers": (1, 1, 1, 1), "num_classes": 10}),
        ("mobilenet_v2", {"image_size": 64, "width_mult": 0.5, "num_classes": 10}),
    ],
)
def test_small_cnns_pool_inside_their_classifier_and_verify(name: str, kwargs: dict) -> None:
    fused = gaf.fuse(gaf.zoo.build(name, **kwargs))
    heads = [g for g in fused.report()["groups"] if "GlobalAveragePool" in g["op_types"]]
    assert [(g["template"], g["op_types"][-1]) for g in heads] == [("anchor", "Gemm")]
    assert not host_steps(fused.model)
    result = fused.verify()
    assert result.passed, result.to_dict()
