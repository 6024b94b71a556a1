"""Every zoo model, small, in both styles: valid ONNX, runs in onnxruntime, finite, deterministic."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from zoo_cases import SMALL

from graph_autofusion import zoo
from graph_autofusion.zoo import example_inputs


def run(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


def declared_shape(value: onnx.ValueInfoProto, bind: dict[str, int]) -> tuple[int, ...]:
    dims = value.type.tensor_type.shape.dim
    return tuple(d.dim_value if d.HasField("dim_value") else bind[d.dim_param] for d in dims)


def test_models_lists_the_six_architectures() -> None:
    assert sorted(zoo.MODELS) == sorted(["resnet50", "mobilenet_v2", "bert_base", "gpt2", "vit_b16", "mlp"])
    assert sorted(SMALL) == sorted(zoo.MODELS)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("style", ["torchscript", "dynamo"])
@pytest.mark.parametrize("name", sorted(SMALL))
def test_model_is_valid_and_runs_finite(name: str, style: str, dynamic: bool) -> None:
    model = zoo.build(name, style=style, dynamic_batch=dynamic, **SMALL[name][1])
    onnx.checker.check_model(model, full_check=True)
    # Dynamic models must accept sizes other than the ones they were built with.
    bind = {"batch": 3, "sequence": 5} if dynamic else {}
    outputs = run(model, example_inputs(model, bind=bind))
    assert len(outputs) == len(model.graph.output)
    for value, out in zip(model.graph.output, outputs, strict=True):
        assert out.shape == declared_shape(value, bind)
        assert out.dtype == np.float32
        assert np.isfinite(out).all()
        assert out.std() > 1e-3, f"{value.name} is (nearly) constant"


@pytest.mark.parametrize("name", sorted(SMALL))
def test_both_styles_compute_the_same_function(name: str) -> None:
    """Same seed, same weights: the two exporters' graphs must agree numerically."""
    kwargs = SMALL[name][1]
    script = zoo.build(name, style="torchscript", **kwargs)
    dynamo = zoo.build(name, style="dynamo", **kwargs)
    inputs = example_inputs(script)
    for a, b in zip(run(script, inputs), run(dynamo, inputs), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["resnet50", "mobilenet_v2"])
def test_folding_batchnorm_keeps_the_function(name: str) -> None:
    kwargs = SMALL[name][1]
    kept = zoo.build(name, **kwargs)
    folded = zoo.build(name, fold_batchnorm=True, **kwargs)
    assert any(n.op_type == "BatchNormalization" for n in kept.graph.node)
    assert not any(n.op_type == "BatchNormalization" for n in folded.graph.node)
    inputs = example_inputs(kept)
    np.testing.assert_allclose(run(kept, inputs)[0], run(folded, inputs)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("opset", [13, 14, 15, 16])
def test_bert_below_opset_17_decomposes_layernorm_and_agrees(opset: int) -> None:
    kwargs = SMALL["bert_base"][1]
    reference = zoo.build("bert_base", **kwargs)
    model = zoo.build("bert_base", opset=opset, **kwargs)
    onnx.checker.check_model(model, full_check=True)
    ops = [n.op_type for n in model.graph.node]
    assert "LayerNormalization" not in ops
    assert {"ReduceMean", "Sub", "Pow", "Sqrt", "Div"} <= set(ops)
    inputs = example_inputs(model)
    for a, b in zip(run(reference, inputs), run(model, inputs), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("opset", [19, 20, 21])
def test_dynamo_style_accepts_newer_opsets(opset: int) -> None:
    model = zoo.build("vit_b16", style="dynamo", opset=opset, **SMALL["vit_b16"][1])
    onnx.checker.check_model(model, full_check=True)
    assert model.opset_import[0].version == opset
    assert np.isfinite(run(model, example_inputs(model))[0]).all()


@pytest.mark.parametrize("style", ["torchscript", "dynamo"])
@pytest.mark.parametrize("name", sorted(SMALL))
def test_same_arguments_give_byte_identical_models(name: str, style: str) -> None:
    kwargs = SMALL[name][1]
    first = zoo.build(name, style=style, **kwargs).SerializeToString()
    second = zoo.build(name, style=style, **kwargs).SerializeToString()
    assert first == second
    assert zoo.build(name, style=style, seed=1, **kwargs).SerializeToString() != first


def test_full_size_defaults_are_the_real_architectures() -> None:
    """Checked on the signatures, not by building (a full BERT is 440 MB)."""
    import inspect

    def defaults(fn: object) -> dict[str, object]:
        return {k: p.default for k, p in inspect.signature(fn).parameters.items()}  # type: ignore[arg-type]

    bert = defaults(zoo.bert_base)
    assert (bert["num_layers"], bert["hidden"], bert["heads"], bert["seq_len"], bert["vocab"]) == (
        12,
        768,
        12,
        128,
        30522,
    )
    gpt = defaults(zoo.gpt2)
    assert (gpt["num_layers"], gpt["hidden"], gpt["heads"], gpt["vocab"], gpt["max_positions"]) == (
        12,
        768,
        12,
        50257,
        1024,
    )
    vit = defaults(zoo.vit_b16)
    assert (vit["image_size"], vit["patch"], vit["num_layers"], vit["hidden"], vit["heads"]) == (
        224,
        16,
        12,
        768,
        12,
    )
    res = defaults(zoo.resnet50)
    assert (res["image_size"], res["width"], tuple(res["layers"]), res["num_classes"]) == (
        224,
        64,
        (3, 4, 6, 3),
        1000,
    )
    mob = defaults(zoo.mobilenet_v2)
    assert (mob["width_mult"], mob["image_size"], mob["num_classes"]) == (1.0, 224, 1000)
    mlp = defaults(zoo.mlp)
    assert (mlp["in_features"], tuple(mlp["hidden"]), mlp["num_classes"]) == (784, (512, 256), 10)


def test_full_size_mobilenet_v2_has_the_published_structure() -> None:
    """The one full-size model cheap enough to build here: 52 convs, 17 inverted residual blocks."""
    model = zoo.build("mobilenet_v2", style="dynamo")
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    assert len(convs) == 52
    assert sum(1 for n in model.graph.node if n.op_type == "Add") == 10  # residual blocks
    params = sum(int(np.prod(t.dims)) for t in model.graph.initializer if len(t.dims) > 1)
    assert 3_400_000 < params < 3_600_000  # 3.5 M parameters, as published


def test_example_inputs_respect_vocab_mask_and_bound_dims() -> None:
    model = zoo.build("bert_base", dynamic_batch=True, **{**SMALL["bert_base"][1], "vocab": 7})
    inputs = example_inputs(model, bind={"batch": 3, "sequence": 4})
    assert inputs["input_ids"].shape == (3, 4) and inputs["input_ids"].max() < 7
    assert set(np.unique(inputs["attention_mask"])) == {0, 1}
    defaults = example_inputs(model)  # unbound symbols take the built sizes
    assert defaults["input_ids"].shape == (2, 16)


def test_example_inputs_refuse_foreign_models() -> None:
    model = zoo.build("mlp", **SMALL["mlp"][1])
    del model.metadata_props[:]
    with pytest.raises(zoo.ZooArgumentError):
        example_inputs(model)


def test_models_are_identical_across_processes() -> None:
    """No dependence on hash seeds or other per-process state."""
    import hashlib
    import os
    import subprocess
    import sys

    code = (
        "import hashlib; from graph_autofusion import zoo; "
        "print(hashlib.sha256(zoo.build('bert_base', style='dynamo', dynamic_batch=True, "
        "**zoo.TINY['bert_base']).SerializeToString()).hexdigest())"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    other = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    here = zoo.build("bert_base", style="dynamo", dynamic_batch=True, **zoo.TINY["bert_base"])
    assert other.stdout.strip() == hashlib.sha256(here.SerializeToString()).hexdigest()
