"""fold_batchnorm: BN after Conv/ConvTranspose folds into the weights and the outputs do not move."""

from __future__ import annotations

import numpy as np
import pytest
from canon_helpers import assert_same_outputs, build_model, ops, random_feeds, tensor
from onnx import helper

from graph_autofusion.canonicalize import canonicalize
from graph_autofusion.config import FusionConfig


def bn_params(rng: np.random.Generator, channels: int, prefix: str = "bn") -> dict[str, np.ndarray]:
    """Statistics of a trained network: unit-ish scales, running variance far from 1."""
    return {
        f"{prefix}_scale": rng.uniform(0.5, 1.5, channels).astype(np.float32),
        f"{prefix}_bias": rng.normal(0, 0.5, channels).astype(np.float32),
        f"{prefix}_mean": rng.normal(0, 2.0, channels).astype(np.float32),
        f"{prefix}_var": rng.uniform(0.05, 4.0, channels).astype(np.float32),
    }


def bn_node(x: str, y: str, prefix: str = "bn", **attrs: float) -> object:
    names = [f"{prefix}_{p}" for p in ("scale", "bias", "mean", "var")]
    return helper.make_node("BatchNormalization", [x, *names], [y], **attrs)


@pytest.mark.parametrize("with_bias", [True, False])
def test_conv_batchnorm_folds_and_matches(with_bias: bool):
    rng = np.random.default_rng(1)
    inits = {"w": (rng.standard_normal((16, 8, 3, 3)) * 0.2).astype(np.float32), **bn_params(rng, 16)}
    conv_inputs = ["x", "w"]
    if with_bias:
        inits["b"] = rng.normal(0, 1, 16).astype(np.float32)
        conv_inputs.append("b")
    nodes = [
        helper.make_node("Conv", conv_inputs, ["c"], pads=[1, 1, 1, 1]),
        bn_node("c", "bn_out", epsilon=1e-3),
        helper.make_node("Relu", ["bn_out"], ["y"]),
    ]
    model = build_model(nodes, [tensor("x", [2, 8, 10, 10])], [tensor("y", [2, 16, 10, 10])], inits)
    result, counts = canonicalize(model, FusionConfig())

    assert ops(result) == ["Conv", "Relu"]
    assert counts["fold_batchnorm"] == 1
    assert len(result.graph.node[0].input) == 3  # a bias was created when the Conv had none
    assert_same_outputs(model, result, random_feeds(model))


def test_conv_transpose_batchnorm_with_groups_folds_and_matches():
    rng = np.random.default_rng(2)
    # ConvTranspose weights: [C_in, C_out / group, kH, kW]; 8 in, 2 groups of 3 → 6 out channels.
    inits = {"w": (rng.standard_normal((8, 3, 3, 3)) * 0.2).astype(np.float32), **bn_params(rng, 6)}
    nodes = [
        helper.make_node("ConvTranspose", ["x", "w"], ["c"], group=2, strides=[2, 2]),
        bn_node("c", "y"),
    ]
    model = build_model(nodes, [tensor("x", [1, 8, 5, 5])], [tensor("y", [1, 6, 11, 11])], inits)
    result, counts = canonicalize(model, FusionConfig())
    assert ops(result) == ["ConvTranspose"]
    assert counts["fold_batchnorm"] == 1
    assert result.graph.node[0].output[0] == "y"
    assert_same_outputs(model, result, random_feeds(model))


def test_bn_is_kept_when_the_conv_output_has_another_reader():
    rng = np.random.default_rng(3)
    inits = {"w": rng.standard_normal((4, 3, 1, 1)).astype(np.float32), **bn_params(rng, 4)}
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"]),
        bn_node("c", "bn_out"),
        helper.make_node("Add", ["bn_out", "c"], ["y"]),
    ]
    model = build_model(nodes, [tensor("x", [1, 3, 4, 4])], [tensor("y", [1, 4, 4, 4])], inits)
    result, counts = canonicalize(model, FusionConfig())
    assert counts["fold_batchnorm"] == 0
    assert "BatchNormalization" in ops(result)
    assert_same_outputs(model, result, random_feeds(model))


def test_weights_shared_by_two_convs_are_not_changed_under_the_other():
    rng = np.random.default_rng(4)
    inits = {"w": rng.standard_normal((4, 4, 1, 1)).astype(np.float32), **bn_params(rng, 4)}
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c1"]),
        bn_node("c1", "b1"),
        helper.make_node("Conv", ["b1", "w"], ["y"]),
    ]
    model = build_model(nodes, [tensor("x", [1, 4, 3, 3])], [tensor("y", [1, 4, 3, 3])], inits)
    result, counts = canonicalize(model, FusionConfig())
    assert counts["fold_batchnorm"] == 1
    assert result.graph.node[1].input[1] == "w"
    assert result.graph.node[0].input[1] != "w"
    assert_same_outputs(model, result, random_feeds(model))
