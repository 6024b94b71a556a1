"""Verification a user can trust: correct fp32 results pass whatever their depth and scale,
wrong ones fail.

The ResNet-50 here is the zoo's graph with torchvision's initialisation (kaiming-normal convs,
BatchNorm at γ=1, β=0, mean 0, var 1, a uniform Linear): its residual stream grows through 16
blocks, so logits reach ~60 and a correct fused run differs from onnxruntime by ~3e-5 — which a
fixed atol of 1e-5 called a failure. The derived rule admits it with room to spare, and still
fails every deliberately wrong variant below by a wide margin.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

import graph_autofusion as gaf
from graph_autofusion.backend.cpu.cache import KernelCache
from graph_autofusion.backend.cpu.runtime import compile_model
from graph_autofusion.verify import SAFETY, compare, output_noise, random_inputs, verify

U32 = 2.0**-24


def torch_style_resnet50(seed: int = 0) -> onnx.ModelProto:
    """zoo.resnet50 (224x224) re-initialised the way torchvision initialises a fresh ResNet-50."""
    model = gaf.zoo.build("resnet50", image_size=224)
    rng = np.random.default_rng(seed)
    inits = {t.name: t for t in model.graph.initializer}
    fresh: dict[str, np.ndarray] = {}
    for node in model.graph.node:
        if node.op_type == "Conv":
            dims = tuple(inits[node.input[1]].dims)
            fan_out = dims[0] * int(np.prod(dims[2:]))
            fresh[node.input[1]] = rng.standard_normal(dims) * np.sqrt(2.0 / fan_out)
        elif node.op_type == "BatchNormalization":
            for name, value in zip(node.input[1:5], (1.0, 0.0, 0.0, 1.0), strict=True):
                fresh[name] = np.full(tuple(inits[name].dims), value)
        elif node.op_type == "Gemm":
            bound = 1.0 / np.sqrt(inits[node.input[1]].dims[1])
            for name in node.input[1:]:
                fresh[name] = rng.uniform(-bound, bound, tuple(inits[name].dims))
    for name, value in fresh.items():
        inits[name].CopyFrom(numpy_helper.from_array(value.astype(np.float32), name))
    return model


@pytest.fixture(scope="module")
def resnet(tmp_path_factory: pytest.TempPathFactory):
    """(fused graph, kernel cache, inputs, a function that verifies a variant of the fused model)."""
    fused = gaf.fuse(torch_style_resnet50())
    cache = KernelCache(tmp_path_factory.mktemp("kernels"))
    feeds = random_inputs(fused.canonical_reference, seed=0)

    def check(model: onnx.ModelProto, tamper: Callable[[dict], dict] | None = None):
        compiled = compile_model(model, cache=cache)
        run = (lambda x: tamper(compiled(x))) if tamper else compiled
        return verify(
            fused.canonical_reference, run, inputs=feeds, noise_model=fused.canonical, runner="runtime"
        )

    return fused, feeds, check


def with_weight(model: onnx.ModelProto, name: str, change: Callable[[np.ndarray], None]) -> onnx.ModelProto:
    wrong = copy.deepcopy(model)
    (tensor,) = [t for t in wrong.graph.initializer if t.name == name]
    value = numpy_helper.to_array(tensor).copy()
    change(value)
    tensor.CopyFrom(numpy_helper.from_array(value, name))
    return wrong


def conv_weights(model: onnx.ModelProto) -> list[str]:
    return [t.name for t in model.graph.initializer if len(t.dims) == 4]


def test_torch_style_resnet50_passes_with_room(resnet) -> None:
    fused, _, check = resnet
    result = check(fused.model)
    (logits,) = result.outputs
    assert result.passed
    assert logits.scale > 10  # the large-logit regime in which the fixed 1e-5 rule failed
    assert logits.worst_ratio < 0.25, result.summary()  # ≥ 4x headroom over today's error
    assert 4e4 < logits.roundings < 7e4  # ΣK along the deepest path: 16 bottlenecks + stem + fc
    assert logits.rtol == pytest.approx(SAFETY * U32 * np.sqrt(logits.roundings))
    assert fused.verify(runner="runtime").passed  # the public surface agrees


@pytest.mark.parametrize("where", [0, 26, -1], ids=["stem", "layer3", "layer4"])
def test_swapped_channels_fail(resnet, where) -> None:
    fused, _, check = resnet
    name = conv_weights(fused.model)[where]

    def swap(w: np.ndarray) -> None:
        w[[0, 1]] = w[[1, 0]]

    result = check(with_weight(fused.model, name, swap))
    assert not result.passed and result.worst.worst_ratio > 50, result.summary()


def test_reduction_one_term_short_fails(resnet) -> None:
    """A conv whose K loop stops one input channel early (its last channel's weights unused)."""
    fused, _, check = resnet
    name = conv_weights(fused.model)[26]

    def drop_last_channel(w: np.ndarray) -> None:
        w[:, -1] = 0.0

    result = check(with_weight(fused.model, name, drop_last_channel))
    assert not result.passed and result.worst.worst_ratio > 10, result.summary()


def test_dropped_bias_fails(resnet) -> None:
    fused, _, check = resnet
    result = check(with_weight(fused.model, "fc.bias", lambda b: b.fill(0.0)))
    assert not result.passed and result.worst.worst_ratio > 10, result.summary()


@pytest.mark.parametrize(
    "tamper",
    [
        lambda v: v.__setitem__((0, 500), v[0, 501]),  # an off-by-one index in one element
        lambda v: v.__setitem__((0, 500), v[0, 500] * 1.001),  # one element off by 1e-3 relative
        lambda v: v.__setitem__((0, 999), np.nan),
    ],
    ids=["neighbour", "relative-1e-3", "nan"],
)
def test_one_wrong_output_element_fails(resnet, tamper) -> None:
    fused, _, check = resnet

    def wrong(outputs: dict) -> dict:
        logits = outputs["logits"].copy()
        tamper(logits)
        return {"logits": logits}

    result = check(fused.model, wrong)
    assert not result.passed and result.worst.worst_ratio > 2, result.summary()


def _single(op: str, x: list[int], w: np.ndarray, out: list[int], **attrs) -> onnx.ModelProto:
    graph = h.make_graph(
        [h.make_node(op, ["x", "w"], ["y"], **attrs)],
        op,
        [h.make_tensor_value_info("x", T.FLOAT, x)],
        [h.make_tensor_value_info("y", T.FLOAT, out)],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize(
    ("op", "x", "w_shape", "out"),
    [("Conv", [1, 16, 8, 8], (8, 16, 3, 3), [1, 8, 6, 6]), ("MatMul", [4, 256], (256, 32), [4, 32])],
)
def test_one_weight_off_by_1e3_relative_fails_where_it_is_above_fp32_noise(
    tmp_path, op, x, w_shape, out
) -> None:
    """A 1e-3 change to one of K weights moves outputs by ~1e-3/sqrt(K) relative: far above the
    noise of one contraction, so it fails. (Deep inside ResNet-50 the same change moves the logits
    by about 1e-6 relative, which a correct fp32 run may differ by: no tolerance can tell.)"""
    w = np.random.default_rng(0).standard_normal(w_shape).astype(np.float32)
    fused = gaf.fuse(_single(op, x, w, out))
    fused.compile(cache_dir=tmp_path)
    feeds = random_inputs(fused.canonical_reference, seed=1)
    assert fused.verify(feeds).passed
    bumped = w.copy()
    bumped.flat[np.argmax(np.abs(bumped))] *= 1.001
    wrong = gaf.fuse(_single(op, x, bumped, out))
    result = verify(
        fused.canonical_reference, wrong, inputs=feeds, noise_model=fused.canonical, runner="runtime"
    )
    assert not result.passed, result.summary()


# -- the rule itself --------------------------------------------------------------------------


def test_noise_charges_each_contraction_its_length() -> None:
    w = np.zeros((8, 16, 3, 3), np.float32)
    conv = _single("Conv", [1, 16, 8, 8], w, [1, 8, 6, 6])
    ((sigma, roundings),) = output_noise(conv).values()
    assert roundings == 16 * 3 * 3 + 1 and sigma == pytest.approx(U32 * np.sqrt(145))
    graph = h.make_graph(
        [
            h.make_node("MatMul", ["a", "w1"], ["p"]),  # K = 64
            h.make_node("MatMul", ["a", "w2"], ["q"]),  # K = 64, another path
            h.make_node("Add", ["p", "q"], ["s"]),  # every op: the largest input's noise
            h.make_node("Mul", ["s", "p"], ["m"]),  # products too (unit error gain)
            h.make_node("Relu", ["m"], ["y"]),  # exact
        ],
        "chain",
        [h.make_tensor_value_info("a", T.FLOAT, [2, 64])],
        [h.make_tensor_value_info("y", T.FLOAT, [2, 8])],
        initializer=[
            numpy_helper.from_array(np.ones((64, 8), np.float32), "w1"),
            numpy_helper.from_array(np.ones((64, 8), np.float32), "w2"),
        ],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    ((_, roundings),) = output_noise(model).values()
    assert roundings == 65 + 1 + 1  # max(p, q) = 64 + 1 (bias-free matmul), + Add, + Mul


def test_noise_uses_the_output_type_roundoff() -> None:
    graph = h.make_graph(
        [h.make_node("Add", ["a", "a"], ["y"])],
        "half",
        [h.make_tensor_value_info("a", T.FLOAT16, [4])],
        [h.make_tensor_value_info("y", T.FLOAT16, [4])],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    assert output_noise(model)["y"] == (2.0**-11, 1.0)


def test_tolerance_is_scale_times_noise_and_exact_at_the_boundary() -> None:
    ref = {"y": np.array([0.0, 3.0, -4.0], np.float32)}  # rms = sqrt(25/3)
    sigma = 1e-6
    tol = SAFETY * sigma * (3.0 + np.sqrt(25 / 3))  # at the element 3.0
    noise = {"y": (sigma, 1.0)}
    ok = compare(ref, {"y": np.array([0.0, 3.0 + 0.9 * tol, -4.0])}, noise=noise, runner="t")
    bad = compare(ref, {"y": np.array([0.0, 3.0 + 1.1 * tol, -4.0])}, noise=noise, runner="t")
    assert ok.passed and ok.outputs[0].worst_ratio == pytest.approx(0.9, rel=1e-6)
    assert not bad.passed and bad.outputs[0].tolerance_at_worst == pytest.approx(tol)


def test_exact_outputs_and_non_finite_values() -> None:
    ints = {"i": np.array([1, 2, 3])}
    assert compare(ints, {"i": np.array([1, 2, 3])}, runner="t").passed
    assert not compare(ints, {"i": np.array([1, 2, 4])}, runner="t").passed
    ref = {"y": np.array([np.inf, np.nan, 1.0], np.float32)}
    assert compare(ref, {"y": np.array([np.inf, np.nan, 1.0], np.float32)}, runner="t").passed
    assert not compare(ref, {"y": np.array([1.0, np.nan, 1.0], np.float32)}, runner="t").passed
    assert not compare(ref, {"y": np.array([np.inf, 0.0, 1.0], np.float32)}, runner="t").passed
    zeros = {"z": np.zeros(3, np.float32)}  # zero scale: only exact zeros pass
    assert compare(zeros, {"z": np.zeros(3, np.float32)}, runner="t").passed


def test_fixed_tolerances_still_available() -> None:
    ref = {"y": np.array([1.0], np.float32)}
    result = compare(ref, {"y": np.array([1.0 + 1.5e-5], np.float32)}, rtol=1e-5, atol=1e-5, runner="t")
    assert result.passed and result.to_dict()["rule"] == "fixed"
    assert not compare(ref, {"y": np.array([1.0 + 3e-5])}, rtol=1e-5, atol=1e-5, runner="t").passed


def test_noise_follows_values_a_branch_reads_from_the_outer_scope() -> None:
    branch = h.make_graph(
        [h.make_node("Neg", ["p"], ["t"])], "then", [], [h.make_tensor_value_info("t", T.FLOAT, [2, 8])]
    )
    graph = h.make_graph(
        [
            h.make_node("MatMul", ["a", "w"], ["p"]),  # K = 64, read only inside the branches
            h.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch),
        ],
        "if",
        [h.make_tensor_value_info("a", T.FLOAT, [2, 64]), h.make_tensor_value_info("c", T.BOOL, [])],
        [h.make_tensor_value_info("y", T.FLOAT, [2, 8])],
        initializer=[numpy_helper.from_array(np.ones((64, 8), np.float32), "w")],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    assert output_noise(model)["y"][1] >= 65


def test_noise_grows_linearly_in_depth_through_attention() -> None:
    """ΣK along the deepest path: twice the layers, about twice the roundings — not the
    exponential growth that charging products their operands' sum gives (Q·Kᵀ·V per layer)."""

    def roundings(layers: int) -> float:
        model = gaf.zoo.build("bert_base", num_layers=layers, hidden=32, heads=2, seq_len=8, vocab=50)
        canonical = gaf.fuse(model, {"max_fusion_size": 0}).canonical
        return max(r for _, r in output_noise(canonical).values())

    six, twelve = roundings(6), roundings(12)
    assert 1.7 < twelve / six < 2.1, (six, twelve)
