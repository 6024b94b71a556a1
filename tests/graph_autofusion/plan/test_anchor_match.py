"""The anchor match: what an anchor kernel is, decided once; the planner accepts a group as an
`anchor` exactly when the match succeeds, and the exporter records the match in the fused model."""

from __future__ import annotations

import json

import numpy as np
import onnx
from graphs import model, node

import graph_autofusion as gaf
from graph_autofusion.backend.cpu.extract import extract
from graph_autofusion.ir import Graph
from graph_autofusion.plan.anchor_match import AnchorMatch, match_anchor, match_chain
from graph_autofusion.plan.reduction_match import group_spec
from graph_autofusion.plan.templates import classify


def _graph(m: onnx.ModelProto) -> Graph:
    return Graph(onnx.shape_inference.infer_shapes(m))


def _attention_context(b: int = 2, h: int = 3, s: int = 8, d: int = 4) -> onnx.ModelProto:
    """Heads split from a fused QKV row by Split -> Reshape -> Transpose, P @ V, and the context
    stored back as [B, S, H*D] through Transpose(0,2,1,3) -> Reshape, then scaled."""
    hd = h * d
    return model(
        [
            node("Split", ["qkv", "sizes"], ["q", "k", "v"], "split", axis=2),
            node("Reshape", ["v", "heads"], ["v4"], "split_heads"),
            node("Transpose", ["v4"], ["vt"], "to_bhsd", perm=[0, 2, 1, 3]),
            node("MatMul", ["p", "vt"], ["ctx"], "pv"),
            node("Mul", ["ctx", "scale"], ["cs"], "scale"),
            node("Transpose", ["cs"], ["ct"], "to_bshd", perm=[0, 2, 1, 3]),
            node("Reshape", ["ct", "merged"], ["o"], "merge_heads"),
        ],
        [("qkv", [b, s, 3 * hd]), ("p", [b, h, s, s])],
        ["o", "q", "k"],
        [
            ("sizes", np.array([hd, hd, hd], np.int64)),
            ("heads", np.array([b, s, h, d], np.int64)),
            ("scale", np.array(0.5, np.float32)),
            ("merged", np.array([b, s, hd], np.int64)),
        ],
    )


def _match(m: onnx.ModelProto, members: list[int]) -> AnchorMatch:
    return match_anchor(group_spec(_graph(m), members))


def test_prologue_views_epilogue_and_tail_in_one_match() -> None:
    b, h, s, d = 2, 3, 8, 4
    hd = h * d
    match = _match(_attention_context(b, h, s, d), [1, 2, 3, 4, 5, 6])
    assert match.anchor.name == "pv"
    v = match.operands[1]
    assert v.tensor == "v" and v.through == ("split_heads", "to_bhsd")
    assert v.shape == (b, h, s, d) and v.strides == (s * hd, d, hd, 1)  # v is dense [B, S, H*D]
    c = match.contraction
    assert c is not None and (c.batch, c.m, c.n, c.k) == ((b, h), s, d, s)
    assert c.b.blas() == (False, hd)  # V read in place: rows H*D apart, no transpose, no copy
    assert [n.name for n in match.epilogue] == ["scale"]
    assert (
        match.tail is not None
        and match.tail.output == "o"
        and match.tail.through == ("to_bshd", "merge_heads")
    )
    assert c.c_rs == hd and c.c_batch_strides == (s * hd, d)  # each head's rows land H*D apart
    assert match.domain == (b, h, s, d) and match.split == 3


def test_a_split_sibling_leaving_the_kernel_is_no_match() -> None:
    # q is a graph output: the Split would have to store it, which an anchor kernel never does.
    kind, why = classify(_graph(_attention_context()), [0, 1, 2, 3])
    assert kind is None and "Split 'split' output 'q' is read outside the chains into MatMul 'pv'" in why


def test_gemm_beta_c_is_the_addend_and_alpha_the_contraction() -> None:
    m = model(
        [
            node("Gemm", ["x", "w", "c"], ["y"], "fc", alpha=2.0, beta=0.5, transB=1),
            node("Relu", ["y"], ["o"], "act"),
        ],
        [("x", [6, 5])],
        ["o"],
        [("w", np.ones((7, 5), np.float32)), ("c", np.ones((7,), np.float32))],
    )
    match = _match(m, [0, 1])
    c = match.contraction
    assert c is not None and (c.m, c.n, c.k, c.alpha) == (6, 7, 5, 2.0)
    assert c.b.blas() == (True, 5)  # transB: W [7, 5] read transposed in place
    assert match.addend is not None and (match.addend.tensor, match.addend.beta) == ("c", 0.5)
    assert match.split == 1 and match.row_len == 7


def test_the_fused_model_carries_the_match_in_local_names() -> None:
    b, h, s, d = 2, 3, 8, 4
    m = model(
        [
            node("Reshape", ["v", "heads"], ["v4"], "split_heads"),
            node("Transpose", ["v4"], ["vt"], "to_bhsd", perm=[0, 2, 1, 3]),
            node("MatMul", ["p", "vt"], ["ctx"], "pv"),
            node("Transpose", ["ctx"], ["ct"], "to_bshd", perm=[0, 2, 1, 3]),
            node("Reshape", ["ct", "merged"], ["o"], "merge_heads"),
        ],
        [("v", [b, s, h * d]), ("p", [b, h, s, s])],
        ["o"],
        [("heads", np.array([b, s, h, d], np.int64)), ("merged", np.array([b, s, h * d], np.int64))],
    )
    fused = gaf.fuse(m).model
    (fn,) = [f for f in fused.functions if json.loads(f.doc_string)["template"] == "anchor"]
    recorded = json.loads(fn.doc_string)["match"]
    assert recorded["op"] == "MatMul" and recorded["anchor"].startswith("n")
    assert recorded["tail"]["output"] == fn.output[0]
    # The backend's spec of the same function yields the same match: the record is the plan.
    (spec,) = [sp for sp in extract(fused).specs.values() if sp.template == "anchor"]
    local = {n.name: k for k, n in enumerate(fn.node) if n.op_type != "Constant"}
    again = match_anchor(spec).to_json(node=lambda name: name if name.startswith("n") else f"n{local[name]}")
    assert again["contraction"] == recorded["contraction"]
    assert again["operands"][1]["strides"] == recorded["operands"][1]["strides"]


def _mlp_chain(reshape_rows: bool = False) -> onnx.ModelProto:
    """x @ w1 + b1 -> Relu -> [Reshape] -> @ w2 -> Tanh."""
    nodes = [
        node("MatMul", ["x", "w1"], ["h"], "fc1"),
        node("Add", ["h", "b1"], ["hb"], "bias1"),
        node("Relu", ["hb"], ["a"], "act"),
    ]
    left = "a"
    if reshape_rows:
        nodes.append(node("Reshape", ["a", "rows"], ["ar"], "fold"))
        left = "ar"
    nodes += [node("MatMul", [left, "w2"], ["y"], "fc2"), node("Tanh", ["y"], ["o"], "out")]
    k2 = 32 if reshape_rows else 16
    return model(
        nodes,
        [("x", [8, 8])],
        ["o"],
        [
            ("w1", np.ones((8, 16), np.float32)),
            ("b1", np.ones((16,), np.float32)),
            ("rows", np.array([4, 32], np.int64)),
            ("w2", np.ones((k2, 5), np.float32)),
        ],
    )


def test_chain_match_names_both_products_and_what_runs_between() -> None:
    g = _graph(_mlp_chain())
    assert classify(g, range(5)) == ("anchor_chain", "")
    chain = match_chain(group_spec(g, range(5)))
    assert (chain.first.name, chain.second.name) == ("fc1", "fc2")
    assert [n.name for n in chain.middle] == ["bias1", "act"] and [n.name for n in chain.epilogue] == ["out"]
    fused = gaf.fuse(_mlp_chain()).model
    docs = [json.loads(f.doc_string) for f in fused.functions]
    (recorded,) = [d["match"] for d in docs if d["template"] == "anchor_chain"]
    assert recorded["middle"] == ["n1", "n2"]


def test_a_reshape_that_changes_the_row_length_is_refused() -> None:
    # [8, 16] -> [4, 32]: row blocks of the first product are not rows of the second's operand.
    kind, why = classify(_graph(_mlp_chain(reshape_rows=True)), range(6))
    assert kind is None and why == "the reshape between the contractions does not keep rows"


def _inverted_residual(
    size: int = 64,
    expand: int = 64,
    stride: int = 2,
    first_kernel: int = 1,
    between: str = "Clip",
    dw_pads: tuple[int, ...] = (1, 1, 1, 1),
) -> onnx.ModelProto:
    """x -> Conv 1x1 (bias) -> Clip(0, 6) | Relu | Add(x') -> depthwise Conv 3x3 (bias) -> Relu:
    an inverted-residual block's expansion and depthwise conv; `first_kernel` 3 makes the
    expansion a 3x3 conv (padded to keep the size)."""
    cin = 8
    mid = {"Clip": node("Clip", ["e", "lo", "hi"], ["a"], "act6"), "Relu": node("Relu", ["e"], ["a"], "act")}
    pads = {"pads": [1, 1, 1, 1]} if first_kernel == 3 else {}
    nodes = [
        node("Conv", ["x", "w1", "b1"], ["e"], "expand", **pads),
        mid.get(between, node("Add", ["e", "other"], ["a"], "add")),
        node("Conv", ["a", "w2", "b2"], ["d"], "dw", group=expand, strides=[stride] * 2, pads=list(dw_pads)),
        node("Relu", ["d"], ["o"], "out"),
    ]
    inputs = [("x", [1, cin, size, size])]
    if between == "Add":
        inputs.append(("other", [1, expand, size, size]))
    return model(
        nodes,
        inputs,
        ["o"],
        [
            ("w1", np.ones((expand, cin, first_kernel, first_kernel), np.float32)),
            ("b1", np.ones((expand,), np.float32)),
            ("lo", np.array(0.0, np.float32)),
            ("hi", np.array(6.0, np.float32)),
            ("w2", np.ones((expand, 1, 3, 3), np.float32)),
            ("b2", np.ones((expand,), np.float32)),
        ],
    )


def test_a_1x1_conv_into_a_depthwise_conv_is_a_conv_chain() -> None:
    g = _graph(_inverted_residual())
    assert classify(g, range(4)) == ("anchor_chain", "")
    chain = match_chain(group_spec(g, range(4)))
    assert chain.conv and (chain.first.name, chain.second.name) == ("expand", "dw")
    assert [n.name for n in chain.middle] == ["act6"] and [n.name for n in chain.epilogue] == ["out"]
    fused = gaf.fuse(_inverted_residual())
    (group,) = [g for g in fused.plan.kernels if g.template == "anchor_chain"]
    assert sorted(fused.plan.graph.nodes[i].name for i in group.members) == ["act6", "dw", "expand", "out"]


def test_conv_chains_that_the_library_cannot_run_are_refused_with_why() -> None:
    def why(m: onnx.ModelProto) -> str | None:
        kind, reason = classify(_graph(m), range(4))
        assert kind is None
        return reason

    assert why(_inverted_residual(first_kernel=3)) == (
        "Conv 'expand' opening a conv chain is neither a 1x1 conv nor a depthwise 3x3"
    )
    assert why(_inverted_residual(dw_pads=(0, 0, 0, 0))) == (
        "Conv 'dw' after a 1x1 conv is not a depthwise 3x3 of stride 1 or 2"
    )
    assert why(_inverted_residual(between="Add")) == "Add 'add' between the convs is not one Relu or Clip"
    # 64 channels of 32x32 floats (256 KiB) stay in cache between two kernels
    assert why(_inverted_residual(size=32)) == (
        "the tensor between the convs (262144 bytes) stays in cache between two kernels: "
        "a conv chain gains from 1048576 bytes on"
    )
    assert classify(_graph(_inverted_residual(between="Relu", stride=1)), range(4)) == ("anchor_chain", "")


def test_a_depthwise_conv_into_a_1x1_conv_is_a_conv_chain() -> None:
    """x -> depthwise 3x3 -> Relu -> 1x1 -> Relu (a depthwise-separable conv)."""
    m = model(
        [
            node("Conv", ["x", "w1", "b1"], ["d"], "dw", group=32, pads=[1, 1, 1, 1]),
            node("Relu", ["d"], ["a"], "act"),
            node("Conv", ["a", "w2"], ["p"], "project"),
            node("Relu", ["p"], ["o"], "out"),
        ],
        [("x", [1, 32, 96, 96])],
        ["o"],
        [
            ("w1", np.ones((32, 1, 3, 3), np.float32)),
            ("b1", np.ones((32,), np.float32)),
            ("w2", np.ones((16, 32, 1, 1), np.float32)),
        ],
    )
    g = _graph(m)
    assert classify(g, range(4)) == ("anchor_chain", "")
    chain = match_chain(group_spec(g, range(4)))
    assert chain.conv and chain.depthwise_first and [n.name for n in chain.middle] == ["act"]
    three = node("Conv", ["a", "w3"], ["p"], "project", pads=[1, 1, 1, 1])
    m.graph.node[2].CopyFrom(three)
    m.graph.initializer.append(onnx.numpy_helper.from_array(np.ones((16, 32, 3, 3), np.float32), "w3"))
    kind, why = classify(_graph(m), range(4))
    assert kind is None and why == "Conv 'project' after a depthwise conv is not a 1x1 conv of stride 1"


def test_mobilenet_v2_chains_its_large_tensors_only() -> None:
    """The blocks whose tensor between two convs is at least 1 MiB run conv chains: the three
    expansions at 112x112 and 56x56 with their depthwise convs, and the first block's depthwise
    conv at 112x112 with its projection; the blocks at 28x28 and below keep their kernels."""
    from graph_autofusion import zoo

    fused = gaf.fuse(zoo.build("mobilenet_v2"))
    chains = [g for g in fused.plan.kernels if g.template == "anchor_chain"]
    graph = fused.plan.graph
    firsts = [graph.nodes[min(g.members)] for g in chains]
    assert sorted(graph.shape(n.outputs[0])[2] for n in firsts) == [56, 56, 112, 112]
    assert sum(int(n.attrs.get("group", 1)) > 1 for n in firsts) == 1  # the depthwise-first chain
