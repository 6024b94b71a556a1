"""The attention match: which groups the planner makes one attention kernel, and what it records.

Legality is "the match succeeds": the planner asks `match_attention` on the spec the group would
become, and the backends ask it again on the fused model's function body.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

import graph_autofusion as gaf
from graph_autofusion.backend.cpu.extract import extract
from graph_autofusion.lower.values import Unsupported
from graph_autofusion.plan.attention_match import AttentionMatch, match_attention
from graph_autofusion.plan.patterns import Attention
from graph_autofusion.plan.reduction_match import group_spec
from graph_autofusion.testing.attention_graphs import attention_model
from graph_autofusion.zoo import TINY


def _fuse(model, hardware: str = "cuda") -> gaf.FusedGraph:  # type: ignore[no-untyped-def]
    return gaf.fuse(model, gaf.FusionConfig(hardware=hardware))


def _attention_matches(fused: gaf.FusedGraph) -> list[AttentionMatch]:
    """The matches of the fused model's attention kernels, from the form that travels."""
    specs = [s for s in extract(fused.model).specs.values() if s.template == "attention"]
    return [match_attention(s) for s in specs]


@pytest.mark.parametrize(
    ("mask", "scale", "packed"),
    [(None, "div", False), ("padding", "div", False), ("causal", "div", True), ("bool", "mul", False),
     ("causal_add", "mul", True), (None, "q", False), ("padding", "none", True)],
)  # fmt: skip
def test_attention_blocks_become_one_kernel(mask: str | None, scale: str, packed: bool) -> None:
    model, _ = attention_model(batch=2, heads=3, seq=13, head_dim=16, mask=mask, scale=scale, packed=packed)
    fused = _fuse(model)
    kernels = list(fused.plan.kernels)
    assert [g.template for g in kernels] == ["attention"], [(g.template, g.members) for g in kernels]
    (m,) = _attention_matches(fused)
    assert (m.batch, m.heads, m.seq_q, m.seq_k, m.head_dim, m.value_dim) == (2, 3, 13, 13, 16, 16)
    assert m.scale == pytest.approx(1.0 if scale == "none" else 0.25, rel=1e-6)
    assert (m.mask is not None) == (mask in ("padding", "causal_add"))
    assert m.causal == (0 if mask == "causal" else None)
    assert (m.cond is not None) == (mask == "bool")
    hd = 3 * 16
    row = 3 * hd if packed else hd
    # Q read in place: [B, S, H*D] (or a third of the packed row) seen as [B, H, S, D]
    assert m.q.strides == (13 * row, 16, row, 1)
    assert m.k.strides == (13 * row, 16, row, 1)
    assert m.k.offset == (hd if packed else 0) and m.v.offset == (2 * hd if packed else 0)
    assert m.out.strides == (13 * hd, 16, hd, 1)  # written straight into [B, S, H*D]


def test_padding_mask_broadcasts_over_heads_and_queries() -> None:
    model, _ = attention_model(mask="padding")
    (m,) = _attention_matches(_fuse(model))
    assert m.mask is not None and m.mask.strides == (16, 0, 0, 1)


def test_a_triangle_that_is_not_causal_stays_a_mask() -> None:
    model, _ = attention_model(seq=8, mask="causal")
    bias = next(i for i in model.graph.initializer if i.name == "causal_bias")
    values = np.triu(np.ones((8, 8), dtype=bool)).reshape(1, 1, 8, 8)  # upper: not a causal mask
    bias.CopyFrom(numpy_helper.from_array(values, "causal_bias"))
    (m,) = _attention_matches(_fuse(model))
    assert m.causal is None and m.cond is not None


def test_softmax_over_another_axis_is_not_attention() -> None:
    model, _ = attention_model(seq=8)
    softmax = next(n for n in model.graph.node if n.op_type == "Softmax")
    softmax.attribute[0].i = 2
    fused = _fuse(model)
    assert "attention" not in [g.template for g in fused.plan.groups]
    refused = [r for r in fused.plan.refused if r.source == "pattern:attention"]
    assert refused and "last axis" in refused[0].detail


def test_scores_read_outside_are_not_fused() -> None:
    model, _ = attention_model(seq=8)
    model.graph.output.append(helper.make_tensor_value_info("probs", 1, [2, 2, 8, 8]))
    fused = _fuse(model)
    assert "attention" not in [g.template for g in fused.plan.groups]


def test_match_refuses_a_group_without_attention() -> None:
    model, _ = attention_model(seq=8)
    fused = gaf.fuse(model, gaf.FusionConfig(hardware="cuda", disabled_patterns=["attention"]))
    g = fused.plan.graph
    softmax = [i for i, n in enumerate(g.nodes) if n.op_type == "Softmax"]
    with pytest.raises(Unsupported):
        match_attention(group_spec(g, softmax))


def test_every_profile_forms_attention_unless_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    # the cpu profile included: its attention kernel beat the unfused path (plan/patterns.py)
    model, _ = attention_model(seq=8, mask="padding")
    monkeypatch.delenv(Attention.ENV, raising=False)
    for hardware in ("cpu", "ascend910", "cuda"):
        assert "attention" in [g.template for g in _fuse(model, hardware).plan.groups]
    monkeypatch.setenv(Attention.ENV, "on")
    assert "attention" in [g.template for g in _fuse(model, "cpu").plan.groups]
    monkeypatch.setenv(Attention.ENV, "off")
    for hardware in ("cpu", "cuda"):
        assert "attention" not in [g.template for g in _fuse(model, hardware).plan.groups]
    monkeypatch.delenv(Attention.ENV)
    off = gaf.fuse(model, gaf.FusionConfig(hardware="cpu", disabled_patterns=["attention"]))
    assert "attention" not in [g.template for g in off.plan.groups]


@pytest.mark.parametrize(
    ("name", "causal", "masked"), [("bert_base", None, True), ("gpt2", 0, False), ("vit_b16", None, False)]
)
def test_zoo_attention_is_one_kernel_per_layer(name: str, causal: int | None, masked: bool) -> None:
    model = gaf.zoo.build(name, **TINY[name])
    with_attention = _fuse(model)
    without = gaf.fuse(model, gaf.FusionConfig(hardware="cuda", disabled_patterns=["attention"]))
    layers = TINY[name]["num_layers"]
    groups = [g for g in with_attention.plan.groups if g.template == "attention"]
    assert len(groups) == layers
    # scores, softmax and the two contractions were three kernels: now one
    assert len(with_attention.plan.kernels) == len(without.plan.kernels) - 2 * layers
    matches = _attention_matches(with_attention)
    assert matches and all(m.causal == causal and (m.mask is not None) == masked for m in matches)


def test_backends_see_the_causal_triangle_the_planner_saw() -> None:
    # 80 x 80 bool is past the size up to which constants travel as values for other templates
    model, _ = attention_model(seq=80, mask="causal", packed=True)
    fused = _fuse(model)
    (m,) = _attention_matches(fused)
    assert m.causal == 0 and m.cond is None and m.skips_blocks


@pytest.mark.parametrize("cost_model", ["memory_bandwidth", "latency", "compute_density"])
def test_every_strategy_forms_attention(cost_model: str) -> None:
    # compute_density keeps two anchors apart (NF007), but not attention's pair
    model, _ = attention_model(seq=8, mask="padding")
    fused = gaf.fuse(model, gaf.FusionConfig(hardware="cuda", cost_model=cost_model))
    assert [g.template for g in fused.plan.kernels] == ["attention"]
