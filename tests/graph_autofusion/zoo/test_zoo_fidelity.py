"""The zoo against real `torch.onnx.export` output of the same tiny architectures.

The fixtures in tests/data/torch_exports/ come from scripts/export_torch_fixtures.py (which needs
PyTorch; the project does not).  Real exports fold BatchNormalization into Conv in eval mode, so
the conv nets are compared with `fold_batchnorm=True`.
"""

from __future__ import annotations

from collections import Counter

import onnx
import pytest
from zoo_cases import FIXTURES, SMALL

from graph_autofusion import zoo

#: Ops that carry the computation (anchors, reductions, activations, layout changes); what is left
#: out is shape plumbing and exporter bookkeeping, which differs with how shapes were traced.
COMPUTE = {
    "Conv", "Gemm", "MatMul", "LayerNormalization", "Softmax", "Erf", "Tanh", "Relu", "Clip", "MaxPool",
    "GlobalAveragePool", "ReduceMean", "Flatten", "Split", "Div", "Transpose", "Squeeze", "Pow", "Where",
}  # fmt: skip
#: Op types only a real TorchScript export has: Identity for deduplicated parameters, and
#: ConstantOfShape from lowering `torch.full`.
EXPORTER_ONLY = {"Identity", "ConstantOfShape"}


def fixture(stem: str, style: str, dynamic: bool = False) -> onnx.ModelProto:
    opset = 17 if style == "torchscript" else 18
    tag = f"{style}_dynamic" if dynamic else style
    return onnx.load(str(FIXTURES / f"{stem}_tiny_{tag}_opset{opset}.onnx"))


def zoo_model(name: str, style: str, dynamic: bool = False) -> onnx.ModelProto:
    kwargs = dict(SMALL[name][1])
    if name in ("resnet50", "mobilenet_v2"):
        kwargs["fold_batchnorm"] = True
    return zoo.build(name, style=style, dynamic_batch=dynamic, **kwargs)


def histogram(model: onnx.ModelProto, only: set[str] | None = None) -> Counter[str]:
    return Counter(n.op_type for n in model.graph.node if only is None or n.op_type in only)


def test_fixtures_are_small() -> None:
    files = sorted(FIXTURES.glob("*.onnx"))
    assert len(files) == 19  # 16 eager-attention exports, 3 with fused attention (SDPA)
    assert all(f.stat().st_size < 1_000_000 for f in files)
    assert sum(f.stat().st_size for f in files) < 6_000_000


@pytest.mark.parametrize("name", sorted(SMALL))
def test_dynamo_style_matches_the_real_export_op_for_op(name: str) -> None:
    real = fixture(SMALL[name][0], "dynamo")
    assert histogram(zoo_model(name, "dynamo")) == histogram(real)


@pytest.mark.parametrize("name", ["bert_base", "gpt2"])
def test_dynamic_dynamo_style_matches_the_real_export(name: str) -> None:
    real = fixture(SMALL[name][0], "dynamo", dynamic=True)
    mine = zoo_model(name, "dynamo", dynamic=True)
    assert histogram(mine, COMPUTE) == histogram(real, COMPUTE)
    assert set(histogram(mine)) == set(histogram(real))


@pytest.mark.parametrize("name", sorted(SMALL))
def test_torchscript_style_matches_the_real_export_in_compute_ops(name: str) -> None:
    real = fixture(SMALL[name][0], "torchscript")
    mine = zoo_model(name, "torchscript")
    assert histogram(mine, COMPUTE) == histogram(real, COMPUTE)
    assert set(histogram(real)) - EXPORTER_ONLY <= set(histogram(mine))


@pytest.mark.parametrize("name", ["bert_base"])
def test_dynamic_torchscript_style_matches_the_real_export(name: str) -> None:
    real = fixture(SMALL[name][0], "torchscript", dynamic=True)
    mine = zoo_model(name, "torchscript", dynamic=True)
    assert histogram(mine, COMPUTE) == histogram(real, COMPUTE)
    assert set(histogram(real)) - EXPORTER_ONLY <= set(histogram(mine))


@pytest.mark.parametrize("style", ["torchscript", "dynamo"])
@pytest.mark.parametrize("name", sorted(SMALL))
def test_io_signature_matches_the_real_export(name: str, style: str) -> None:
    real = fixture(SMALL[name][0], style)
    mine = zoo_model(name, style)

    def signature(values: object) -> list[tuple[str, int, list[int]]]:
        return [
            (v.name, v.type.tensor_type.elem_type, [d.dim_value for d in v.type.tensor_type.shape.dim])
            for v in values  # type: ignore[attr-defined]
        ]

    assert signature(mine.graph.input) == signature(real.graph.input)
    assert signature(mine.graph.output) == signature(real.graph.output)
