"""The attention kernel on the CPU (lower/attention.py through the C renderer) against onnxruntime.

Groups are planned for an accelerator profile (where the planner forms attention by default);
the fused model is the same whatever target compiles it, so the CPU runtime runs those kernels.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import graph_autofusion as gaf
from graph_autofusion.backend.cpu.extract import extract
from graph_autofusion.kernel_ir import Call, Loop
from graph_autofusion.lower.attention import TILE_ROWS, lower_attention
from graph_autofusion.testing.attention_graphs import attention_model
from graph_autofusion.zoo import TINY


def _run_both(model, feeds):  # type: ignore[no-untyped-def]
    fused = gaf.fuse(model, gaf.FusionConfig(hardware="cuda"))
    compiled = fused.compile()
    assert compiled.stats["host_ops"] == []
    got = next(iter(compiled(feeds).values()))
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )[0]
    return fused, got, want


CASES = [(16, 16, None, "div", False), (13, 8, "padding", "div", False), (37, 16, "causal", "div", True),
         (9, 32, "bool", "mul", False), (11, 16, "causal_add", "q", True), (1, 4, "causal", "mul", False),
         (70, 8, "causal", "mul", False),
         # D and Dv of 40: a K^T panel and a V panel past the first (32 columns on AVX-512, 16 on
         # AVX2), the second partial; 131 keys and rows: partial panels, row tiles and a short block
         (131, 40, "causal", "div", False), (131, 40, "padding", "div", True)]  # fmt: skip


@pytest.mark.parametrize("heads_inner", [False, True], ids=["sgemm", "loops"])
@pytest.mark.parametrize(("seq", "head_dim", "mask", "scale", "packed"), CASES)
def test_attention_kernel_matches_onnxruntime(
    seq: int, head_dim: int, mask: str | None, scale: str, packed: bool, heads_inner: bool
) -> None:
    model, feeds = attention_model(batch=2, heads=3, seq=seq, head_dim=head_dim, mask=mask, scale=scale,
                                   packed=packed, heads_inner=heads_inner)  # fmt: skip
    fused, got, want = _run_both(model, feeds)
    assert [g.template for g in fused.plan.kernels] == ["attention"]
    # softmax rows sum to one: the output is a convex mix of V rows (|v| ~ N(0, 1)); fp32 dot
    # products over D terms and a row of S exponentials bound the error by a few ulps of that
    scale_of = float(np.max(np.abs(want)))
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * max(scale_of, 1.0) * np.sqrt(head_dim))


def _calls(body) -> list[str]:  # type: ignore[no-untyped-def]
    out = []
    for s in body:
        if isinstance(s, Call):
            out.append(s.function)
        elif isinstance(s, Loop):
            out += _calls(s.body)
    return out


@pytest.mark.parametrize(
    ("heads_inner", "scratch", "calls"),
    [
        # score rows padded to 32 floats; K^T (16 x 20 keys) and V (20 keys x 16) packed in
        # 32-column panels, once per task
        (False, {"af_scores": TILE_ROWS * 32, "af_norms": TILE_ROWS, "af_kt": 16 * 32, "af_vp": 20 * 32},
         ["afa_pack_kt", "afa_pack_v", "afa_qk", "afa_softmax_row", "afa_pv"]),
        (True, {"af_scores": TILE_ROWS * 32, "af_norms": TILE_ROWS, "af_kt": 16 * 32, "af_vp": 20 * 32},
         ["afa_pack_kt", "afa_pack_v", "afa_qk", "afa_softmax_row", "afa_pv"]),
    ],
)  # fmt: skip
def test_kernel_takes_a_workspace_slice_and_a_parallel_loop(heads_inner: bool, scratch, calls) -> None:  # type: ignore[no-untyped-def]
    model, _ = attention_model(seq=20, mask="padding", heads_inner=heads_inner)
    fused = gaf.fuse(model, gaf.FusionConfig(hardware="cuda"))
    (spec,) = [s for s in extract(fused.model).specs.values() if s.template == "attention"]
    kernel = lower_attention(dataclasses.replace(spec, symbol="k"))
    (loop,) = kernel.body
    assert isinstance(loop, Loop) and loop.parallel
    assert {b.name: b.size for b in loop.scratch} == scratch
    assert _calls(loop.body) == calls


@pytest.mark.parametrize("name", ["bert_base", "gpt2", "vit_b16"])
def test_zoo_models_with_attention_kernels_verify(name: str) -> None:
    fused = gaf.fuse(gaf.zoo.build(name, **TINY[name]), gaf.FusionConfig(hardware="cuda"))
    assert any(g.template == "attention" for g in fused.plan.groups)
    result = fused.verify()
    assert result.passed, [o.to_dict() for o in result.outputs if not o.passed]
    assert fused.compile().stats["host_ops"] == []


EXPORTS = Path(__file__).resolve().parents[2] / "data" / "torch_exports"
REAL = [
    "bert_tiny_torchscript_opset17",
    "bert_sdpa_tiny_dynamo_opset18",
    "gpt2_tiny_dynamo_opset18",
    "gpt2_sdpa_tiny_dynamo_opset18",
    "vit_tiny_torchscript_opset17",
    "vit_sdpa_tiny_dynamo_opset18",
]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("name", REAL)
def test_real_exports_take_attention_kernels(name: str) -> None:
    """PyTorch's own exports (eager and SDPA attention, both exporters) match and verify."""
    fused = gaf.fuse(onnx.load(EXPORTS / f"{name}.onnx"), gaf.FusionConfig(hardware="cuda"))
    assert sum(g.template == "attention" for g in fused.plan.groups) == 2  # one per layer
    result = fused.verify()
    assert result.passed, [o.to_dict() for o in result.outputs if not o.passed]
    assert fused.compile().stats["host_ops"] == []
