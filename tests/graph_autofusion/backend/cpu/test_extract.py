"""Execution plans: views, kernels from fused functions, single ops, host ops and kernel dedupe."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from cpu_backend_helpers import FUSED_DOMAIN, fuse_all, make_model
from onnx import helper

from graph_autofusion.backend.cpu.extract import HostStep, KernelStep, ViewStep, extract, spec_digest
from graph_autofusion.errors import UnsupportedModelError


def test_views_alias_and_ops_become_single_kernels() -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Reshape", ["r", "shape"], ["v"]),
        helper.make_node("Softmax", ["v"], ["s"], axis=-1),
        helper.make_node("MaxPool", ["p"], ["q"], kernel_shape=[2, 2]),
    ]
    model = make_model(nodes, {"x": [2, 6], "p": [1, 1, 4, 4]}, ["s", "q"], {"shape": np.array([3, 4])})
    plan = extract(model)
    kinds = [type(s).__name__ for s in plan.steps]
    assert kinds == ["KernelStep", "ViewStep", "KernelStep", "KernelStep"]
    view = plan.steps[1]
    assert isinstance(view, ViewStep) and (view.input, view.output) == ("r", "v")
    templates = [plan.specs[s.symbol].template for s in plan.steps if isinstance(s, KernelStep)]
    assert templates == ["pointwise", "reduction", "pool"]
    assert [t.name for t in plan.inputs] == ["x", "p"] and [t.name for t in plan.outputs] == ["s", "q"]


def test_fused_node_takes_template_members_and_body_constants() -> None:
    nodes = [
        helper.make_node("Constant", [], ["k"], value_float=2.0),
        helper.make_node("Add", ["x", "b"], ["a"]),
        helper.make_node("Mul", ["a", "k"], ["y"]),
    ]
    model = fuse_all(
        make_model(nodes, {"x": [2, 3]}, ["y"], {"b": np.ones(3, np.float32)}), "pointwise", "chain"
    )
    fn = model.functions[0]
    plan = extract(model)
    (step,) = plan.steps
    assert isinstance(step, KernelStep)
    spec = plan.specs[step.symbol]
    assert (spec.template, spec.pattern) == ("pointwise", "chain")
    assert [n.op_type for n in spec.nodes] == ["Add", "Mul"]  # Constant folded into spec.constants
    assert float(spec.constants["k"]) == 2.0
    assert "b" in spec.constants  # small initializer inputs are known values too
    assert spec.members == tuple(json.loads(fn.doc_string)["members"])


def test_identical_kernels_share_one_symbol() -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("Relu", ["b"], ["c"]),
        helper.make_node("Sigmoid", ["c"], ["d"]),
        helper.make_node("Relu", ["y"], ["e"]),  # another shape: another kernel
    ]
    plan = extract(make_model(nodes, {"x": [4, 4], "y": [3]}, ["d", "e"]))
    symbols = [s.symbol for s in plan.steps if isinstance(s, KernelStep)]
    assert symbols[0] == symbols[1] == symbols[2]
    assert len(set(symbols)) == 3 and len(plan.specs) == 3


def test_two_calls_of_one_function_share_a_kernel() -> None:
    nodes = [helper.make_node("Exp", ["x"], ["y"])]
    model = fuse_all(make_model(nodes, {"x": [5]}, ["y"]), "pointwise")
    call2 = helper.make_node("fused_0", ["y"], ["z"], domain=FUSED_DOMAIN, name="again")
    model.graph.node.append(call2)
    model.graph.output.append(helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [5]))
    plan = extract(model)
    a, b = plan.steps
    assert isinstance(a, KernelStep) and isinstance(b, KernelStep) and a.symbol == b.symbol


def test_digest_depends_on_attributes_and_constants() -> None:
    def spec(alpha: float, k: float):
        nodes = [
            helper.make_node("LeakyRelu", ["x"], ["a"], alpha=alpha),
            helper.make_node("Mul", ["a", "k"], ["y"]),
        ]
        model = make_model(nodes, {"x": [3]}, ["y"], {"k": np.float32(k)})
        return [plan_spec for plan_spec in extract(model).specs.values()]

    assert spec_digest(spec(0.1, 2.0)[0]) != spec_digest(spec(0.2, 2.0)[0])
    assert spec_digest(spec(0.1, 2.0)[1]) != spec_digest(spec(0.1, 3.0)[1])


def test_opaque_op_is_a_host_step() -> None:
    nodes = [helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=-1)]
    plan = extract(make_model(nodes, {"x": [3, 8]}, ["v", "i"], {"k": np.array([2], dtype=np.int64)}))
    (step,) = plan.steps
    assert isinstance(step, HostStep) and "TopK" in step.reason


def test_dynamic_shape_is_a_clear_error() -> None:
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 4])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]))
    with pytest.raises(UnsupportedModelError) as info:
        extract(model)
    assert info.value.code == "dynamic_shape"
