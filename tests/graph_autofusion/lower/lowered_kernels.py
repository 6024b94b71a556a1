"""What the lowered-anchor tests share: a spec from shapes, the contraction calls of a kernel, a
MatMul whose left operand BLAS cannot address, and a harness that compiles a lowered kernel and
calls it the way the runtime does."""

from __future__ import annotations

import ctypes
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from graph_autofusion.backend.cpu.blas import BLAS_PREAMBLE
from graph_autofusion.backend.cpu.cache import KernelCache
from graph_autofusion.backend.cpu.codegen.anchor import uses_library
from graph_autofusion.backend.cpu.compiler import KernelSource, compile_kernels
from graph_autofusion.backend.cpu.contraction import library_source
from graph_autofusion.backend.cpu.kernel_spec import KernelSpec, TensorInfo
from graph_autofusion.backend.cpu.render_c import PREPACK_SUFFIX, WORKSPACE_SUFFIX, render_kernel
from graph_autofusion.kernel_ir import Call, Kernel, Loop, Stmt
from graph_autofusion.lower.anchor import lower_anchor
from graph_autofusion.plan.anchor_match import MatrixView, match_anchor

F = onnx.TensorProto.FLOAT


def anchor_spec(nodes, inputs, outputs, inner=None, weights=(), symbol="k") -> KernelSpec:
    """An fp32 anchor spec from {name: shape} of its inputs, outputs and intermediates; `weights`
    are the inputs bound to initializers (what the contraction library may pack once)."""
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


def calls(body: tuple[Stmt, ...]) -> list[Call]:
    """The `Call`s of `body`, inside loops too, in order."""
    found: list[Call] = []
    for s in body:
        if isinstance(s, Call):
            found.append(s)
        elif isinstance(s, Loop):
            found += calls(s.body)
    return found


STRIDED = (3, 40, 16, 48)  # (batch, M, K, N) of `strided_operand_matmul`


def strided_operand_matmul(weights: tuple[str, ...] = ()) -> Kernel:
    """`at` [B, M, K] @ `w` [K, N] with `at` read from the [M, K, B] array transposed: strides
    (1, K*B, B), no unit-stride axis (a view the planner does not form today), one GEMM per batch
    entry (the shared weight would otherwise fold the batch into M). Such an operand is copied a
    tile at a time into the thread's workspace slice."""
    bsz, m, k, n = STRIDED
    spec = anchor_spec(
        [helper.make_node("MatMul", ["at", "w"], ["o"])],
        {"at": (bsz, m, k), "w": (k, n)},
        {"o": (bsz, m, n)},
        weights=weights,
    )
    match = match_anchor(spec)
    p = match.contraction
    assert p is not None
    strided = MatrixView("at", 0, m, k, k * bsz, bsz, (1,))
    contraction = replace(
        p, batch=(bsz,), m=m, a=strided, b=replace(p.b, batch_strides=(0,)), c_batch_strides=(m * n,)
    )
    return lower_anchor(spec, replace(match, contraction=contraction))


def check_strided_operand_matmul(kernel: Kernel, tmp_path: Path, seed: int, rtol: float) -> None:
    """`strided_operand_matmul`'s kernel computes what numpy computes."""
    bsz, m, k, n = STRIDED
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k, bsz)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    (got,) = run(kernel, [a, w], tmp_path)
    np.testing.assert_allclose(
        got.reshape(bsz, m, n), np.matmul(a.transpose(2, 0, 1), w), rtol=rtol, atol=1e-4
    )


def run(kernel: Kernel, inputs: list[np.ndarray], tmp_path: Path) -> list[np.ndarray]:
    """Compile `kernel` and call it as the runtime does: behind the contraction library when it
    calls it (`uses_library`; a packed weight prepacked once, the packed array right after the
    parameters), else behind OpenBLAS; then the workspace (NaN bytes) and its slice count when it
    takes one. It is called twice, each time on outputs reset to NaN: the packed weights must
    survive a call."""
    library = uses_library(kernel)
    source = (library_source() if library else BLAS_PREAMBLE) + "\n" + render_kernel(kernel)
    (art,) = compile_kernels(
        [KernelSource(kernel.name, source, uses_blas=not library)], cache=KernelCache(tmp_path)
    )
    lib = art.load()
    ins = [np.ascontiguousarray(x, dtype=np.float32) for x in inputs]
    outs = [np.full(b.size, np.nan, np.float32) for b in kernel.params[len(ins) :]]
    ptrs = [a.ctypes.data for a in (*ins, *outs)]
    keep = []  # what the kernel reads through `ptrs` must outlive the calls
    if kernel.packed:
        floats = ctypes.c_int64.in_dll(lib, f"{kernel.name}{PREPACK_SUFFIX}_floats").value
        assert floats >= sum(b.size for b in kernel.packed)
        packed = np.full(floats, np.nan, np.float32)
        prepack = getattr(lib, f"{kernel.name}{PREPACK_SUFFIX}")
        prepack.restype, prepack.argtypes = None, [ctypes.c_void_p, ctypes.c_void_p]
        prepack((ctypes.c_void_p * len(ptrs))(*ptrs), packed.ctypes.data)
        ptrs.append(packed.ctypes.data)
        keep.append(packed)
    if f"{kernel.name}{WORKSPACE_SUFFIX}" in source:
        threads = 8
        slice_bytes = ctypes.c_int64.in_dll(lib, f"{kernel.name}{WORKSPACE_SUFFIX}").value
        # NaN bytes, as the runtime's poisoning leaves it: a kernel that reads a workspace cell
        # it did not write (a padded band's border) gives NaN
        workspace = np.full(slice_bytes * threads, 0xFF, np.uint8)
        ptrs += [workspace.ctypes.data, threads]
        keep.append(workspace)
    fn = getattr(lib, kernel.name)
    fn.restype, fn.argtypes = None, [ctypes.c_void_p]
    for _ in range(2):
        for o in outs:
            o.fill(np.nan)
        fn((ctypes.c_void_p * len(ptrs))(*ptrs))
    return outs
