"""normalize_opset: old-opset forms of an op compute what onnxruntime computes, fused and compiled.

Each model is built at an old opset (the attribute form, or the pre-13 Softmax semantics) and at a
new one, then goes the user's way: `graph_autofusion.fuse(model)` and the compiled runtime
(`fused(inputs)`), compared with onnxruntime running the *original* model at rtol 1e-5 /
atol 1e-6. A Relu before and a Mul after each op give the planner something to fuse it with.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from canon_helpers import build_model, run_ort, tensor
from onnx import TensorProto, helper

import graph_autofusion as gaf
from graph_autofusion.canonicalize.normalize_opset import TARGET_OPSET
from graph_autofusion.onnx_utils import default_opset

RTOL, ATOL = 1e-5, 1e-6
X_SHAPE = [2, 3, 4]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One kernel cache directory for the module (identical kernels compile once)."""
    return tmp_path_factory.mktemp("kernels")


def _i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def _around(op: onnx.NodeProto, opset: int, inits: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    """x → Relu → `op` (reads "r", writes "s") → Mul by itself → y."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), op, helper.make_node("Mul", ["s", "s"], ["y"])]
    model = build_model(
        nodes, [tensor("x", X_SHAPE)], [helper.make_empty_tensor_value_info("y")], inits, opset
    )
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    (y,) = [vi for vi in inferred.graph.value_info if vi.name == "y"]
    model.graph.output[0].CopyFrom(y)
    return model


def _check(model: onnx.ModelProto, cache: Path, seed: int = 0) -> Any:
    """Fuse, compile and run `model`; compare with onnxruntime; return the compiled model."""
    x = np.random.default_rng(seed).standard_normal(X_SHAPE).astype(np.float32)
    (want,) = run_ort(model, {"x": x})
    fused = gaf.fuse(model)
    compiled = fused.compile(cache_dir=cache, threads=1)
    got = fused({"x": x})["y"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    assert default_opset(fused.canonical) == max(TARGET_OPSET, default_opset(model) or 0)
    return compiled


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("opset", [11, 12, 13])
@pytest.mark.parametrize("axis", [None, 0, 1, 2, -1])
def test_softmax_family_at_every_opset_and_axis(cache, op: str, opset: int, axis: int | None) -> None:
    """Before 13 the op normalizes the whole block from `axis` on (default 1); it was off by ~2.7."""
    attrs = {} if axis is None else {"axis": axis}
    compiled = _check(_around(helper.make_node(op, ["r"], ["s"], **attrs), opset), cache)
    if op != "Hardmax":  # Hardmax has no generator: it stays a (correct) host op
        assert compiled.stats["host_ops"] == []


def _reduce_mean(opset: int) -> onnx.ModelProto:
    if opset < 18:
        return _around(helper.make_node("ReduceMean", ["r"], ["s"], axes=[1], keepdims=0), opset)
    return _around(helper.make_node("ReduceMean", ["r", "ax"], ["s"], keepdims=0), opset, {"ax": _i64(1)})


def _reduce_sum(opset: int) -> onnx.ModelProto:
    if opset < 13:
        return _around(helper.make_node("ReduceSum", ["r"], ["s"], axes=[-1]), opset)
    return _around(helper.make_node("ReduceSum", ["r", "ax"], ["s"]), opset, {"ax": _i64(-1)})


def _split(opset: int) -> onnx.ModelProto:
    if opset < 13:
        op = helper.make_node("Split", ["r"], ["s", "rest"], axis=2, split=[1, 3])
        return _around(op, opset)
    return _around(helper.make_node("Split", ["r", "sz"], ["s", "rest"], axis=2), opset, {"sz": _i64(1, 3)})


def _clip(opset: int) -> onnx.ModelProto:
    if opset < 11:
        return _around(helper.make_node("Clip", ["r"], ["s"], min=0.25, max=0.75), opset)
    bounds = {"lo": np.array(0.25, np.float32), "hi": np.array(0.75, np.float32)}
    return _around(helper.make_node("Clip", ["r", "lo", "hi"], ["s"]), opset, bounds)


def _pad(opset: int) -> onnx.ModelProto:
    pads = [0, 1, 0, 0, 2, 1]
    if opset < 11:
        return _around(helper.make_node("Pad", ["r"], ["s"], pads=pads, value=0.5), opset)
    inits = {"p": _i64(*pads), "v": np.array(0.5, np.float32)}
    return _around(helper.make_node("Pad", ["r", "p", "v"], ["s"]), opset, inits)


def _unsqueeze(opset: int) -> onnx.ModelProto:
    if opset < 13:
        return _around(helper.make_node("Unsqueeze", ["r"], ["s"], axes=[0, 3]), opset)
    return _around(helper.make_node("Unsqueeze", ["r", "ax"], ["s"]), opset, {"ax": _i64(0, 3)})


def _slice(opset: int) -> onnx.ModelProto:
    if opset < 10:
        return _around(
            helper.make_node("Slice", ["r"], ["s"], starts=[1, 0], ends=[3, 3], axes=[1, 2]), opset
        )
    inits = {"st": _i64(1, 0), "en": _i64(3, 3), "ax": _i64(1, 2)}
    return _around(helper.make_node("Slice", ["r", "st", "en", "ax"], ["s"]), opset, inits)


def _upsample(opset: int) -> onnx.ModelProto:
    scales = np.array([1, 1, 2], np.float32)
    if opset < 10:
        return _around(
            helper.make_node("Upsample", ["r", "sc"], ["s"], mode="nearest"), opset, {"sc": scales}
        )
    return _around(helper.make_node("Resize", ["r", "", "sc"], ["s"], mode="nearest"), opset, {"sc": scales})


FORMS: dict[str, tuple[Callable[[int], onnx.ModelProto], tuple[int, ...]]] = {
    "ReduceMean": (_reduce_mean, (11, 13, 17, 18)),
    "ReduceSum": (_reduce_sum, (11, 13)),
    "Split": (_split, (11, 13, 18)),
    "Clip": (_clip, (7, 10, 11, 13)),  # onnxruntime has no Mul-6 for the reference
    "Pad": (_pad, (10, 11, 18)),
    "Unsqueeze": (_unsqueeze, (11, 13)),
    "Slice": (_slice, (9, 10, 13)),
    "Upsample/Resize": (_upsample, (9, 13)),
}


@pytest.mark.parametrize(
    ("form", "opset"), [(name, opset) for name, (_, opsets) in FORMS.items() for opset in opsets]
)
def test_attribute_and_input_forms_agree_with_onnxruntime(cache, form: str, opset: int) -> None:
    build, _ = FORMS[form]
    _check(build(opset), cache)


@pytest.mark.parametrize("opset", [11, 17])
def test_old_models_reach_the_target_opset_in_the_input_forms(opset: int) -> None:
    """Downstream sees one form: axes as inputs, no attribute spelling left."""
    fused = gaf.fuse(_reduce_mean(opset))
    assert fused.report()["canonicalize"]["normalize_opset"] >= 1
    for node in fused.canonical.graph.node:
        assert "axes" not in {a.name for a in node.attribute}, node


def test_new_models_are_left_alone() -> None:
    fused = gaf.fuse(_reduce_mean(18))
    assert fused.report()["canonicalize"]["normalize_opset"] == 0


def test_control_flow_keeps_its_opset_and_only_the_softmax_family_is_rewritten(cache) -> None:
    """The converter is not trusted through subgraphs (Scan 8 → 9 changes meaning): the model keeps
    opset 11 and its Softmax becomes Flatten → Softmax(axis=-1) → Reshape, still exact."""
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    two = helper.make_tensor("two", TensorProto.FLOAT, [1], [2.0])
    then = helper.make_graph(
        [helper.make_node("Constant", [], ["o"], value=one)], "then", [], [tensor("o", [1])]
    )
    orelse = helper.make_graph(
        [helper.make_node("Constant", [], ["o"], value=two)], "else", [], [tensor("o", [1])]
    )
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Softmax", ["r"], ["s"]),  # opset 11 default axis 1: over 3 x 4 blocks
        helper.make_node("If", ["c"], ["k"], then_branch=then, else_branch=orelse),
        helper.make_node("Mul", ["s", "k"], ["y"]),
    ]
    inputs = [tensor("x", X_SHAPE), tensor("c", [], TensorProto.BOOL)]
    model = build_model(nodes, inputs, [tensor("y", X_SHAPE)], opset=11)
    x = np.random.default_rng(1).standard_normal(X_SHAPE).astype(np.float32)
    feeds = {"x": x, "c": np.array(False)}
    (want,) = run_ort(model, feeds)
    fused = gaf.fuse(model)
    assert default_opset(fused.canonical) == 11
    rewritten = [n.op_type for n in fused.canonical.graph.node if n.op_type in ("Flatten", "Softmax")]
    assert rewritten == ["Flatten", "Softmax"]
    compiled = fused.compile(cache_dir=cache, threads=1)
    np.testing.assert_allclose(fused(feeds)["y"], want, rtol=RTOL, atol=ATOL)
    assert [h["op_type"] for h in compiled.stats["host_ops"]] == ["If"]  # the Softmax compiled


def test_per_position_batchnorm_becomes_elementwise_and_the_model_reaches_the_target(cache) -> None:
    """BatchNormalization-7 with spatial=0 (statistics per position): the converter has no adapter
    for it, onnx.reference ignores `spatial`, the generator reads per-channel statistics; its
    formula in elementwise ops is exact, compiles, and lets the rest of the model convert."""
    rng = np.random.default_rng(0)
    stats = {k: rng.uniform(0.5, 1.5, (2, 3, 4)).astype(np.float32) for k in ("g", "b", "m", "v")}
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("BatchNormalization", ["r", "g", "b", "m", "v"], ["s"], spatial=0, epsilon=0.25),
        helper.make_node("Mul", ["s", "s"], ["y"]),
    ]
    model = build_model(nodes, [tensor("x", [1, 2, 3, 4])], [tensor("y", [1, 2, 3, 4])], stats, opset=7)
    x = rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
    (want,) = run_ort(model, {"x": x})
    fused = gaf.fuse(model)
    assert default_opset(fused.canonical) == TARGET_OPSET
    assert "BatchNormalization" not in {n.op_type for n in fused.canonical.graph.node}
    compiled = fused.compile(cache_dir=cache, threads=1)
    np.testing.assert_allclose(fused({"x": x})["y"], want, rtol=RTOL, atol=ATOL)
    assert compiled.stats["host_ops"] == []
