"""The exporter conventions each style promises, checked on the graphs themselves."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from zoo_cases import SMALL

from graph_autofusion import zoo
from graph_autofusion.zoo import example_inputs


def build(name: str, **kwargs: object) -> onnx.ModelProto:
    return zoo.build(name, **{**SMALL[name][1], **kwargs})


def producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {out: node for node in model.graph.node for out in node.output}


def ops(model: onnx.ModelProto) -> Counter[str]:
    return Counter(node.op_type for node in model.graph.node)


@pytest.mark.parametrize("style", ["torchscript", "dynamo"])
@pytest.mark.parametrize("name", sorted(SMALL))
def test_identity_of_every_model(name: str, style: str) -> None:
    model = build(name, style=style)
    names = [node.name for node in model.graph.node]
    assert all(names) and len(set(names)) == len(names)
    assert model.producer_name == "graph_autofusion.zoo"
    props = {p.key: p.value for p in model.metadata_props}
    assert props["graph_autofusion.zoo.model"] == name
    assert json.loads(props["graph_autofusion.zoo.args"])["style"] == style


@pytest.mark.parametrize("name", sorted(SMALL))
def test_torchscript_style_uses_constant_nodes_and_no_value_info(name: str) -> None:
    model = build(name, style="torchscript")
    assert model.ir_version == 8
    assert model.opset_import[0].version == 17
    assert not model.graph.value_info
    if name not in ("resnet50",):  # a pure Conv/Relu net has no small constants to emit
        assert ops(model)["Constant"] > 0


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("name", sorted(SMALL))
def test_dynamo_style_uses_initializers_and_full_value_info(name: str, dynamic: bool) -> None:
    model = build(name, style="dynamo", dynamic_batch=dynamic)
    assert model.ir_version == 10
    assert model.opset_import[0].version == 18
    assert ops(model)["Constant"] == 0
    assert ops(model)["Dropout"] == 0
    typed = {v.name for v in model.graph.value_info} | {v.name for v in model.graph.output}
    untyped = [out for node in model.graph.node for out in node.output if out not in typed]
    assert not untyped


@pytest.mark.parametrize("name", sorted(SMALL))
def test_torchscript_style_runs_at_its_oldest_opset(name: str) -> None:
    model = build(name, style="torchscript", opset=13)
    onnx.checker.check_model(model, full_check=True)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert all(np.isfinite(out).all() for out in session.run(None, example_inputs(model)))


def test_torchscript_attention_reshapes_come_from_shape_chains() -> None:
    model = build("bert_base", style="torchscript")
    made_by = producers(model)
    reshapes = [
        n for n in model.graph.node if n.op_type == "Reshape" and made_by[n.input[1]].op_type == "Concat"
    ]
    assert len(reshapes) == 8  # q, k, v split and the merge, in each of 2 layers
    for reshape in reshapes:
        chain = [made_by[i] for i in made_by[reshape.input[1]].input]
        unsqueezed = [made_by[n.input[0]] for n in chain if n.op_type == "Unsqueeze"]
        assert unsqueezed and all(
            g.op_type == "Gather" and made_by[g.input[0]].op_type == "Shape" for g in unsqueezed
        )


def test_dynamo_attention_reshapes_use_constant_shapes() -> None:
    model = build("bert_base", style="dynamo")
    initializers = {t.name for t in model.graph.initializer}
    reshapes = [n for n in model.graph.node if n.op_type == "Reshape"]
    assert reshapes and all(n.input[1] in initializers for n in reshapes)
    assert all(next(a.i for a in n.attribute if a.name == "allowzero") == 1 for n in reshapes)


@pytest.mark.parametrize("style", ["torchscript", "dynamo"])
def test_gelu_is_the_decomposed_erf_form(style: str) -> None:
    model = build("bert_base", style=style)
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    erfs = [n for n in model.graph.node if n.op_type == "Erf"]
    assert len(erfs) == 2
    for erf in erfs:
        assert producers(model)[erf.input[0]].op_type == "Div"
        (add,) = consumers[erf.output[0]]
        (mul,) = consumers[add.output[0]]
        (mul2,) = consumers[mul.output[0]]
        assert (add.op_type, mul.op_type, mul2.op_type) == ("Add", "Mul", "Mul")
    assert "Gelu" not in ops(model)


def test_gpt2_has_its_signature_ops() -> None:
    model = build("gpt2")
    counts = ops(model)
    layers = SMALL["gpt2"][1]["num_layers"]
    assert counts["Where"] == layers and counts["Tanh"] == layers
    assert counts["Pow"] == 2 * layers  # the GELU cube, and TorchScript's sqrt(head_dim) of constants
    assert counts["Gemm"] == 4 * layers and counts["Split"] == layers
    made_by = producers(model)
    for gemm in (n for n in model.graph.node if n.op_type == "Gemm"):
        assert made_by[gemm.input[0]].op_type == "Reshape"
    assert model.graph.node[-1].op_type == "MatMul" and model.graph.output[0].name == "logits"


def test_bert_pooler_and_embeddings() -> None:
    counts = ops(build("bert_base"))
    assert counts["Gemm"] == 1 and counts["Tanh"] == 1
    assert counts["Gather"] >= 4  # word, token type, position and token 0 (plus shape reads)
    assert counts["LayerNormalization"] == 1 + 2 * SMALL["bert_base"][1]["num_layers"]
    assert counts["Dropout"] >= 1


def test_mobilenet_has_depthwise_convs_and_relu6() -> None:
    model = build("mobilenet_v2")
    made_by = producers(model)
    groups = [
        next((a.i for a in n.attribute if a.name == "group"), 1)
        for n in model.graph.node
        if n.op_type == "Conv"
    ]
    blocks = sum(n for _, _, n, _ in SMALL["mobilenet_v2"][1]["setting"])
    assert sum(g > 1 for g in groups) == blocks  # one depthwise conv per inverted residual block
    initializers = {t.name: t for t in model.graph.initializer}
    values = {n.output[0]: n.attribute[0].t for n in model.graph.node if n.op_type == "Constant"}
    for clip in (n for n in model.graph.node if n.op_type == "Clip"):
        bounds = [onnx.numpy_helper.to_array(values.get(i) or initializers[i]).item() for i in clip.input[1:]]
        assert bounds == [0.0, 6.0]
        assert made_by[clip.input[0]].op_type == "BatchNormalization"


def test_conv_nets_keep_one_batchnorm_per_conv() -> None:
    counts = ops(build("resnet50"))
    assert counts["BatchNormalization"] == counts["Conv"] == 17
    assert counts["GlobalAveragePool"] == 1 and counts["Flatten"] == 1 and counts["Gemm"] == 1


def test_dynamo_reduce_mean_takes_axes_as_an_input() -> None:
    (mean,) = [n for n in build("resnet50", style="dynamo").graph.node if n.op_type == "ReduceMean"]
    assert len(mean.input) == 2 and not any(a.name == "axes" for a in mean.attribute)


def test_old_opset_reduce_mean_takes_axes_as_an_attribute() -> None:
    means = [n for n in build("bert_base", opset=16).graph.node if n.op_type == "ReduceMean"]
    assert means and all(len(n.input) == 1 and n.attribute[0].name == "axes" for n in means)


@pytest.mark.parametrize("style", ["torchscript", "dynamo"])
def test_dynamic_batch_makes_symbolic_dims(style: str) -> None:
    bert = build("bert_base", style=style, dynamic_batch=True)
    for value in bert.graph.input:
        assert [d.dim_param for d in value.type.tensor_type.shape.dim] == ["batch", "sequence"]
    resnet = build("resnet50", style=style, dynamic_batch=True)
    dims = resnet.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "batch" and [d.dim_value for d in dims[1:]] == [3, 32, 32]
    assert resnet.graph.output[0].type.tensor_type.shape.dim[0].dim_param == "batch"
