"""benchmarks/contraction.py --layers on small models: onnxruntime's per-node profile read back,
every anchor paired with its onnxruntime node by (input shape, weight shape), or by input and
output shapes where the profile leaves a pre-packed weight out, a chain with both of its nodes,
OpenVINO's in execution order in a conv net only, the table."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import contraction  # noqa: E402


def _model(
    nodes: list[onnx.NodeProto], x: list[int], weights: dict[str, np.ndarray], rng: np.random.Generator
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A model of `nodes` from input x (of shape `x`) to y, its constants `weights`; and a feed."""
    graph = helper.make_graph(
        nodes,
        "layers",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, n) for n, v in weights.items()],
    )
    model = onnx.shape_inference.infer_shapes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    )
    return model, {"x": rng.standard_normal(x).astype(np.float32)}


def _two_convs() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((32, 16, 3, 3)).astype(np.float32)
    w2 = rng.standard_normal((64, 32, 1, 1)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("Conv", ["b", "w2"], ["y"]),
    ]
    return _model(nodes, [1, 16, 20, 20], {"w1": w1, "w2": w2}, rng)


def test_onnxruntime_nodes_come_back_keyed_by_input_and_weight_shape() -> None:
    model, feeds = _two_convs()
    rows = contraction.ort_node_times(model, feeds, nthreads=1, reps=2)
    assert [r["key"] for r in rows] == [((1, 16, 20, 20), (32, 16, 3, 3)), ((1, 32, 20, 20), (64, 32, 1, 1))]
    assert all("Conv" in str(r["op"]) and float(r["ms"]) > 0 for r in rows)  # type: ignore[arg-type]


def test_every_anchor_is_paired_and_the_table_puts_the_biggest_loser_first() -> None:
    model, feeds = _two_convs()
    rows = contraction.compare_layers(model, feeds, nthreads=1, reps=2)
    assert [(r["x"], r["w"]) for r in rows] == [
        ([1, 16, 20, 20], [32, 16, 3, 3]),
        ([1, 32, 20, 20], [64, 32, 1, 1]),
    ]
    for r in rows:
        assert float(r["ms"]) > 0 and not math.isnan(float(r["ort_ms"]))  # type: ignore[arg-type]
        assert float(r["gflops"]) > 0 and float(r["peak_pct"]) > 0  # type: ignore[arg-type]
    lines = contraction._layer_lines(rows, 1)
    losses = [float(r["ms"]) - float(r["ort_ms"]) for r in rows]  # type: ignore[arg-type]
    first = rows[int(np.argmax(losses))]
    assert lines[1].startswith("x".join(map(str, first["x"][1:])))  # type: ignore[index]
    # the OpenVINO total follows where OpenVINO (the bench extra) is installed
    with_ov = not any(math.isnan(float(r["ov_ms"])) for r in rows)  # type: ignore[arg-type]
    totals = lines[-2:] if with_ov else lines[-1:]
    assert totals[0].startswith("all anchors, 1 thread(s)")
    assert totals[-1].startswith("all anchors vs OpenVINO") == with_ov


def _convs_and_classifier() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Two convs, global pooling and a Gemm classifier: a conv net as ResNet-50 ends."""
    model, _ = _two_convs()
    rng = np.random.default_rng(2)
    nodes = [
        *model.graph.node[:-1],
        helper.make_node("Conv", ["b", "w2"], ["c"]),
        helper.make_node("GlobalAveragePool", ["c"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["y"], transB=1),
    ]
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    weights["w3"] = rng.standard_normal((10, 64)).astype(np.float32)
    weights["b3"] = rng.standard_normal(10).astype(np.float32)
    return _model(nodes, [1, 16, 20, 20], weights, rng)


def test_openvino_nodes_pair_with_the_anchors_in_execution_order() -> None:
    """A conv net's convs and its classifier come back from OpenVINO's profile in order, each as
    the kind it runs and with a time; every layer row carries its node's time."""
    pytest.importorskip("openvino", reason="OpenVINO comes with the bench extra: pip install -e '.[bench]'")
    model, feeds = _convs_and_classifier()
    times = contraction.ov_node_times(model, feeds, nthreads=1, reps=2)
    assert times is not None and [kind for kind, _ in times] == ["Conv", "Conv", "Gemm"]
    assert all(ms > 0 for _, ms in times)
    rows = contraction.compare_layers(model, feeds, nthreads=1, reps=2)
    assert len(rows) == 3 and all(float(r["ov_ms"]) > 0 for r in rows)  # type: ignore[arg-type]


def test_the_runs_split_into_alternating_rounds_and_keep_each_node_s_fastest() -> None:
    """--layers profiles the runtimes in LAYER_ROUNDS rounds: every run is in one round, and a
    node's time is its fastest in any round (a node set that differs between rounds is an error,
    not a silent mispairing)."""
    assert contraction._rounds(20) == [7, 7, 6] and contraction._rounds(5) == [3, 2]
    assert contraction._rounds(2) == [2] and contraction._rounds(1) == [1]
    a = [{"node": "c1", "ms": 2.0}, {"node": "c2", "ms": 1.0}]
    b = [{"node": "c1", "ms": 1.5}, {"node": "c2", "ms": 3.0}]
    assert [r["ms"] for r in contraction._fastest_rows(a, b)] == [1.5, 1.0]
    assert contraction._fastest_rows([], b) == b
    with pytest.raises(RuntimeError, match="different nodes"):
        contraction._fastest_rows(a, [{"node": "c9", "ms": 1.0}, b[1]])


def test_each_runtime_s_profile_starts_after_a_quiet_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every round pauses SETTLE_SECONDS before onnxruntime's, OpenVINO's and our profile, so
    that none runs beside the previous one's spinning threads (ours read up to 20% slow without)."""
    model, feeds = _two_convs()
    events: list[object] = []
    real_ort, real_ov = contraction.ort_node_times, contraction.ov_node_times
    real_peak = contraction.peak_flops

    def logged(tag: str, fn):  # type: ignore[no-untyped-def]
        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            events.append(tag)
            return fn(*args, **kwargs)

        return call

    monkeypatch.setattr(contraction.time, "sleep", lambda seconds: events.append(seconds))
    monkeypatch.setattr(contraction, "ort_node_times", logged("ort", real_ort))
    monkeypatch.setattr(contraction, "ov_node_times", logged("ov", real_ov))
    monkeypatch.setattr(contraction, "peak_flops", logged("ours done", real_peak))
    contraction.compare_layers(model, feeds, nthreads=1, reps=4)
    pause = sys.modules["runtime_speed"].SETTLE_SECONDS
    assert pause >= 0.1
    assert events == [pause, "ort", pause, "ov", pause, "ours done"] * len(contraction._rounds(4))


def _row(x: list[int], ms: float, ort_ms: float) -> dict[str, object]:
    return {"x": x, "w": [8, x[1], 1, 1], "ms": ms, "ort_ms": ort_ms}


def test_the_scaling_table_charges_each_layer_what_it_loses_beyond_onnxruntime() -> None:
    # layer a: ours 1.0 -> 0.8 ms on two threads (0.3 lost against a perfect 0.5), onnxruntime
    # 1.0 -> 0.5 (none lost): 0.3 ms; layer b scales like onnxruntime: 0; layer c has no peer
    one = [_row([1, 4, 8, 8], 1.0, 1.0), _row([1, 6, 8, 8], 2.0, 1.0), _row([1, 2, 8, 8], 1.0, math.nan)]
    two = [_row([1, 4, 8, 8], 0.8, 0.5), _row([1, 6, 8, 8], 1.1, 0.6), _row([1, 2, 8, 8], 0.5, math.nan)]
    lines = contraction._scaling_lines(one, two, 2)
    assert len(lines) == 4  # the header, two paired layers (the biggest loser first), the total
    assert lines[1].startswith("4x8x8 -> 8x4x1x1") and lines[1].split()[-1] == "0.300"
    assert lines[2].startswith("6x8x8 -> 8x6x1x1") and float(lines[2].split()[-1]) == pytest.approx(0.0)
    assert lines[3].startswith("2 paired anchors") and lines[3].split()[-1] == "0.300"
    with pytest.raises(ValueError, match="different anchors"):
        contraction._scaling_lines(one, two[:2], 2)


def test_the_scaling_table_comes_from_one_and_two_thread_profiles_of_the_same_model() -> None:
    model, feeds = _two_convs()
    one = contraction.compare_layers(model, feeds, nthreads=1, reps=2)
    two = contraction.compare_layers(model, feeds, nthreads=2, reps=2)
    lines = contraction._scaling_lines(one, two, 2)
    assert len(lines) == 2 + len(one) and lines[-1].startswith(f"{len(one)} paired anchors")


def _two_matmuls() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A Gemm with a constant weight and bias, Relu, a MatMul with a constant weight: onnxruntime
    pre-packs both weights and its profile leaves them out of the nodes' inputs."""
    rng = np.random.default_rng(1)
    w1 = rng.standard_normal((32, 16)).astype(np.float32)
    b1 = rng.standard_normal(16).astype(np.float32)
    w2 = rng.standard_normal((16, 24)).astype(np.float32)
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["a"]),
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("MatMul", ["b", "w2"], ["y"]),
    ]
    return _model(nodes, [8, 32], {"w1": w1, "b1": b1, "w2": w2}, rng)


def test_matmul_anchors_pair_by_output_shape_where_the_profile_leaves_their_weight_out() -> None:
    """Every anchor of a matmul model finds its onnxruntime node (by input and output shapes
    where the weight shape is missing), and OpenVINO's column stays empty: its nodes pair in
    order only in a conv net (a transformer's counts can agree while its orders differ)."""
    model, feeds = _two_matmuls()
    theirs = contraction.ort_node_times(model, feeds, nthreads=1, reps=2)
    assert [r["out_key"] for r in theirs] == [((8, 32), (8, 16)), ((8, 16), (8, 24))]
    rows = contraction.compare_layers(model, feeds, nthreads=1, reps=2)
    assert [(r["x"], r["w"]) for r in rows] == [([8, 32], [32, 16]), ([8, 16], [16, 24])]
    assert all(not math.isnan(float(r["ort_ms"])) for r in rows)  # type: ignore[arg-type]
    assert all(math.isnan(float(r["ov_ms"])) for r in rows)  # type: ignore[arg-type]


def test_a_chain_s_row_pairs_with_both_of_its_products(monkeypatch: pytest.MonkeyPatch) -> None:
    """An MLP block planned as one chain kernel (MatMul, Relu, MatMul) is one row, compared with
    the sum of onnxruntime's two MatMul nodes (their profiled rows, read back, then given fixed
    times here so that the sum is exact) and labelled with both weights."""
    rng = np.random.default_rng(2)
    w1 = rng.standard_normal((128, 256)).astype(np.float32)
    w2 = rng.standard_normal((256, 128)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["a"]),
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("MatMul", ["b", "w2"], ["y"]),
    ]
    model, feeds = _model(nodes, [64, 128], {"w1": w1, "w2": w2}, rng)
    theirs = contraction.ort_node_times(model, feeds, nthreads=1, reps=2)
    assert len(theirs) == 2
    fixed = [{**row, "ms": ms} for row, ms in zip(theirs, (0.5, 0.25), strict=True)]
    monkeypatch.setattr(contraction, "ort_node_times", lambda *args: fixed)
    rows = contraction.compare_layers(model, feeds, nthreads=1, reps=2)
    assert len(rows) == 1 and rows[0]["then"] == [[256, 128]]
    assert rows[0]["ort_ms"] == 0.75
    assert contraction._layer_label(rows[0]) == "128 -> 128x256 -> 256x128"
