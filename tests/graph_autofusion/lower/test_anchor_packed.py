"""Lowered MatMul/Gemm anchors on the contraction library: a constant weight becomes a `packed`
buffer filled once by the kernel's `prepack`, each tile one `afc_gemm_bp` call; anything else, or
`AUTOFUSION_CONTRACTION=blas`, keeps OpenBLAS. The rendered kernels, called the way the runtime
calls them (prepack once, then the packed array after the parameters, before the workspace),
compute what numpy computes."""

from __future__ import annotations

import ctypes
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from graph_autofusion.backend.cpu.cache import KernelCache
from graph_autofusion.backend.cpu.compiler import KernelSource, compile_kernels
from graph_autofusion.backend.cpu.contraction import CONTRACTION_ENV, library_source
from graph_autofusion.backend.cpu.kernel_spec import KernelSpec, TensorInfo
from graph_autofusion.backend.cpu.render_c import PREPACK_SUFFIX, WORKSPACE_SUFFIX, render_kernel
from graph_autofusion.kernel_ir import Call, Kernel, Loop, format_kernel
from graph_autofusion.lower.anchor import (
    CONTRACTION_ROUTINE,
    PACK_B_ROUTINE,
    PACKED_B_ROUTINE,
    lower_anchor,
    method_of,
)
from graph_autofusion.plan.anchor_match import MatrixView, match_anchor

F = onnx.TensorProto.FLOAT


def _spec(nodes, inputs, outputs, inner=None, weights=(), symbol="k") -> KernelSpec:
    shapes = {**inputs, **outputs, **(inner or {})}
    tensors = {n: TensorInfo(n, tuple(s), F) for n, s in shapes.items()}
    return KernelSpec(
        symbol=symbol,
        template="anchor",
        nodes=tuple(nodes),
        inputs=tuple(tensors[n] for n in inputs),
        outputs=tuple(tensors[n] for n in outputs),
        tensors=tensors,
        weights=frozenset(weights),
    )


def _calls(body) -> list[Call]:
    found = []
    for s in body:
        if isinstance(s, Call):
            found.append(s)
        elif isinstance(s, Loop):
            found += _calls(s.body)
    return found


def _run(kernel: Kernel, inputs: list[np.ndarray], tmp_path: Path) -> list[np.ndarray]:
    """Compile the kernel behind the library, pack once, then call it twice (the packed weights
    must survive a call), with the packed array and the workspace after the parameters."""
    source = library_source() + "\n" + render_kernel(kernel)
    (art,) = compile_kernels(
        [KernelSource(kernel.name, source, uses_blas=False)], cache=KernelCache(tmp_path)
    )
    lib = art.load()
    ins = [np.ascontiguousarray(x, dtype=np.float32) for x in inputs]
    outs = [np.full(b.size, np.nan, np.float32) for b in kernel.params[len(ins) :]]
    ptrs = [a.ctypes.data for a in (*ins, *outs)]
    floats = ctypes.c_int64.in_dll(lib, f"{kernel.name}{PREPACK_SUFFIX}_floats").value
    assert floats >= sum(b.size for b in kernel.packed)
    packed = np.full(floats, np.nan, np.float32)
    prepack = getattr(lib, f"{kernel.name}{PREPACK_SUFFIX}")
    prepack.restype, prepack.argtypes = None, [ctypes.c_void_p, ctypes.c_void_p]
    prepack((ctypes.c_void_p * len(ptrs))(*ptrs), packed.ctypes.data)
    ptrs.append(packed.ctypes.data)
    workspace = None
    if f"{kernel.name}{WORKSPACE_SUFFIX}" in source:
        threads = 8
        workspace = np.zeros(
            ctypes.c_int64.in_dll(lib, f"{kernel.name}{WORKSPACE_SUFFIX}").value * threads, np.uint8
        )
        ptrs += [workspace.ctypes.data, threads]
    fn = getattr(lib, kernel.name)
    fn.restype, fn.argtypes = None, [ctypes.c_void_p]
    for _ in range(2):
        for o in outs:
            o.fill(np.nan)
        fn((ctypes.c_void_p * len(ptrs))(*ptrs))
    return outs


def _bias_relu(weights=("w",)) -> KernelSpec:
    return _spec(
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
    (call,) = _calls(kernel.body)
    assert call.function == PACKED_B_ROUTINE
    (buf,) = kernel.packed
    assert buf.role == "packed"
    (fill,) = _calls(kernel.prepack)
    assert fill.function == PACK_B_ROUTINE
    text = format_kernel(kernel)
    assert f"packed {buf}" in text and "prepack:" in text and "scratch" not in text
    assert "packed once at load" in kernel.description and method_of(kernel) == "gemm"
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal((2, 90, 64)), rng.standard_normal((64, 300)), rng.standard_normal(300)
    (got,) = _run(kernel, [x, w, b], tmp_path)
    np.testing.assert_allclose(got.reshape(2, 90, 300), np.maximum(x @ w + b, 0), rtol=1e-4, atol=1e-4)


def test_blas_mode_and_activations_keep_openblas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CONTRACTION_ENV, "blas")
    kernel = lower_anchor(_bias_relu())
    assert [c.function for c in _calls(kernel.body)] == [CONTRACTION_ROUTINE]
    assert not kernel.packed and not kernel.prepack
    assert f"{PREPACK_SUFFIX}_floats" not in render_kernel(kernel)
    monkeypatch.setenv(CONTRACTION_ENV, "library")
    kernel = lower_anchor(_bias_relu(weights=()))  # `w` an activation: nothing to pack once
    assert [c.function for c in _calls(kernel.body)] == [CONTRACTION_ROUTINE] and not kernel.packed


def test_transposed_weight_with_alpha_and_gemm_addend(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Gemm(transB, alpha, beta * C): B-panels packed from a [N, K] weight (column stride K), tile
    widths no panel divides."""
    monkeypatch.setenv(CONTRACTION_ENV, "library")
    spec = _spec(
        [helper.make_node("Gemm", ["x", "w", "c"], ["o"], alpha=0.5, beta=2.0, transB=1)],
        {"x": (70, 33), "w": (301, 33), "c": (301,)},
        {"o": (70, 301)},
        weights=("w", "c"),
    )
    kernel = lower_anchor(spec)
    assert [c.function for c in _calls(kernel.body)] == [PACKED_B_ROUTINE]
    rng = np.random.default_rng(1)
    x, w, c = rng.standard_normal((70, 33)), rng.standard_normal((301, 33)), rng.standard_normal(301)
    (got,) = _run(kernel, [x, w, c], tmp_path)
    np.testing.assert_allclose(got.reshape(70, 301), 0.5 * x @ w.T + 2.0 * c, rtol=1e-4, atol=1e-4)


def test_packed_weights_and_a_workspace_are_both_passed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A left operand BLAS cannot address still goes through the thread's workspace slice; the
    packed array comes first, then the workspace and its slice count."""
    monkeypatch.setenv(CONTRACTION_ENV, "library")
    bsz, m, k, n = 3, 40, 16, 48
    spec = _spec(
        [helper.make_node("MatMul", ["at", "w"], ["o"])],
        {"at": (bsz, m, k), "w": (k, n)},
        {"o": (bsz, m, n)},
        weights=("w",),
    )
    match = match_anchor(spec)
    p = match.contraction
    assert p is not None
    strided = MatrixView("at", 0, m, k, k * bsz, bsz, (1,))
    contraction = replace(
        p, batch=(bsz,), m=m, a=strided, b=replace(p.b, batch_strides=(0,)), c_batch_strides=(m * n,)
    )
    kernel = lower_anchor(spec, replace(match, contraction=contraction))
    assert method_of(kernel) == "batched_gemm_packed" and kernel.packed
    rng = np.random.default_rng(2)
    a, w = rng.standard_normal((m, k, bsz)), rng.standard_normal((k, n))
    (got,) = _run(kernel, [a, w], tmp_path)
    np.testing.assert_allclose(
        got.reshape(bsz, m, n), np.matmul(a.transpose(2, 0, 1), w), rtol=1e-4, atol=1e-4
    )
