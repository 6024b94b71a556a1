"""The plan walk both runtimes share: kernels not built become host ops saying why, and the
stats every report carries count what runs where."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from graph_autofusion.backend.cpu.extract import HostStep, KernelStep, ViewStep, extract
from graph_autofusion.backend.steps import NOT_BUILT, PlannedModel, plan_stats, resolve_steps
from graph_autofusion.errors import RuntimeInputError


def _plan():  # type: ignore[no-untyped-def]
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Reshape", ["r", "shape"], ["v"]),
        helper.make_node("Softmax", ["v"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", T.FLOAT, [4, 6])],
        [helper.make_tensor_value_info("y", T.FLOAT, None)],
        [onnx.numpy_helper.from_array(np.array([6, 4], np.int64), "shape")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    return extract(onnx.shape_inference.infer_shapes(model))  # unfused: one kernel per op


def test_kernels_not_built_run_as_host_ops_with_the_reason() -> None:
    plan = _plan()
    symbols = [s.symbol for s in plan.steps if isinstance(s, KernelStep)]
    assert len(symbols) >= 2, plan.steps
    steps = resolve_steps(plan, built={symbols[0]}, declined={symbols[1]: "no rule for it"})
    kinds = [type(s) for s in steps]
    assert kinds.count(KernelStep) == 1 and len(steps) == len(plan.steps)
    hosts = [s for s in steps if isinstance(s, HostStep)]
    assert hosts[0].code == "codegen_unsupported"
    assert hosts[0].reason == "no code generated: no rule for it"
    assert all(h.reason == f"no code generated: {NOT_BUILT}" for h in hosts[1:])


def test_stats_count_kernels_host_ops_and_views() -> None:
    plan = _plan()
    symbols = [s.symbol for s in plan.steps if isinstance(s, KernelStep)]
    steps = resolve_steps(plan, built=set(symbols[:1]), declined={})
    stats = plan_stats(plan, steps, lambda s: plan.specs[s].template, lambda step: {"extra": step.symbol})
    assert stats["kernels"] == 1 and stats["unique_kernels"] == 1
    assert len(stats["host_ops"]) == len(symbols) - 1
    assert stats["views"] == sum(1 for s in steps if isinstance(s, ViewStep))
    entry = stats["per_kernel"][0]
    assert entry["symbol"] == entry["extra"] == symbols[0]
    assert entry["template"] == plan.specs[symbols[0]].template
    assert entry["ops"] == len(plan.specs[symbols[0]].nodes)


def test_planned_model_names_and_checked_inputs() -> None:
    class Echo(PlannedModel):
        def __init__(self, plan) -> None:  # type: ignore[no-untyped-def]
            self.plan = plan

        def run(self, inputs):  # type: ignore[no-untyped-def]
            from graph_autofusion.backend.steps import check_inputs

            return check_inputs(self.plan.inputs, inputs)

    model = Echo(_plan())
    assert model.input_names == ["x"] and model.output_names == ["y"]
    x = np.zeros((4, 6), np.float32)
    assert model(x)["x"] is x
    with pytest.raises(RuntimeInputError) as err:
        model({"x": x, "z": x})
    assert err.value.code == "unknown_input"
