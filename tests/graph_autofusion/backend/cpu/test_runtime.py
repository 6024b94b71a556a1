"""The runtime: input checking, arena planning, dispatch, threads, host ops and zoo models end to end.

Tolerance (fp32): rtol 1e-5, atol 1e-6 against onnxruntime with optimizations disabled, except the
whole-model runs, which chain many reductions and GEMMs: rtol 1e-4, atol 1e-5 there.
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from cpu_backend_helpers import assert_close, check, make_model, ort_run, packed_weights_model, random_feeds
from onnx import helper

import graph_autofusion as gaf
from graph_autofusion import FusionConfig, zoo
from graph_autofusion.backend.cpu.arena import Buffer, plan_offsets
from graph_autofusion.backend.cpu.codegen import anchor_module
from graph_autofusion.backend.cpu.hostops import reference_evaluator
from graph_autofusion.backend.cpu.render_c import PREPACK_ONLY_SUFFIX
from graph_autofusion.backend.cpu.runtime import compile_model, generate_once
from graph_autofusion.errors import RuntimeInputError

needs_anchor = pytest.mark.skipif(
    anchor_module() is None, reason="the anchor generator (codegen/anchor.py) is absent"
)


@pytest.fixture(scope="module")
def two_input_model(kernel_cache):
    nodes = [
        helper.make_node("Add", ["a", "b"], ["s"]),
        helper.make_node("Mul", ["s", "a"], ["p"]),
        helper.make_node("Neg", ["s"], ["n"]),
    ]
    model = make_model(nodes, {"a": [2, 3], "b": [2, 3]}, ["p", "n"])
    return model, compile_model(model, cache=kernel_cache, threads=1)


def test_inputs_by_name_position_and_outputs_in_model_order(two_input_model) -> None:
    model, compiled = two_input_model
    feeds = random_feeds(model)
    expected = ort_run(model, feeds)
    by_name = compiled({"b": feeds["b"], "a": feeds["a"]})
    assert list(by_name) == ["p", "n"]
    assert_close(by_name, expected)
    assert_close(compiled.run([feeds["a"], feeds["b"]]), expected)
    again = compiled(feeds)  # outputs are copies: a second run does not change the first result
    by_name["p"][...] = 0
    assert_close(again, expected)


@pytest.mark.parametrize(
    ("feeds", "code", "words"),
    [
        ({"a": np.zeros((2, 3), np.float32)}, "missing_input", "'b'"),
        (
            {"a": np.zeros((2, 3), np.float32), "b": np.zeros((2, 3), np.float32), "c": 1},
            "unknown_input",
            "'c'",
        ),
        (
            {"a": np.zeros((2, 3), np.float64), "b": np.zeros((2, 3), np.float32)},
            "wrong_input_dtype",
            "float64",
        ),
        (
            {"a": np.zeros((3, 2), np.float32), "b": np.zeros((2, 3), np.float32)},
            "wrong_input_shape",
            "[3, 2]",
        ),
        ([np.zeros((2, 3), np.float32)], "wrong_input_count", "2 input(s)"),
        # as many names as the model's inputs, one of them not the model's: not a fast-path feed
        ({"a": np.zeros((2, 3), np.float32), "c": np.zeros((2, 3), np.float32)}, "unknown_input", "'c'"),
    ],
)
def test_bad_inputs_are_precise_errors(two_input_model, feeds, code, words) -> None:
    _, compiled = two_input_model
    with pytest.raises(RuntimeInputError) as info:
        compiled(feeds)
    assert info.value.code == code
    assert words in info.value.message


def test_a_run_copies_through_views_made_at_load(two_input_model, monkeypatch) -> None:
    # Slicing the arena per tensor per run was half the Python-side time of a batch-1 MLP; the
    # views are made once (CompiledModel._bind_io), so a run never asks `array` for one.
    model, compiled = two_input_model
    feeds = random_feeds(model)
    expected = ort_run(model, feeds)

    def no_views(name: str) -> np.ndarray:
        raise AssertionError(f"a run sliced the arena for {name!r}")

    monkeypatch.setattr(compiled, "array", no_views)
    assert_close(compiled(feeds), expected)
    # inputs that are not ndarrays of the exact dtype take the full checks, and still run
    as_lists = {"a": feeds["a"].tolist(), "b": feeds["b"]}
    assert_close(compiled(as_lists), expected)


def test_arena_reuses_memory_of_dead_tensors(kernel_cache) -> None:
    nodes = [helper.make_node("Relu", ["x"], ["t0"])]
    nodes += [helper.make_node("Sigmoid" if k % 2 else "Relu", [f"t{k}"], [f"t{k + 1}"]) for k in range(5)]
    model = make_model(nodes, {"x": [64, 64]}, ["t5"])
    compiled = check(model, kernel_cache)
    one = 64 * 64 * 4
    assert compiled.stats["arena_bytes"] <= 3 * one  # input + two live intermediates, not all seven


def test_plan_offsets_never_overlaps_live_buffers() -> None:
    rng = np.random.default_rng(0)
    buffers = []
    for k in range(60):
        first = int(rng.integers(-1, 30))
        buffers.append(Buffer(f"b{k}", int(rng.integers(1, 5000)), first, first + int(rng.integers(0, 8))))
    offsets, peak = plan_offsets(buffers)
    for a in buffers:
        assert offsets[a.name] % 64 == 0 and offsets[a.name] + a.size <= peak
        for b in buffers:
            if a is b or a.last < b.first or b.last < a.first:
                continue
            assert offsets[a.name] + a.size <= offsets[b.name] or offsets[b.name] + b.size <= offsets[a.name]
    assert peak < sum(b.size for b in buffers)


def test_driver_and_per_kernel_dispatch_agree(kernel_cache) -> None:
    nodes = [helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Softmax", ["e"], ["y"])]
    model = make_model(nodes, {"x": [4, 9]}, ["y"])
    compiled = check(model, kernel_cache)
    feeds = random_feeds(model, seed=3)
    first = compiled(feeds)
    compiled.dispatch = "ctypes"
    assert_close(compiled(feeds), first, rtol=0, atol=0)


def test_threads_are_configurable(kernel_cache) -> None:
    model = make_model([helper.make_node("Tanh", ["x"], ["y"])], {"x": [256, 512]}, ["y"])
    feeds = random_feeds(model)
    one = compile_model(model, cache=kernel_cache, threads=1)
    two = compile_model(model, cache=kernel_cache, threads=2)
    assert (one.stats["threads"], two.stats["threads"]) == (1, 2)
    assert_close(one(feeds), two(feeds), rtol=0, atol=0)
    # each run's wall time reaches the team policy (team.py), which keeps the team until it has a median
    assert len(two.team.full_runs) == 1 and two.team.threads_for_run() == 2
    with pytest.raises(ValueError, match="threads"):
        compile_model(model, cache=kernel_cache, threads=0)


def test_second_compile_hits_the_cache(kernel_cache) -> None:
    model = make_model([helper.make_node("Softsign", ["x"], ["y"])], {"x": [7, 3]}, ["y"])
    compile_model(model, cache=kernel_cache)
    again = compile_model(model, cache=kernel_cache)
    assert again.stats["cache"]["misses"] == 0 and again.stats["cache"]["hits"] >= 1


def test_op_without_generator_runs_on_host_and_is_listed(kernel_cache) -> None:
    nodes = [
        helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=-1),
        helper.make_node("Relu", ["v"], ["y"]),
    ]
    model = make_model(nodes, {"x": [3, 8]}, ["y", "i"], {"k": np.array([3], dtype=np.int64)})
    compiled = compile_model(model, cache=kernel_cache)
    (host,) = compiled.stats["host_ops"]
    assert host["op_type"] == "TopK" and host["reason"]
    feeds = random_feeds(model)
    assert_close(compiled(feeds), ort_run(model, feeds))


def test_kernel_the_generator_declines_falls_back_to_host(kernel_cache) -> None:
    nodes = [helper.make_node("Pad", ["x", "pads"], ["y"], mode="wrap")]
    model = make_model(
        nodes, {"x": [3, 4]}, ["y"], {"pads": np.array([0, 1, 0, 2], dtype=np.int64)}, opset=19
    )
    compiled = compile_model(model, cache=kernel_cache)
    (host,) = compiled.stats["host_ops"]
    assert "wrap" in host["reason"]
    feeds = random_feeds(model)
    assert_close(compiled(feeds), ort_run(model, feeds))


SMALL_ZOO = {
    "mlp": {"in_features": 32, "hidden": (16, 8)},
    "bert_base": {"num_layers": 1, "hidden": 32, "heads": 2, "seq_len": 8, "vocab": 50},
    "gpt2": {"num_layers": 1, "hidden": 32, "heads": 2, "seq_len": 8, "vocab": 50, "max_positions": 16},
    "vit_b16": {"image_size": 16, "patch": 8, "num_layers": 1, "hidden": 32, "heads": 2, "num_classes": 10},
    "resnet50": {"image_size": 16, "width": 4, "layers": (1, 1, 1, 1), "num_classes": 10},
    "mobilenet_v2": {
        "image_size": 16,
        "width_mult": 0.25,
        "num_classes": 10,
        "setting": ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 1, 2)),
    },
}


@needs_anchor
@pytest.mark.parametrize("name", list(SMALL_ZOO))
def test_zoo_model_unfused_and_fused_match_onnxruntime(kernel_cache, name) -> None:
    source = zoo.build(name, **SMALL_ZOO[name])
    feeds = zoo.example_inputs(source)
    unfused = gaf.fuse(source, config=FusionConfig(max_fusion_size=0))
    fused = gaf.fuse(source)
    expected = ort_run(unfused.canonical_reference, feeds)
    for graph in (unfused, fused):
        compiled = compile_model(graph.model, cache=kernel_cache)
        assert compiled.stats["host_ops"] == []
        assert_close(compiled(feeds), expected, rtol=1e-4, atol=1e-5)
    assert fused_kernels(fused.model) < fused_kernels(unfused.model)


def fused_kernels(model: onnx.ModelProto) -> int:
    views = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"}
    return sum(1 for n in model.graph.node if n.op_type not in views)


# -- poisoning, element types the generators lack -----------------------------------------------


def test_poison_fills_the_arena_and_outputs_do_not_depend_on_it(two_input_model) -> None:
    """Seed 0 writes NaN bytes, 1 a large value, others random bytes; every output is written by
    a kernel, so the results are bit-identical whatever the arena held before the run."""
    model, compiled = two_input_model
    feeds = random_feeds(model)
    results = []
    for seed in (0, 1, 7):
        compiled.poison(seed)
        if seed == 0:
            assert np.isnan(compiled.array("s")).all()
        results.append(compiled(feeds))
    for other in results[1:]:
        for name, value in results[0].items():
            np.testing.assert_array_equal(other[name], value)
    assert_close(results[0], ort_run(model, feeds))


def test_an_element_type_without_a_c_type_runs_on_the_host(kernel_cache) -> None:
    """fp8 has no C type in the generators: its kernels become host ops (onnx.reference), and the
    round trip through fp8 rounds exactly as the reference does."""
    from onnx.reference import ReferenceEvaluator

    fp8 = onnx.TensorProto.FLOAT8E4M3FN
    nodes = [
        helper.make_node("Cast", ["x"], ["q"], to=fp8),
        helper.make_node("Cast", ["q"], ["y"], to=onnx.TensorProto.FLOAT),
    ]
    model = make_model(nodes, {"x": [2, 3]}, ["y"], opset=19)  # fp8 types arrive in opset 19
    compiled = compile_model(model, cache=kernel_cache, threads=1)
    reasons = {h["reason"] for h in compiled.stats["host_ops"]}
    assert reasons == {"no code generated: the kernel IR has no element type for ONNX FLOAT8E4M3FN"}
    x = np.array([[0.1, -1.3, 7.0], [300.0, 0.0, -0.02]], np.float32)
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_array_equal(compiled({"x": x})["y"], want)


def test_string_tensors_are_refused_with_a_code(kernel_cache) -> None:
    nodes = [helper.make_node("Cast", ["s"], ["y"], to=onnx.TensorProto.FLOAT)]
    model = make_model(nodes, {"s": ([3], onnx.TensorProto.STRING)}, ["y"])
    with pytest.raises(gaf.FusionError) as err:
        compile_model(model, cache=kernel_cache, threads=1)
    assert err.value.code == "unsupported_dtype"


@pytest.mark.parametrize("p", [1, 2])
def test_a_host_lp_normalization_takes_absolute_values(kernel_cache, p) -> None:
    """Host ops evaluate with hostops.reference_evaluator: onnx.reference's own LpNormalization
    sums x**p without abs (p=1 flips signs, divides by a signed sum). Found by the differential
    test (seeds 1958, 1745: fp16 LpNormalization on the host path, max error 73)."""
    nodes = [helper.make_node("LpNormalization", ["x"], ["y"], axis=1, p=p)]
    model = make_model(nodes, {"x": ([3, 4], onnx.TensorProto.FLOAT16)}, ["y"])
    x = np.array([[0.5, -1.5, 2.0, -0.25], [-1, -2, -3, 0.5], [1, 2, 3, 4]], dtype=np.float16)
    want = ort_run(model, {"x": x})["y"].astype(np.float32)
    host = reference_evaluator(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(host.astype(np.float32), want, atol=2e-3)
    compiled = compile_model(model, cache=kernel_cache, threads=1)
    np.testing.assert_allclose(compiled({"x": x})["y"].astype(np.float32), want, atol=2e-3)


def test_row_buffers_live_in_the_arena_workspace_one_slice_per_thread(kernel_cache) -> None:
    """Softmax keeps exp(x - max) in a per-thread row buffer: the kernel takes it from the
    runtime's arena (no malloc in generated code), and the arena counts it once per thread."""
    from graph_autofusion.backend.cpu.codegen import generate

    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [256, 300])
    z = helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [256, 300])
    graph = helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["y"], axis=-1), helper.make_node("Erf", ["y"], ["z"])],
        "g",
        [x],
        [z],
    )
    fused = gaf.fuse(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    feeds = {"x": np.random.default_rng(0).standard_normal((256, 300)).astype(np.float32)}
    expected = ort_run(fused.model, feeds)
    compiled = {t: compile_model(fused.model, cache=kernel_cache, threads=t) for t in (1, 2)}
    for c in compiled.values():
        assert_close(c(feeds), expected)
        for symbol, spec in c.plan.specs.items():
            assert "malloc" not in generate(spec).source.split(f"void {symbol}")[1]
    one, two = compiled[1].stats, compiled[2].stats
    assert one["workspace_bytes"] >= 300 * 4 and two["workspace_bytes"] == 2 * one["workspace_bytes"]
    assert two["arena_bytes"] - one["arena_bytes"] == one["workspace_bytes"]


def test_weights_read_only_packed_are_released_not_held_twice(kernel_cache) -> None:
    """`w` (a MatMul's) and `k` (a Conv's) are read only packed: released after packing, so the
    runtime holds them once; `v` is also read raw by the Mul kernel and stays."""
    model = packed_weights_model()
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    compiled = compile_model(model, cache=kernel_cache)
    feeds = random_feeds(model)
    assert_close(compiled(feeds), ort_run(model, feeds))
    stats = compiled.stats
    assert stats["released_weights_bytes"] == weights["w"].nbytes + weights["k"].nbytes
    assert stats["weights_bytes"] == weights["v"].nbytes + weights["two"].nbytes
    assert stats["packed_weights_bytes"] >= (weights["w"].size + weights["v"].size + weights["k"].size) * 4
    assert stats["packed_weights_source"] == "packed at load"
    with pytest.raises(KeyError, match="packed"):
        compiled.array("w")
    np.testing.assert_array_equal(compiled.array("v"), weights["v"])
    assert "w" not in compiled.plan.initializers and "v" in compiled.plan.initializers


def test_kernels_do_not_declare_the_weights_they_read_packed(kernel_cache) -> None:
    """What makes passing NULL for them safe: the run function never names the raw weight (the
    compiler would refuse a read), and each kernel that packs says which parameters it skips."""
    compiled = compile_model(packed_weights_model(), cache=kernel_cache)
    skipped = 0
    for symbol, spec in compiled.plan.specs.items():
        source = generate_once(spec).source
        if f"{symbol}{PREPACK_ONLY_SUFFIX}" not in source:
            continue
        body = source.split(f"void {symbol}(void *const *args) {{", 1)[1]
        code = re.sub(r"/\*.*?\*/", "", body, flags=re.DOTALL)
        for j, name in re.findall(r"/\* args\[(\d+)\] \((\w+)\): read packed only", body):
            skipped += 1
            assert spec.inputs[int(j)].name in spec.weights
            assert not re.search(rf"\b{name}\b", code), (symbol, name)
    assert skipped >= 2  # the MatMul's `w` and the Conv's `k` at least
