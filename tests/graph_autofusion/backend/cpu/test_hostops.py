"""Host ops: control flow whose bodies read outer-scope values runs correctly, and every host op
is reported with a stable reason code.

Each model computes a value `y` in the main graph (a compiled kernel) that an If/Loop/Scan body
reads by name only; the fused model runs through the generated kernels and must match
onnxruntime exactly (the host op is onnx.reference, the kernels around it are elementwise).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import graph_autofusion as gaf
from graph_autofusion.backend.cpu.hostops import HOST_REASONS
from graph_autofusion.verify import run_onnxruntime

F = T.FLOAT


def _model(
    nodes: list[onnx.NodeProto], inputs: dict[str, tuple[int, list[int]]], out: list[int]
) -> onnx.ModelProto:
    graph = h.make_graph(
        nodes,
        "cf",
        [h.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()],
        [h.make_tensor_value_info("out", F, out)],
        initializer=[h.make_tensor("w", F, [2, 3], np.linspace(-1, 1, 6).tolist())],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def if_model() -> onnx.ModelProto:
    then_g = h.make_graph(
        [h.make_node("Add", ["y", "w"], ["t"])], "then", [], [h.make_tensor_value_info("t", F, [2, 3])]
    )
    else_g = h.make_graph(
        [h.make_node("Mul", ["y", "x"], ["e"])], "else", [], [h.make_tensor_value_info("e", F, [2, 3])]
    )
    nodes = [  # Relu→Exp would fuse and keep y inside the kernel if the planner missed the If's read
        h.make_node("Relu", ["x"], ["y"]),
        h.make_node("Exp", ["y"], ["y2"]),
        h.make_node("If", ["c"], ["z"], then_branch=then_g, else_branch=else_g),
        h.make_node("Add", ["z", "y2"], ["s"]),
        h.make_node("Sigmoid", ["s"], ["out"]),
    ]
    return _model(nodes, {"x": (F, [2, 3]), "c": (T.BOOL, [])}, [2, 3])


def loop_model() -> onnx.ModelProto:
    """acc ← acc·0.5 + y, three times; the body reads y from the outer scope, and an If nested
    in the body reads the body's own value as well as the outer `w`."""
    inner_then = h.make_graph(
        [h.make_node("Add", ["a2", "w"], ["it"])], "it", [], [h.make_tensor_value_info("it", F, [2, 3])]
    )
    inner_else = h.make_graph(
        [h.make_node("Sub", ["a2", "w"], ["ie"])], "ie", [], [h.make_tensor_value_info("ie", F, [2, 3])]
    )
    body = h.make_graph(
        [
            h.make_node("Constant", [], ["half"], value=h.make_tensor("hv", F, [], [0.5])),
            h.make_node("Mul", ["acc_in", "half"], ["a1"]),
            h.make_node("Add", ["a1", "y"], ["a2"]),
            h.make_node("Greater", ["i", "one"], ["big"]),
            h.make_node("If", ["big"], ["acc_out"], then_branch=inner_then, else_branch=inner_else),
            h.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [
            h.make_tensor_value_info("i", T.INT64, []),
            h.make_tensor_value_info("cond_in", T.BOOL, []),
            h.make_tensor_value_info("acc_in", F, [2, 3]),
        ],
        [h.make_tensor_value_info("cond_out", T.BOOL, []), h.make_tensor_value_info("acc_out", F, [2, 3])],
        initializer=[h.make_tensor("one", T.INT64, [], [1])],
    )
    nodes = [
        h.make_node("Constant", [], ["trip"], value=h.make_tensor("tv", T.INT64, [], [3])),
        h.make_node("Constant", [], ["go"], value=h.make_tensor("gv", T.BOOL, [], [True])),
        h.make_node("Tanh", ["x"], ["y"]),
        h.make_node("Loop", ["trip", "go", "x"], ["acc"], body=body),
        h.make_node("Abs", ["acc"], ["out"]),
    ]
    return _model(nodes, {"x": (F, [2, 3])}, [2, 3])


def scan_model() -> onnx.ModelProto:
    """A running sum over the rows of x, each row scaled by the outer-scope y."""
    body = h.make_graph(
        [
            h.make_node("Mul", ["row", "y"], ["scaled"]),
            h.make_node("Add", ["s_in", "scaled"], ["s_out"]),
            h.make_node("Identity", ["s_out"], ["emit"]),
        ],
        "body",
        [h.make_tensor_value_info("s_in", F, [3]), h.make_tensor_value_info("row", F, [3])],
        [h.make_tensor_value_info("s_out", F, [3]), h.make_tensor_value_info("emit", F, [3])],
    )
    nodes = [
        h.make_node("Exp", ["v"], ["y"]),
        h.make_node("Scan", ["s0", "x"], ["final", "rows"], body=body, num_scan_inputs=1),
        h.make_node("Neg", ["rows"], ["out"]),
    ]
    return _model(nodes, {"x": (F, [4, 3]), "v": (F, [3]), "s0": (F, [3])}, [4, 3])


@pytest.mark.parametrize("build", [if_model, loop_model, scan_model], ids=["if", "loop", "scan"])
def test_control_flow_reading_outer_scope_runs_and_verifies(build, tmp_path) -> None:
    model = build()
    fused = gaf.fuse(model)
    fused.compile(cache_dir=tmp_path)
    rng = np.random.default_rng(1)
    feeds_list = []
    for cond in (True, False):
        feeds = {}
        for vi in model.graph.input:
            shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
            if vi.type.tensor_type.elem_type == T.BOOL:
                feeds[vi.name] = np.array(cond)
            else:
                feeds[vi.name] = rng.standard_normal(shape).astype(np.float32)
        feeds_list.append(feeds)
    for feeds in feeds_list:
        expected = run_onnxruntime(model, feeds)["out"]
        np.testing.assert_allclose(fused(feeds)["out"], expected, rtol=1e-6, atol=1e-7)
        assert fused.verify(feeds).passed
        assert fused.verify(feeds, runner="onnxruntime").passed  # the fused ONNX is valid as well
    onnx.checker.check_model(fused.model, full_check=True)
    (host,) = fused.report()["host_ops"]
    assert host["code"] == "control_flow" and host["op_type"] in ("If", "Loop", "Scan")


def test_every_host_reason_code_is_documented() -> None:
    readme = (__import__("pathlib").Path(__file__).parents[4] / "README.md").read_text()
    for code in HOST_REASONS:
        assert f"`{code}`" in readme, code


def topk_model() -> onnx.ModelProto:
    nodes = [h.make_node("TopK", ["x", "k"], ["v", "i"], axis=-1), h.make_node("Relu", ["v"], ["out"])]
    graph = h.make_graph(
        nodes,
        "topk",
        [h.make_tensor_value_info("x", F, [3, 8])],
        [h.make_tensor_value_info("out", F, [3, 3]), h.make_tensor_value_info("i", T.INT64, [3, 3])],
        initializer=[h.make_tensor("k", T.INT64, [1], [3])],
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def test_report_lists_host_ops_before_compiling_and_compile_agrees(tmp_path) -> None:
    fused = gaf.fuse(topk_model())
    (host,) = fused.report()["host_ops"]
    assert host == {
        "node": host["node"],
        "op_type": "TopK",
        "code": "no_generator",
        "reason": "TopK has no code generator",
    }
    fused.compile(cache_dir=tmp_path)
    assert fused.report()["host_ops"] == [host]
    assert fused.verify().passed


def test_declined_kernel_is_a_listed_host_op() -> None:
    """Pad mode=wrap: the op has a generator, which declines this variant at fuse time."""
    graph = h.make_graph(
        [h.make_node("Pad", ["x", "pads"], ["out"], mode="wrap")],
        "pad",
        [h.make_tensor_value_info("x", F, [3, 4])],
        [h.make_tensor_value_info("out", F, [3, 7])],
        initializer=[h.make_tensor("pads", T.INT64, [4], [0, 1, 0, 2])],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 19)], ir_version=9)
    (host,) = gaf.fuse(model).report()["host_ops"]
    assert host["code"] == "codegen_unsupported" and "wrap" in host["reason"]
    with pytest.raises(gaf.FusionError) as info:
        gaf.fuse(model, {"allow_host_ops": False})
    assert info.value.code == "host_op_refused"


@pytest.mark.parametrize("build", [if_model, topk_model], ids=["if", "topk"])
def test_allow_host_ops_false_refuses_each_fallback_by_name(build) -> None:
    with pytest.raises(gaf.FusionError) as info:
        gaf.fuse(build(), {"allow_host_ops": False})
    err = info.value
    assert err.code == "host_op_refused" and err.status == 422
    (listed,) = err.details["host_ops"]
    assert listed["code"] in HOST_REASONS
    assert f"{listed['op_type']} {listed['node']!r} [{listed['code']}]" in err.message


def test_model_without_fallbacks_passes_the_strict_config() -> None:
    fused = gaf.fuse(gaf.zoo.build("mlp", in_features=16, hidden=(8,)), {"allow_host_ops": False})
    assert fused.report()["host_ops"] == []


def test_host_op_failures_are_errors_with_the_node_named() -> None:
    from graph_autofusion.backend.cpu.hostops import HostOp
    from graph_autofusion.backend.cpu.kernel_spec import TensorInfo
    from graph_autofusion.errors import RuntimeInputError, UnsupportedModelError

    model = h.make_model(
        h.make_graph([], "g", [], []),
        opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)],
    )
    tensors = {n: TensorInfo(n, s, F) for n, s in {"a": (2, 3), "b": (4, 5), "c": (2, 5)}.items()}
    op = HostOp(h.make_node("MatMul", ["a", "b"], ["c"], name="mm"), tensors, model)
    with pytest.raises(RuntimeInputError) as failed:
        op([np.ones((2, 3), np.float32), np.ones((4, 5), np.float32)])
    assert failed.value.code == "host_op_failed" and "'mm'" in failed.value.message
    unknown = h.make_node("FusedGemm", ["a", "b"], ["c"], name="fg", domain="com.microsoft")
    with pytest.raises(UnsupportedModelError) as refused:
        HostOp(unknown, tensors, model)
    assert refused.value.code == "unsupported_host_op" and "'fg'" in refused.value.message
