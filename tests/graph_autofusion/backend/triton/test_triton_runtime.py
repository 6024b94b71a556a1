"""The Triton targets' contract (docs/targets.md): host ops listed with the renderer's reason and
refused on request, input checks, 16-bit floats computed in fp32, content-hashed kernels, the
Ascend Unified Buffer budget, and artifacts."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

import graph_autofusion as gaf
from graph_autofusion.backend.triton.blocks import check_ascend, configure
from graph_autofusion.backend.triton.render import Launch
from graph_autofusion.errors import RuntimeInputError, UnsupportedModelError
from graph_autofusion.hardware import get_profile
from graph_autofusion.lower.values import Unsupported

# The interpreter computes masked-off lanes too (0/0 there is discarded by the mask).
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


def _model(nodes, inputs, outputs, elem=T.FLOAT, initializers=()) -> onnx.ModelProto:  # type: ignore[no-untyped-def]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, elem, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, elem, None) for n in outputs],
        list(initializers),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    return onnx.shape_inference.infer_shapes(model)


def _atan_model() -> onnx.ModelProto:
    nodes = [helper.make_node("Atan", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    return _model(nodes, {"x": [4, 8]}, ["y"])


def test_unrendered_group_runs_as_a_listed_host_op(triton_cache) -> None:  # type: ignore[no-untyped-def]
    fused = gaf.fuse(_atan_model())
    compiled = fused.compile(target="cuda", cache_dir=triton_cache)
    hosts = compiled.stats["host_ops"]
    assert len(hosts) == 1 and hosts[0]["code"] == "codegen_unsupported"
    assert "atan" in hosts[0]["reason"]
    assert fused.report()["targets"]["cuda"]["host_ops"] == hosts
    assert fused.verify(target="cuda").passed


def test_no_host_ops_config_refuses_the_target(triton_cache) -> None:  # type: ignore[no-untyped-def]
    fused = gaf.fuse(_atan_model(), {"allow_host_ops": False})  # the CPU backend renders Atan
    with pytest.raises(UnsupportedModelError) as err:
        fused.compile(target="ascend910", cache_dir=triton_cache)
    assert err.value.code == "host_op_refused"
    assert "atan" in str(err.value)


def test_inputs_are_checked_like_on_the_cpu(triton_cache) -> None:  # type: ignore[no-untyped-def]
    compiled = gaf.fuse(_atan_model()).compile(target="cuda", cache_dir=triton_cache)
    with pytest.raises(RuntimeInputError) as err:
        compiled({"x": np.zeros((4, 8), np.float64)})
    assert err.value.code == "wrong_input_dtype"
    with pytest.raises(RuntimeInputError) as err:
        compiled({})
    assert err.value.code == "missing_input"


def test_unknown_or_absent_target(monkeypatch: pytest.MonkeyPatch) -> None:
    fused = gaf.fuse(_atan_model())
    with pytest.raises(UnsupportedModelError) as err:
        fused.compile(target="tpu")
    assert err.value.code == "unknown_target"
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # no GPU on this machine
    with pytest.raises(UnsupportedModelError) as err:
        fused.compile(target="cuda")
    assert err.value.code == "target_unavailable"


def _layer(elem: int) -> onnx.ModelProto:
    """MatMul + bias + GELU(tanh) + LayerNorm + Softmax: anchor, pointwise and row kernels."""
    rng = np.random.default_rng(0)
    dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
    inits = [
        onnx.numpy_helper.from_array((rng.standard_normal((32, 48)) * 0.2).astype(dtype), "w"),
        onnx.numpy_helper.from_array(rng.standard_normal(48).astype(dtype), "b"),
        onnx.numpy_helper.from_array(np.ones(48, dtype), "g"),
        onnx.numpy_helper.from_array(np.zeros(48, dtype), "beta"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["a"]),
        helper.make_node("Tanh", ["a"], ["t"]),
        helper.make_node("Mul", ["a", "t"], ["h"]),
        helper.make_node("LayerNormalization", ["h", "g", "beta"], ["n"], axis=-1),
        helper.make_node("Softmax", ["n"], ["y"], axis=-1),
    ]
    return _model(nodes, {"x": [2, 5, 32]}, ["y"], elem, inits)


@pytest.mark.parametrize("target", ["cuda", "ascend910"])
def test_fp16_model_runs_with_fp32_accumulation(target: str, triton_cache) -> None:  # type: ignore[no-untyped-def]
    fused = gaf.fuse(_layer(T.FLOAT16))
    compiled = fused.compile(target=target, cache_dir=triton_cache)
    assert compiled.stats["host_ops"] == []
    sources = [a["source"] for a in compiled.artifacts()]
    assert any("tl.dot" in s for s in sources) and all("tl.float16" in s for s in sources)
    result = fused.verify(target=target)
    assert result.passed, [o.to_dict() for o in result.outputs]


def test_bf16_row_kernel_rounds_to_nearest_even(triton_cache) -> None:  # type: ignore[no-untyped-def]
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["s"]),
        helper.make_node("Add", ["s", "x"], ["a"]),
        helper.make_node("Softmax", ["a"], ["y"], axis=-1),
    ]
    fused = gaf.fuse(_model(nodes, {"x": [3, 40]}, ["y"], T.BFLOAT16))
    compiled = fused.compile(target="ascend910", cache_dir=triton_cache)
    assert compiled.stats["host_ops"] == []
    x = np.random.default_rng(1).standard_normal((3, 40)).astype(ml_dtypes.bfloat16)
    got = compiled({"x": x})["y"]
    assert got.dtype == ml_dtypes.bfloat16
    wide = x.astype(np.float32)
    a = wide * wide + wide
    e = np.exp(a - a.max(-1, keepdims=True))
    # Computed in fp32; the row buffer holding exp() is bf16 (the lowering's row buffers take the
    # tensor's type), so e rounds once there and the quotient once at the store.
    kept = e.astype(ml_dtypes.bfloat16).astype(np.float32)
    want = (kept / e.sum(-1, keepdims=True)).astype(ml_dtypes.bfloat16).astype(np.float32)
    ulp = 2.0**-8 * np.abs(want)
    assert np.all(np.abs(got.astype(np.float32) - want) <= ulp), np.abs(got.astype(np.float32) - want).max()


def test_identical_kernels_are_rendered_once(triton_cache) -> None:  # type: ignore[no-untyped-def]
    model = gaf.zoo.build("bert_base", **gaf.zoo.TINY["bert_base"])  # two identical layers
    compiled = gaf.fuse(model).compile(target="cuda", cache_dir=triton_cache)
    assert compiled.stats["unique_kernels"] < compiled.stats["kernels"]
    records = compiled.artifacts()
    digests = [r["digest"] for r in records]
    assert len(set(digests)) <= len(digests)
    by_digest = {r["digest"]: r["source"] for r in records}
    assert all((triton_cache / "triton" / f"{d}.py").read_text() == s for d, s in by_digest.items())


def test_saved_artifacts_list_every_kernel(tmp_path, triton_cache) -> None:  # type: ignore[no-untyped-def]
    compiled = gaf.fuse(_layer(T.FLOAT)).compile(target="cuda", cache_dir=triton_cache)
    root = compiled.save_artifacts(tmp_path / "out")
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["target"] == "cuda" and manifest["mode"] == "interpret"
    assert len(manifest["kernels"]) == len(compiled.kernels)
    for record in manifest["kernels"]:
        assert (root / record["source"]).read_text().startswith("# kernel ")
        assert record["launches"] and all(launch["grid"][0] >= 1 for launch in record["launches"])


def test_ascend_blocks_shrink_to_the_unified_buffer() -> None:
    profile = get_profile("ascend910")
    light = configure(Launch("k", "flat", 1 << 20, (), lane_bytes=16), profile)
    heavy = configure(Launch("k", "flat", 1 << 20, (), lane_bytes=400), profile)
    assert heavy.meta["BLOCK"] < light.meta["BLOCK"]
    for config in (light, heavy):
        assert check_ascend(config, profile) == []
        assert config.grid == profile.cores < config.nblocks
    with pytest.raises(Unsupported, match="Unified Buffer"):
        configure(Launch("k", "flat", 1 << 20, (), lane_bytes=profile.unified_buffer_bytes), profile)
    cuda = configure(Launch("k", "flat", 1 << 20, (), lane_bytes=400), get_profile("cuda"))
    assert cuda.grid == cuda.nblocks and cuda.options == {"num_warps": 4}


def test_autotune_keeps_a_candidate_and_stores_it(triton_cache) -> None:  # type: ignore[no-untyped-def]
    """The search itself (times under the interpreter mean nothing, so the runtime only tunes on a
    device): every candidate runs and gives the same result, the winner is stored and read back."""
    import torch

    from graph_autofusion.backend.triton.tune import autotune, load_tuned, tune_file

    nodes = [helper.make_node("Mul", ["x", "x"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    compiled = gaf.fuse(_model(nodes, {"x": [64, 100]}, ["y"])).compile(target="cuda", cache_dir=triton_cache)
    kernel = next(iter(compiled.kernels.values()))
    x = torch.randn(64, 100)
    y = torch.empty(64, 100)
    seen = []

    def run(launch, config):  # type: ignore[no-untyped-def]
        y.fill_(float("nan"))
        getattr(kernel.module, launch.function)[(config.grid,)](
            x, y, config.nblocks, config.grid, **config.meta, **config.options
        )
        seen.append(config.meta["BLOCK"])
        assert torch.equal(y, torch.relu(x * x))

    profile = get_profile("cuda")
    chosen = autotune(kernel.rendered.launches, kernel.configs, profile, run, lambda: None, kernel.path)
    assert {256, 512, 1024, 2048} <= set(seen)
    assert chosen[0].meta["BLOCK"] in seen
    assert tune_file(kernel.path).exists()
    assert load_tuned(kernel.path, profile, kernel.rendered.launches) == chosen
    assert load_tuned(kernel.path, get_profile("cuda_sm90"), kernel.rendered.launches) is None
