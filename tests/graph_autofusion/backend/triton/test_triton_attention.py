"""One-kernel attention on the Triton targets, in Triton's CPU interpreter, against onnxruntime.

Direct attention blocks (masks, causal, scales, odd and short sequences, head sizes off a power of
two) and the small zoo transformers, planned for each accelerator's profile so the attention
pattern applies; Ascend launches are held to the AI core count and the Unified Buffer.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import graph_autofusion as gaf
from graph_autofusion.backend.triton.blocks import check_ascend
from graph_autofusion.hardware import get_profile
from graph_autofusion.testing.attention_graphs import attention_model
from graph_autofusion.zoo import TINY

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
TARGETS = ("cuda", "ascend910")


def _attention_kernels(compiled):  # type: ignore[no-untyped-def]
    return [k for k in compiled.kernels.values() if k.template == "attention"]


def _check_launches(compiled, target: str) -> None:  # type: ignore[no-untyped-def]
    profile = get_profile(target)
    for kernel in _attention_kernels(compiled):
        (config,) = kernel.configs
        if target == "ascend910":
            assert check_ascend(config, profile) == []
        else:
            assert config.grid == config.nblocks and config.meta["BM"] >= 16


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    ("seq", "head_dim", "mask", "scale", "packed"),
    [(16, 16, None, "div", False), (13, 8, "padding", "div", False), (80, 16, "causal", "div", True),
     (9, 24, "bool", "mul", False), (11, 16, "causal_add", "q", True)],
)  # fmt: skip
def test_attention_block_matches_onnxruntime(  # type: ignore[no-untyped-def]
    target: str, seq: int, head_dim: int, mask: str | None, scale: str, packed: bool, triton_cache
) -> None:
    model, feeds = attention_model(batch=2, heads=2, seq=seq, head_dim=head_dim, mask=mask, scale=scale,
                                   packed=packed)  # fmt: skip
    fused = gaf.fuse(model, gaf.FusionConfig(hardware=target))
    compiled = fused.compile(target=target, cache_dir=triton_cache)
    assert compiled.stats["host_ops"] == []
    assert len(_attention_kernels(compiled)) == 1 and compiled.stats["kernels"] == 1
    _check_launches(compiled, target)
    got = next(iter(compiled(feeds).values()))
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )[0]
    scale_of = max(float(np.max(np.abs(want))), 1.0)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * scale_of * np.sqrt(head_dim))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", ["bert_base", "gpt2", "vit_b16"])
def test_zoo_transformers_take_one_attention_kernel_per_layer(name: str, target: str, triton_cache) -> None:  # type: ignore[no-untyped-def]
    kwargs = {**TINY[name], **({"batch": 1} if name == "vit_b16" else {})}
    model = gaf.zoo.build(name, **kwargs)
    fused = gaf.fuse(model, gaf.FusionConfig(hardware=target))
    unfused_attention = gaf.fuse(model, gaf.FusionConfig(hardware=target, disabled_patterns=["attention"]))
    compiled = fused.compile(target=target, cache_dir=triton_cache)
    layers = kwargs["num_layers"]
    assert len(_attention_kernels(compiled)) >= 1  # identical layers share one kernel
    assert len(fused.plan.kernels) == len(unfused_attention.plan.kernels) - 2 * layers
    assert compiled.stats["host_ops"] == []
    _check_launches(compiled, target)
    result = fused.verify(target=target)
    assert result.passed, [o.to_dict() for o in result.outputs if not o.passed]


EXPORTS = Path(__file__).resolve().parents[3] / "data" / "torch_exports"


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", ["bert_sdpa_tiny_dynamo_opset18", "gpt2_sdpa_tiny_dynamo_opset18"])
def test_sdpa_exports_verify(name: str, target: str, triton_cache) -> None:  # type: ignore[no-untyped-def]
    fused = gaf.fuse(onnx.load(EXPORTS / f"{name}.onnx"), gaf.FusionConfig(hardware=target))
    compiled = fused.compile(target=target, cache_dir=triton_cache)
    assert _attention_kernels(compiled) and compiled.stats["host_ops"] == []
    _check_launches(compiled, target)
    result = fused.verify(target=target)
    assert result.passed, [o.to_dict() for o in result.outputs if not o.passed]
