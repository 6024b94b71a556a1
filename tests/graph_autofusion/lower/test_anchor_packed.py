"""Lowered MatMul/Gemm anchors on the contraction library: a constant weight becomes a `packed`
buffer filled once by the kernel's `prepack`, each tile one `afc_gemm_bp` call; anything else, or
`AUTOFUSION_CONTRACTION=blas`, keeps OpenBLAS. The rendered kernels, called the way the runtime
calls them (prepack once, then the packed array after the parameters, before the workspace),
compute what numpy computes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from lowered_kernels import anchor_spec, calls, check_strided_operand_matmul, run, strided_operand_matmul
from onnx import helper

from graph_autofusion.backend.cpu.contraction import CONTRACTION_ENV
from graph_autofusion.backend.cpu.kernel_spec import KernelSpec
from graph_autofusion.backend.cpu.render_c import PREPACK_SUFFIX, render_kernel
from graph_autofusion.kernel_ir import format_kernel
from graph_autofusion.lower.anchor import (
    BEGIN_CALL_ROUTINE,
    CONTRACTION_ROUTINE,
    PACK_B_ROUTINE,
    PACKED_B_INPUT_ROUTINE,
    lower_anchor,
    method_of,
)


def _bias_relu(weights=("w",)) -> KernelSpec:
    return anchor_spec(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "b"], ["z"]),
         helper.make_node("Relu", ["z"], ["o"])],
        {"x": (2, 90, 64), "w": (64, 300), "b": (300,)},
        {"o": (2, 90, 300)},
        {"y": (2, 90, 300), "z": (2, 90, 300)},
        weights=weights,
    )  # fmt: skip


def test_a_weight_packs_once_and_each_tile_calls_the_library(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(CONTRACTION_ENV, "library")
    kernel = lower_anchor(_bias_relu())
    # the activation is a kernel input: each thread packs it once per call (marked at the start)
    begin, call = calls(kernel.body)
    assert (begin.function, call.function) == (BEGIN_CALL_ROUTINE, PACKED_B_INPUT_ROUTINE)
    assert kernel.body[0] == begin
    (buf,) = kernel.packed
    assert buf.role == "packed"
    (fill,) = calls(kernel.prepack)
    assert fill.function == PACK_B_ROUTINE
    text = format_kernel(kernel)
    assert f"packed {buf}" in text and "prepack:" in text and "scratch" not in text
    assert "packed once at load" in kernel.description and method_of(kernel) == "gemm"
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal((2, 90, 64)), rng.standard_normal((64, 300)), rng.standard_normal(300)
    (got,) = run(kernel, [x, w, b], tmp_path)
    np.testing.assert_allclose(got.reshape(2, 90, 300), np.maximum(x @ w + b, 0), rtol=1e-4, atol=1e-4)


def test_blas_mode_and_activations_keep_openblas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CONTRACTION_ENV, "blas")
    kernel = lower_anchor(_bias_relu())
    assert [c.function for c in calls(kernel.body)] == [CONTRACTION_ROUTINE]
    assert not kernel.packed and not kernel.prepack
    assert f"{PREPACK_SUFFIX}_floats" not in render_kernel(kernel)
    monkeypatch.setenv(CONTRACTION_ENV, "library")
    kernel = lower_anchor(_bias_relu(weights=()))  # `w` an activation: nothing to pack once
    assert [c.function for c in calls(kernel.body)] == [CONTRACTION_ROUTINE] and not kernel.packed


def test_transposed_weight_with_alpha_and_gemm_addend(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Gemm(transB, alpha, beta * C): B-panels packed from a [N, K] weight (column stride K), tile
    widths no panel divides."""
    monkeypatch.setenv(CONTRACTION_ENV, "library")
    spec = anchor_spec(
        [helper.make_node("Gemm", ["x", "w", "c"], ["o"], alpha=0.5, beta=2.0, transB=1)],
        {"x": (70, 33), "w": (301, 33), "c": (301,)},
        {"o": (70, 301)},
        weights=("w", "c"),
    )
    kernel = lower_anchor(spec)
    assert [c.function for c in calls(kernel.body)] == [BEGIN_CALL_ROUTINE, PACKED_B_INPUT_ROUTINE]
    rng = np.random.default_rng(1)
    x, w, c = rng.standard_normal((70, 33)), rng.standard_normal((301, 33)), rng.standard_normal(301)
    (got,) = run(kernel, [x, w, c], tmp_path)
    np.testing.assert_allclose(got.reshape(70, 301), 0.5 * x @ w.T + 2.0 * c, rtol=1e-4, atol=1e-4)


def test_packed_weights_and_a_workspace_are_both_passed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A left operand BLAS cannot address still goes through the thread's workspace slice; the
    packed array comes first, then the workspace and its slice count."""
    monkeypatch.setenv(CONTRACTION_ENV, "library")
    kernel = strided_operand_matmul(weights=("w",))
    assert method_of(kernel) == "batched_gemm_packed" and kernel.packed
    check_strided_operand_matmul(kernel, tmp_path, seed=2, rtol=1e-4)
