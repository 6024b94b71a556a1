"""Shared by the anchor-kernel tests: tiny ONNX models, hand-built KernelSpecs, the real compiler.

Each case builds a one-kernel ONNX model, derives the `KernelSpec` the runtime would build for it
(body = the graph's nodes; weights are kernel parameters and also known constants; scalar
initializers are constants only, so they are baked into the source), compiles the generated
source with the project's compiler driver (real cc, real OpenBLAS) into a per-session cache, calls
it through ctypes and compares with onnxruntime with graph optimizations disabled.

Tolerance: BLAS sums in a different order than onnxruntime's MLAS, so a K-term dot product of
O(1) values differs by a few eps*sqrt(K) per unit of magnitude. We use rtol=1e-5 and
atol = 3e-6 * sqrt(K) * scale, where `scale` is the magnitude of the values entering the
contraction (inputs are uniform in [-1, 1], so scale = 1). On the development host (OpenBLAS
SkylakeX kernels) the worst observed error was 6e-7 * sqrt(K) (K = 576 conv), so the bound has a
5x margin for other BLAS kernels; set AF_SHOW_ERR=1 to print the observed error of every case.
"""

from __future__ import annotations

import atexit
import ctypes
import math
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from graph_autofusion.backend.cpu.cache import KernelCache
from graph_autofusion.backend.cpu.codegen.anchor import AnchorKernel, emit_anchor
from graph_autofusion.backend.cpu.compiler import KernelSource, compile_kernels
from graph_autofusion.backend.cpu.kernel_spec import KernelSpec, TensorInfo
from graph_autofusion.backend.cpu.render_c import PREPACK_SUFFIX, WORKSPACE_SUFFIX

RTOL = 1e-5
ATOL_PER_SQRT_K = 3e-6

_CACHE: KernelCache | None = None


def cache() -> KernelCache:
    """One kernel cache per test process: `$AUTOFUSION_TEST_CACHE` (kept, for fast reruns) or a
    temporary directory removed when the process exits."""
    global _CACHE
    if _CACHE is None:
        configured = os.environ.get("AUTOFUSION_TEST_CACHE")
        if configured:
            root = Path(configured)
        else:
            root = Path(tempfile.mkdtemp(prefix="af-anchor-tests-"))
            atexit.register(shutil.rmtree, root, ignore_errors=True)
        _CACHE = KernelCache(root)
    return _CACHE


def rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)


@dataclass
class Case:
    """A one-kernel model and what feeds it."""

    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    template: str = "anchor"


def make_case(
    nodes: Sequence[onnx.NodeProto],
    inputs: dict[str, np.ndarray],
    outputs: Sequence[str],
    initializers: dict[str, np.ndarray] | None = None,
    *,
    template: str = "anchor",
    opset: int = 17,
) -> Case:
    """Build and shape-infer the model; `inputs` are runtime feeds, `initializers` weights."""
    initializers = initializers or {}
    graph = helper.make_graph(
        list(nodes),
        "case",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(v.shape)) for n, v in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in initializers.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    onnx.checker.check_model(model)
    return Case(model, dict(inputs), template)


def _infos(model: onnx.ModelProto) -> dict[str, TensorInfo]:
    out: dict[str, TensorInfo] = {}
    g = model.graph
    for vi in (*g.input, *g.value_info, *g.output):
        t = vi.type.tensor_type
        out[vi.name] = TensorInfo(vi.name, tuple(int(d.dim_value) for d in t.shape.dim), t.elem_type)
    for init in g.initializer:
        out[init.name] = TensorInfo(init.name, tuple(init.dims), init.data_type)
    return out


def spec_for(case: Case, symbol: str, *, weights: bool = False) -> tuple[KernelSpec, list[str]]:
    """The KernelSpec of the whole graph as one kernel, and the parameter order of its inputs;
    `weights`: its initializers are weights (bound at every call, so packed once at load)."""
    g = case.model.graph
    infos = _infos(case.model)
    inits = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    params = [i.name for i in g.input] + [n for n, v in inits.items() if v.size > 1]
    spec = KernelSpec(
        symbol=symbol,
        template=case.template,
        nodes=tuple(g.node),
        inputs=tuple(infos[n] for n in params),
        outputs=tuple(infos[o.name] for o in g.output),
        tensors=infos,
        constants=inits,
        pattern="test",
        members=tuple(n.name or n.op_type for n in g.node),
        weights=frozenset(n for n, v in inits.items() if v.size > 1 and weights),
    )
    return spec, params


def run_kernel(
    kernel: AnchorKernel, spec: KernelSpec, values: Sequence[np.ndarray], *, unit: str | None = None
) -> list[np.ndarray]:
    """Compile the kernel with the project's driver and call it on dense float32 buffers.

    `unit` names the translation unit when `kernel.source` holds several kernels.
    """
    source = KernelSource(unit or spec.symbol, kernel.source, uses_blas=kernel.uses_blas)
    (art,) = compile_kernels([source], cache=cache())
    lib = art.load()
    fn = getattr(lib, spec.symbol)
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p]
    ins = [np.ascontiguousarray(v, dtype=np.float32) for v in values]
    outs = [np.full(t.shape, np.nan, dtype=np.float32) for t in spec.outputs]
    ptrs: list[int] = [a.ctypes.data for a in (*ins, *outs)]
    keep: list[np.ndarray] = []
    # As the runtime calls a kernel: weights packed once (prepack) into an array passed after the
    # parameters, then the per-thread workspace and its slice count.
    prepack = f"{spec.symbol}{PREPACK_SUFFIX}"
    if f"{prepack}_floats" in kernel.source:
        packed = np.full(ctypes.c_int64.in_dll(lib, f"{prepack}_floats").value, np.nan, np.float32)
        pack = getattr(lib, prepack)
        pack.restype, pack.argtypes = None, [ctypes.c_void_p, ctypes.c_void_p]
        pack((ctypes.c_void_p * len(ptrs))(*ptrs), packed.ctypes.data)
        ptrs.append(packed.ctypes.data)
        keep.append(packed)
    if f"{spec.symbol}{WORKSPACE_SUFFIX}" in kernel.source:
        threads = 8
        slice_bytes = ctypes.c_int64.in_dll(lib, f"{spec.symbol}{WORKSPACE_SUFFIX}").value
        workspace = np.zeros(slice_bytes * threads, np.uint8)
        ptrs += [workspace.ctypes.data, threads]
        keep.append(workspace)
    fn((ctypes.c_void_p * len(ptrs))(*ptrs))
    return outs


def run_ort(case: Case) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(case.model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, case.feeds)


def check(
    case: Case, symbol: str, *, k: int, method: str | None = None, scale: float = 1.0, weights: bool = False
) -> AnchorKernel:
    """Generate, compile, run and compare with onnxruntime; returns the kernel for further checks."""
    spec, params = spec_for(case, symbol, weights=weights)
    kernel = emit_anchor(spec)
    if method is not None:
        assert kernel.method == method, kernel.method
    inits = {i.name: numpy_helper.to_array(i) for i in case.model.graph.initializer}
    values = [case.feeds[n] if n in case.feeds else inits[n] for n in params]
    got = run_kernel(kernel, spec, values)
    want = run_ort(case)
    atol = ATOL_PER_SQRT_K * math.sqrt(k) * scale
    for name, g, w in zip((o.name for o in case.model.graph.output), got, want, strict=True):
        assert g.shape == w.shape, (name, g.shape, w.shape)
        err = float(np.max(np.abs(g - w))) if g.size else 0.0
        if os.environ.get("AF_SHOW_ERR"):
            print(f"{symbol}: max abs err {err:.3g} (atol {atol:.3g})")
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=atol, err_msg=f"{name}: max abs err {err:.3g}")
    return kernel


def contraction_calls(source: str) -> list[str]:
    """The lines of a generated kernel that call the contraction routine (lower/anchor.py)."""
    return [line for line in source.splitlines() if "af_sgemm_tile(" in line and "static inline" not in line]


def reads_at_offset(source: str, offset: int) -> bool:
    """Whether a contraction call addresses an operand `offset` elements into its buffer."""
    return any(f"({offset} + " in line for line in contraction_calls(source))
