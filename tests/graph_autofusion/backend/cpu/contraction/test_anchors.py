"""Anchors on the contraction library: weights packed once at load by the runtime, the same
results as onnxruntime for every ISA this host runs, and `AUTOFUSION_CONTRACTION` switching back
to OpenBLAS."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import graph_autofusion as gaf
from graph_autofusion.backend.cpu.cache import KernelCache
from graph_autofusion.backend.cpu.contraction import CONTRACTION_ENV, contraction_mode
from graph_autofusion.backend.cpu.isa import host_isa, parse_isa
from graph_autofusion.backend.cpu.runtime import compile_model, generate_once
from graph_autofusion.errors import InvalidConfigError

RUNNABLE = [name for name in ("v4", "v3", "generic") if parse_isa(name).runs_on(host_isa())]


def _model(rng: np.random.Generator) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Grouped 3x3 conv (odd channel counts) -> 1x1 conv -> Relu -> flatten -> Gemm(transB, alpha)
    -> MatMul (weights [K, N]) -> Add: every packed path, with shapes no tile divides."""
    f = lambda *s: rng.uniform(-1, 1, s).astype(np.float32)  # noqa: E731
    inits = {
        "w1": f(14, 3, 3, 3),  # group 2: 7 output channels per group
        "b1": f(14),
        "w2": f(22, 14, 1, 1),
        "wg": f(37, 22 * 5 * 5),  # Gemm transB: [N, K]
        "wm": f(37, 19),
        "bm": f(19),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=2),
        helper.make_node("Conv", ["c1", "w2"], ["c2"], kernel_shape=[1, 1]),
        helper.make_node("Relu", ["c2"], ["r"]),
        helper.make_node("Flatten", ["r"], ["fl"], axis=1),
        helper.make_node("Gemm", ["fl", "wg"], ["g"], transB=1, alpha=0.5),
        helper.make_node("MatMul", ["g", "wm"], ["mm"]),
        helper.make_node("Add", ["mm", "bm"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "packed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 6, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model), {"x": f(3, 6, 5, 5)}


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


@pytest.mark.parametrize("fused", [False, True], ids=["unfused", "fused"])
@pytest.mark.parametrize("isa", RUNNABLE)
def test_packed_anchors_match_onnxruntime_on_every_isa(
    isa: str, fused: bool, kernel_cache: KernelCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CONTRACTION_ENV, "library")
    model, feeds = _model(np.random.default_rng(0))
    program = gaf.fuse(model).model if fused else model
    compiled = compile_model(program, cache=kernel_cache, isa=parse_isa(isa), threads=2)
    got = compiled(feeds)["y"]
    want = _ort(model, feeds)
    # K <= 550 terms of O(1) values, then a second contraction over 37 of O(10): 1e-4 relative.
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    # Four weight operands packed (two convs, Gemm's B, MatMul's B): at least their own size.
    weights = sum(int(np.prod(i.dims)) * 4 for i in model.graph.initializer if i.name.startswith("w"))
    assert compiled.stats["packed_weights_bytes"] >= weights


def test_blas_mode_packs_nothing_and_agrees(
    kernel_cache: KernelCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, feeds = _model(np.random.default_rng(1))
    runs = {}
    for mode in ("blas", "library"):
        monkeypatch.setenv(CONTRACTION_ENV, mode)
        compiled = compile_model(model, cache=kernel_cache, threads=2)
        runs[mode] = (compiled(feeds)["y"], compiled.stats["packed_weights_bytes"])
    assert runs["blas"][1] == 0 and runs["library"][1] > 0
    np.testing.assert_allclose(runs["library"][0], runs["blas"][0], rtol=1e-4, atol=1e-4)


def test_kernels_call_the_library_only_for_constant_operands(monkeypatch: pytest.MonkeyPatch) -> None:
    """MatMul of two activations (attention's Q x K^T) keeps OpenBLAS; a weight operand packs."""
    from graph_autofusion.backend.cpu.extract import extract

    monkeypatch.setenv(CONTRACTION_ENV, "library")
    w = numpy_helper.from_array(np.ones((8, 6), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["ab"]), helper.make_node("MatMul", ["ab", "w"], ["y"])],
        "two",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [4, 5]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [5, 8]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 6])],
        [w],
    )
    model = onnx.shape_inference.infer_shapes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    )
    sources = [generate_once(spec).source for spec in extract(model).specs.values()]
    assert sorted("afc_gemm_bp(" in s for s in sources) == [False, True]
    assert sorted("AF_SGEMM(" in s for s in sources) == [False, True]


def test_an_unknown_mode_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CONTRACTION_ENV, "mkl")
    with pytest.raises(InvalidConfigError):
        contraction_mode()


@pytest.mark.parametrize("batch", range(1, 9))
def test_few_row_gemms_with_epilogues_match_onnxruntime(batch: int, kernel_cache: KernelCache) -> None:
    # Batch 1-8 Linear layers take afc_gemm_bp's GEMV path (up to 7 rows on AVX-512) or its panel
    # path, fused as a chain (Gemm + bias + Relu, twice) and as a lone Gemm with its bias; odd
    # widths leave a tail panel in every layer.
    from graph_autofusion import zoo

    model = zoo.build("mlp", in_features=97, hidden=(45, 131), num_classes=7, batch=batch)
    feeds = zoo.example_inputs(model)
    compiled = compile_model(gaf.fuse(model).model, cache=kernel_cache, threads=2)
    got = next(iter(compiled(feeds).values()))
    want = _ort(model, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
