"""Template legality after an anchor: views among the epilogue ops and one output Transpose.

`classify` must accept exactly what the anchor generator compiles (the generator's own tests,
tests/graph_autofusion/backend/cpu/codegen/test_anchor_tails.py, compile the accepted shapes), and
refuse the near misses with a sentence naming the node and the reason.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from graphs import Propose, model, node

import graph_autofusion as gaf
from graph_autofusion import FusionConfig
from graph_autofusion.ir import Graph
from graph_autofusion.plan.templates import classify


def _i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def _graph(nodes, inputs, outputs, inits=()) -> Graph:
    return Graph(onnx.shape_inference.infer_shapes(model(nodes, inputs, outputs, inits), strict_mode=True))


def _classify(graph: Graph, names: list[str] | None = None) -> tuple[str | None, str]:
    members = range(len(graph.nodes)) if names is None else [graph.node(n).index for n in names]
    return classify(graph, members)


def _attention_context(perm=(0, 2, 1, 3), outputs=("o",)) -> Graph:
    return _graph(
        [
            node("MatMul", ["p", "v"], ["ctx"], "ctx"),
            node("Transpose", ["ctx"], ["t"], "heads", perm=list(perm)),
            node("Reshape", ["t", "shape"], ["o"], "merge"),
        ],
        [("p", [1, 2, 16, 16]), ("v", [1, 2, 16, 8])],
        list(outputs),
        [("shape", _i64(1, 16, 16))],
    )


# -- accepted ---------------------------------------------------------------------------------


def test_views_between_epilogue_ops_are_accepted() -> None:
    g = _graph(
        [
            node("MatMul", ["x", "w"], ["y"], "mm"),
            node("Add", ["y", "b"], ["z"], "bias"),
            node("Reshape", ["z", "shape"], ["z3"], "view"),
            node("Add", ["z3", "res"], ["o"], "residual"),
        ],
        [("x", [32, 16]), ("res", [2, 16, 8])],
        ["o"],
        [("w", np.ones((16, 8), np.float32)), ("b", np.ones(8, np.float32)), ("shape", _i64(2, 16, 8))],
    )
    assert _classify(g) == ("anchor", "")


def test_gemm_reshape_residual_is_accepted() -> None:
    g = _graph(
        [
            node("Gemm", ["x", "w", "b"], ["y"], "conv1d"),
            node("Reshape", ["y", "shape"], ["y3"], "view"),
            node("Add", ["y3", "res"], ["o"], "residual"),
        ],
        [("x", [16, 8]), ("res", [1, 16, 12])],
        ["o"],
        [("w", np.ones((8, 12), np.float32)), ("b", np.ones(12, np.float32)), ("shape", _i64(1, 16, 12))],
    )
    assert _classify(g) == ("anchor", "")


def test_attention_context_transpose_is_accepted() -> None:
    assert _classify(_attention_context()) == ("anchor", "")


def test_epilogue_before_output_transpose_is_accepted() -> None:
    g = _graph(
        [
            node("MatMul", ["a", "b"], ["y"], "mm"),
            node("Mul", ["y", "s"], ["m"], "scale"),
            node("Transpose", ["m"], ["o"], "t", perm=[1, 0, 2]),
        ],
        [("a", [3, 4, 8]), ("b", [8, 6])],
        ["o", "m"],
        [("s", np.array(0.5, np.float32))],
    )
    assert _classify(g) == ("anchor", "")


def test_view_after_second_anchor_of_a_chain_is_accepted() -> None:
    g = _graph(
        [
            node("MatMul", ["x", "w1"], ["h"], "fc1"),
            node("Relu", ["h"], ["hr"], "act"),
            node("MatMul", ["hr", "w2"], ["y"], "fc2"),
            node("Reshape", ["y", "shape"], ["o"], "view"),
        ],
        [("x", [8, 4])],
        ["o"],
        [("w1", np.ones((4, 6), np.float32)), ("w2", np.ones((6, 5), np.float32)), ("shape", _i64(2, 4, 5))],
    )
    assert _classify(g) == ("anchor_chain", "")


# -- refused, with the reason -----------------------------------------------------------------


def test_transpose_moving_the_last_axis_is_refused() -> None:
    template, why = _classify(_attention_context(perm=(0, 1, 3, 2)))
    assert template is None
    assert why == "Transpose 'heads' moves the last axis of MatMul 'ctx'"


def test_head_split_before_transpose_is_refused() -> None:
    g = _graph(
        [
            node("MatMul", ["x", "w"], ["y"], "q"),
            node("Reshape", ["y", "shape"], ["y4"], "split"),
            node("Transpose", ["y4"], ["o"], "heads", perm=[0, 2, 1, 3]),
        ],
        [("x", [2, 5, 8])],
        ["o"],
        [("w", np.ones((8, 12), np.float32)), ("shape", _i64(2, 5, 3, 4))],
    )
    assert _classify(g) == (None, "Transpose 'heads' does not keep the rows of MatMul 'q' contiguous")


def test_elementwise_after_transpose_is_refused() -> None:
    g = _graph(
        [
            node("MatMul", ["a", "b"], ["y"], "mm"),
            node("Transpose", ["y"], ["t"], "t", perm=[1, 0, 2]),
            node("Relu", ["t"], ["o"], "relu"),
        ],
        [("a", [3, 4, 8]), ("b", [3, 8, 6])],
        ["o"],
    )
    assert _classify(g) == (None, "Relu 'relu' after the output Transpose 't' would need a copy")


def test_two_transposes_are_refused() -> None:
    g = _graph(
        [
            node("MatMul", ["a", "b"], ["y"], "mm"),
            node("Transpose", ["y"], ["t"], "t1", perm=[1, 0, 2]),
            node("Transpose", ["t"], ["o"], "t2", perm=[1, 0, 2]),
        ],
        [("a", [3, 4, 8]), ("b", [3, 8, 6])],
        ["o"],
    )
    assert _classify(g) == (None, "MatMul 'mm' can store through one output Transpose, not 2")


def test_transpose_after_conv_is_refused() -> None:
    g = _graph(
        [
            node("Conv", ["x", "w"], ["y"], "conv", kernel_shape=[1, 1]),
            node("Transpose", ["y"], ["o"], "t", perm=[0, 2, 1, 3]),
        ],
        [("x", [1, 3, 4, 4])],
        ["o"],
        [("w", np.ones((5, 3, 1, 1), np.float32))],
    )
    assert _classify(g) == (None, "Transpose 't' after Conv 'conv' would need a copy")


def test_transpose_after_matmul_of_a_vector_is_refused() -> None:
    g = _graph(
        [
            node("MatMul", ["a", "v"], ["y"], "mv"),
            node("Transpose", ["y"], ["o"], "t", perm=[1, 0]),
        ],
        [("a", [3, 4, 8]), ("v", [8])],
        ["o"],
    )
    template, why = _classify(g)
    assert template is None and why.startswith("Transpose 't'")


def test_two_views_of_the_transposed_output_leaving_are_refused() -> None:
    template, why = _classify(_attention_context(outputs=("t", "o")))
    assert (template, why) == (None, "2 views of the transposed output of 'ctx' leave the kernel, not one")


def test_transpose_after_a_chain_is_refused() -> None:
    g = _graph(
        [
            node("MatMul", ["x", "w1"], ["h"], "fc1"),
            node("MatMul", ["h", "w2"], ["y"], "fc2"),
            node("Transpose", ["y"], ["o"], "t", perm=[0, 1]),
        ],
        [("x", [8, 4])],
        ["o"],
        [("w1", np.ones((4, 6), np.float32)), ("w2", np.ones((6, 5), np.float32))],
    )
    assert _classify(g) == (None, "Transpose 't' cannot run as an epilogue of MatMul")


@pytest.mark.parametrize("op", ["Dropout", "Reshape"])
def test_views_the_generators_do_not_read_stay_refused(op: str) -> None:
    """Dropout after an anchor, and any view after a pooling window, have no generated form."""
    if op == "Dropout":
        nodes = [node("MatMul", ["x", "w"], ["y"], "mm"), node("Dropout", ["y"], ["o"], "drop")]
        inputs, inits = [("x", [4, 8])], [("w", np.ones((8, 6), np.float32))]
        expected = "Dropout 'drop' cannot run as an epilogue of MatMul"
    else:
        nodes = [
            node("MaxPool", ["x"], ["y"], "pool", kernel_shape=[2, 2]),
            node("Reshape", ["y", "shape"], ["o"], "view"),
        ]
        inputs, inits = [("x", [1, 2, 4, 4])], [("shape", _i64(1, 18))]
        expected = "Reshape 'view' cannot run as an epilogue of MaxPool"
    assert _classify(_graph(nodes, inputs, ["o"], inits)) == (None, expected)


# -- through the planner ----------------------------------------------------------------------


def test_refused_tail_is_reported_as_nf006() -> None:
    m = model(
        [
            node("MatMul", ["p", "v"], ["ctx"], "ctx"),
            node("Transpose", ["ctx"], ["t"], "heads", perm=[0, 1, 3, 2]),
            node("Relu", ["t"], ["o"], "relu"),
        ],
        [("p", [1, 2, 16, 16]), ("v", [1, 2, 16, 8])],
        ["o"],
    )
    fused = gaf.fuse(m, FusionConfig(enable_auto_fusion=False), patterns=[Propose(["ctx", "heads"])])
    refused = fused.report()["refused"]
    nf006 = [r for r in refused if r["code"] == "NF006" and r["source"] == "pattern:propose"]
    assert nf006 and "moves the last axis" in nf006[0]["detail"], refused


def test_context_transpose_joins_its_matmul_when_planned() -> None:
    m = model(
        [
            node("MatMul", ["p", "v"], ["ctx"], "ctx"),
            node("Transpose", ["ctx"], ["t"], "heads", perm=[0, 2, 1, 3]),
            node("Reshape", ["t", "shape"], ["r"], "merge"),
            node("MatMul", ["r", "w"], ["o"], "proj"),
        ],
        [("p", [1, 2, 16, 16]), ("v", [1, 2, 16, 8])],
        ["o"],
        [("shape", _i64(1, 16, 16)), ("w", np.ones((16, 16), np.float32))],
    )
    fused = gaf.fuse(m)
    groups = fused.report()["groups"]
    assert fused.get_kernel_count() == 2, groups


# -- Split / Slice windows before a MatMul ------------------------------------------------------


def _split_qk(v_reader: bool = False, *, private: bool = False) -> tuple[str | None, str]:
    """GPT-2's scores: Split(qkv) -> Reshape -> Transpose on Q and K into one MatMul."""
    nodes = [
        node("Split", ["qkv", "sizes"], ["q", "k", "v"], "split", axis=2),
        node("Reshape", ["q", "shape"], ["q4"], "q_heads"),
        node("Transpose", ["q4"], ["qt"], "q_t", perm=[0, 2, 1, 3]),
        node("Reshape", ["k", "shape"], ["k4"], "k_heads"),
        node("Transpose", ["k4"], ["kt"], "k_t", perm=[0, 2, 3, 1]),
        node("MatMul", ["qt", "kt"], ["o"], "scores"),
    ]
    outputs = ["o"]
    if v_reader:
        nodes.append(node("Relu", ["v"], ["vr"], "v_reader"))
        outputs.append("vr")
    g = _graph(
        nodes,
        [("qkv", [1, 8, 3 * 12])],
        outputs,
        [("sizes", _i64(12, 12, 12)), ("shape", _i64(1, 8, 2, 6))],
    )
    members = [g.node(n).index for n in ("split", "q_heads", "q_t", "k_heads", "k_t", "scores")]
    return classify(g, members, private=[g.node("split").index] if private else [])


def test_split_feeding_both_matmul_operands_is_accepted() -> None:
    assert _split_qk() == ("anchor", "")


def test_split_output_read_by_another_kernel_is_refused() -> None:
    assert _split_qk(v_reader=True) == (
        None,
        "Split 'split' output 'v' is read outside the chains into MatMul 'scores'",
    )


def test_split_recomputed_here_may_feed_other_kernels() -> None:
    assert _split_qk(v_reader=True, private=True) == ("anchor", "")


def _slice_matmul(starts, ends, steps=None, then_reshape: bool = False, const: bool = True) -> Graph:
    names = ["x", "starts", "ends", "axes"] + (["steps"] if steps is not None else [])
    nodes = [node("Slice", names, ["xs"], "window")]
    left = "xs"
    if then_reshape:
        nodes.append(node("Reshape", ["xs", "flat"], ["xf"], "flatten_rows"))
        left = "xf"
    nodes.append(node("MatMul", [left, "w"], ["o"], "mm"))
    inits = [
        ("ends", _i64(*ends)),
        ("axes", _i64(2)),
        ("flat", _i64(2, 64)),
        ("w", np.ones((8, 4), np.float32)),
    ]
    inputs = [("x", [2, 8, 16])]
    if then_reshape:
        inits[-1] = ("w", np.ones((64, 4), np.float32))
    if const:
        inits.append(("starts", _i64(*starts)))
    else:
        inputs.append(("starts", [1]))
    if steps is not None:
        inits.append(("steps", _i64(*steps)))
    graph = model(nodes, inputs, ["o"], inits)
    if not const:
        graph.graph.input[1].type.tensor_type.elem_type = onnx.TensorProto.INT64
    return Graph(onnx.shape_inference.infer_shapes(graph))


def test_step1_slice_before_matmul_is_accepted() -> None:
    assert _classify(_slice_matmul([8], [16])) == ("anchor", "")


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"steps": [2]}, "Slice 'window' is not a constant step-1 window"),
        ({"const": False}, "Slice 'window' input 1 ('starts') is not a constant"),
        ({"then_reshape": True}, "the layout change feeding MatMul 'mm' is not a stride change"),
    ],
)
def test_slice_windows_codegen_cannot_read_are_refused(kwargs: dict, why: str) -> None:
    starts, ends = ([0], [16]) if "steps" in kwargs else ([0], [8])
    assert _classify(_slice_matmul(starts, ends, **kwargs)) == (None, why)


def test_split_with_one_read_output_joins_its_matmul_when_planned() -> None:
    """A Split whose only read output feeds a MatMul costs no kernel of its own, and the fused
    model still computes what onnxruntime computes."""
    m = model(
        [
            node("Split", ["x", "sizes"], ["a", "b"], "split", axis=1),
            node("MatMul", ["b", "w"], ["o"], "mm"),
        ],
        [("x", [6, 20])],
        ["o"],
        [("sizes", _i64(4, 16)), ("w", np.ones((16, 5), np.float32) * 0.5)],
    )
    fused = gaf.fuse(m)
    assert fused.get_kernel_count() == 1, fused.report()["groups"]
    assert fused.verify(raise_on_failure=True).passed


# -- row reductions ---------------------------------------------------------------------------


def _softmax_over_axis1() -> onnx.ModelProto:
    """SoftmaxCrossEntropy's expansion: move the class axis last, LogSoftmax, move it back."""
    return model(
        [
            node("Transpose", ["x"], ["t"], "to_last", perm=[0, 2, 1]),
            node("LogSoftmax", ["t"], ["s"], "log_softmax", axis=2),
            node("Transpose", ["s"], ["o"], "back", perm=[0, 2, 1]),
        ],
        [("x", [3, 5, 12])],
        ["o"],
    )


def test_transpose_after_a_reduction_is_refused() -> None:
    """A row kernel holds one row: an epilogue that moves elements across rows is a misfit."""
    g = Graph(onnx.shape_inference.infer_shapes(_softmax_over_axis1()))
    assert _classify(g) == (None, "Transpose 'back' reorders a reduction's results across rows")
    assert _classify(g, ["to_last", "log_softmax"]) == ("reduction", "")


def test_softmax_over_a_middle_axis_through_transposes_matches_onnxruntime() -> None:
    """As SoftmaxCrossEntropyLoss expands for N x C x d1 x d2 (it fused into one wrong kernel)."""
    m = model(
        [
            node("Reshape", ["x", "rows"], ["r"], "flatten"),
            node("Transpose", ["r"], ["t"], "to_last", perm=[0, 2, 1]),
            node("LogSoftmax", ["t"], ["s"], "log_softmax", axis=2),
            node("Transpose", ["s"], ["b"], "back", perm=[0, 2, 1]),
            node("Reshape", ["b", "full"], ["o"], "unflatten"),
        ],
        [("x", [3, 5, 6, 6, 5])],
        ["o"],
        [("rows", _i64(0, 0, -1)), ("full", _i64(3, 5, 6, 6, 5))],
    )
    fused = gaf.fuse(m)
    assert fused.verify(raise_on_failure=True).passed
