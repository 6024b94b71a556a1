"""A 1x1 Conv feeding a depthwise 3x3 Conv lowered from the planner's conv `ChainMatch`
(lower/conv_chain.py): per run of output rows, bands computed by the library's afc_pw_dw3x3 from
the expansion in a per-thread workspace slice, each finished by the epilogue. Every kernel is
compiled, called the way the runtime calls it (prepack once, packed array, workspace) and compared
with onnxruntime."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from lowered_kernels import calls
from onnx import helper

from graph_autofusion.backend.cpu.contraction import CONTRACTION_ENV
from graph_autofusion.backend.cpu.render_c import WORKSPACE_SLICES
from graph_autofusion.kernel_ir import Loop
from graph_autofusion.lower.conv_chain import (
    BAND_FLOATS,
    BAND_ROWS,
    DW_PW_ROUTINE,
    PW_DW_ROUTINE,
    band_rows,
    lower_conv_chain,
    mid_floats,
)
from graph_autofusion.lower.values import Unsupported

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "backend" / "cpu" / "codegen"))
from anchor_helpers import check, make_case, rand, spec_for

N = helper.make_node
BOUNDS = {"lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32)}


def _block(
    rng: np.random.Generator,
    *,
    n: int,
    cin: int,
    cexp: int,
    h: int,
    w: int,
    stride: int,
    middle: str,
    biases: bool = True,
    residual: bool = False,
):
    """x -> Conv 1x1 [bias] -> [Clip(0, 6) | Relu] -> depthwise Conv 3x3 [bias] -> Clip(0, 6)
    [-> + r]: MobileNetV2's expansion and depthwise conv, the output added to an input `r`."""
    oh, ow = (h - 1) // stride + 1, (w - 1) // stride + 1
    b1, b2 = (["b1"], ["b2"]) if biases else ([], [])
    nodes = [N("Conv", ["x", "w1", *b1], ["e"])]
    between = "e"
    if middle == "Clip":
        nodes.append(N("Clip", ["e", "lo", "hi"], ["a"]))
        between = "a"
    elif middle == "Relu":
        nodes.append(N("Relu", ["e"], ["a"]))
        between = "a"
    nodes += [
        N("Conv", [between, "w2", *b2], ["d"], group=cexp, strides=[stride, stride], pads=[1, 1, 1, 1]),
        N("Clip", ["d", "lo", "hi"], ["y" if residual else "o"]),
    ]
    inputs = {"x": rand(rng, n, cin, h, w)}
    if residual:
        nodes.append(N("Add", ["y", "r"], ["o"]))
        inputs["r"] = rand(rng, n, cexp, oh, ow)
    weights = {"w1": rand(rng, cexp, cin, 1, 1), "w2": rand(rng, cexp, 1, 3, 3), **BOUNDS}
    if biases:
        weights |= {"b1": rand(rng, cexp), "b2": rand(rng, cexp)}
    return make_case(nodes, inputs, ["o"], weights, template="anchor_chain")


def _lowered(model, symbol: str, routine: str) -> Loop:  # type: ignore[no-untyped-def]
    """The chain's lowered loop: a static parallel loop of a run of each image's output rows per
    thread (as many runs as workspace slices) with its `mid` workspace slice, one call of
    `routine` a band, the 1x1 conv's weight packed once."""
    spec, _ = spec_for(model, symbol, weights=True)
    kernel = lower_conv_chain(spec)
    (loop,) = kernel.body
    assert isinstance(loop, Loop) and [b.name for b in loop.scratch] == ["mid"]
    assert [c.function for c in calls(kernel.body)] == [routine] and len(kernel.packed) == 1
    assert WORKSPACE_SLICES in str(loop.stop) and loop.parallel and not loop.dynamic
    return loop


@pytest.fixture(autouse=True)
def library(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CONTRACTION_ENV, "library")


CASES = [
    # MobileNetV2's 16 -> 96 at 112x112, stride 2 (bands of the 512 KiB budget, two runs)
    dict(n=1, cin=16, cexp=96, h=112, w=112, stride=2, middle="Clip"),
    # odd sizes, two images (four runs), several bands per run, the last one shorter
    dict(n=2, cin=5, cexp=72, h=61, w=59, stride=2, middle="Clip"),
    # stride 1, a Relu, no biases, the output added to another input band by band
    dict(n=1, cin=7, cexp=64, h=64, w=65, stride=1, middle="Relu", biases=False, residual=True),
    # nothing between the convs
    dict(n=1, cin=3, cexp=80, h=57, w=58, stride=1, middle="none"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['h']}x{c['w']}s{c['stride']}{c['middle']}")
def test_the_chain_matches_onnxruntime(case: dict) -> None:
    rng = np.random.default_rng(case["h"] + case["cexp"])
    model = _block(rng, **case)
    loop = _lowered(model, "chain", PW_DW_ROUTINE)
    oh = (case["h"] - 1) // case["stride"] + 1
    band = band_rows(case["cexp"], case["w"], case["stride"], oh)
    assert loop.scratch[0].size == mid_floats(case["cexp"], case["w"], case["stride"], band)
    # the expansion reaches 6 (Clip) or a few units (Relu): 9 taps of it
    check(model, "chain", k=9 * case["cin"], method="conv_depthwise_chain", weights=True, scale=4.0)


def test_bands_fit_the_budget_and_the_run() -> None:
    assert band_rows(96, 112, 2, 28) == 5  # 96 x 11 rows x 112 floats within 128 Ki floats
    assert band_rows(144, 56, 1, 28) == 8  # BAND_ROWS
    assert band_rows(8, 8, 1, 3) == 3  # the run
    assert band_rows(4096, 1024, 2, 10) == 1  # at least one row


def test_without_the_library_the_chain_is_two_stages(monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenBLAS (the `blas` mode) runs no band chain: the lowering says so and the two convs run
    one after the other in the same kernel, still matching onnxruntime."""
    monkeypatch.setenv(CONTRACTION_ENV, "blas")
    rng = np.random.default_rng(3)
    model = _block(rng, n=1, cin=4, cexp=64, h=64, w=64, stride=2, middle="Clip")
    spec, _ = spec_for(model, "staged", weights=True)
    with pytest.raises(Unsupported, match="contraction library"):
        lower_conv_chain(spec)
    check(model, "staged", k=36, method="conv_chain_staged", weights=True, scale=4.0)


def _separable(
    rng: np.random.Generator,
    *,
    n: int,
    c: int,
    cout: int,
    h: int,
    w: int,
    stride: int,
    middle: str,
    residual: bool,
):
    """x -> depthwise Conv 3x3 (bias) -> [Clip(0, 6) | none] -> Conv 1x1 -> [+ r]: a
    depthwise-separable conv (MobileNetV2's first block, its projection without a bias here)."""
    oh, ow = (h - 1) // stride + 1, (w - 1) // stride + 1
    nodes = [N("Conv", ["x", "w1", "b1"], ["d"], group=c, strides=[stride, stride], pads=[1, 1, 1, 1])]
    between = "d"
    if middle == "Clip":
        nodes.append(N("Clip", ["d", "lo", "hi"], ["a"]))
        between = "a"
    nodes.append(N("Conv", [between, "w2"], ["p" if residual else "o"]))
    inputs = {"x": rand(rng, n, c, h, w)}
    if residual:
        nodes.append(N("Add", ["p", "r"], ["o"]))
        inputs["r"] = rand(rng, n, cout, oh, ow)
    weights = {"w1": rand(rng, c, 1, 3, 3), "b1": rand(rng, c), "w2": rand(rng, cout, c, 1, 1), **BOUNDS}
    return make_case(nodes, inputs, ["o"], weights, template="anchor_chain")


@pytest.mark.parametrize(
    "case",
    [
        # MobileNetV2's first block: 32 channels at 112x112 into 16
        dict(n=1, c=32, cout=16, h=112, w=112, stride=1, middle="Clip", residual=False),
        # two images, odd sizes, stride 2, nothing between, the output added to another input
        dict(n=2, c=48, cout=24, h=111, w=109, stride=2, middle="none", residual=True),
    ],
    ids=lambda c: f"{c['h']}x{c['w']}s{c['stride']}{c['middle']}",
)
def test_a_depthwise_conv_into_a_1x1_conv_matches_onnxruntime(case: dict) -> None:
    rng = np.random.default_rng(case["h"] + case["c"])
    model = _separable(rng, **case)
    loop = _lowered(model, "separable", DW_PW_ROUTINE)
    oh, ow = ((size - 1) // case["stride"] + 1 for size in (case["h"], case["w"]))
    band = max(1, min(BAND_ROWS, oh, BAND_FLOATS // (case["c"] * ow)))  # the band's depthwise rows
    assert loop.scratch[0].size == case["c"] * band * ow
    check(model, "separable", k=9 * case["c"], method="conv_depthwise_chain", weights=True, scale=4.0)
