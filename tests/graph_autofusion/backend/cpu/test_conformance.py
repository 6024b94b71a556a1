"""ONNX backend node conformance for every op the registry claims (non-opaque, default domain).

The cases come from `onnx.backend.test.case.node` (built in memory by the onnx package). A case is
kept when its model is one claimed op over float32 (with int64/int32/bool side inputs). Integer
inputs (axes, pads, starts, shapes, indices) are bound as initializers: the backend compiles
static-shape models, where they are constants. Every case must match the expected outputs within
the case's own tolerance (at least rtol 1e-5, atol 1e-6). A case may run on the host
(onnx.reference) only for a reason listed in HOST_REASONS; the pass rate is printed.
"""

from __future__ import annotations

import collections
import warnings

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from graph_autofusion.backend.cpu.codegen import generate
from graph_autofusion.backend.cpu.codegen.common import CodegenUnsupported
from graph_autofusion.backend.cpu.compiler import KernelSource, compile_kernels
from graph_autofusion.backend.cpu.extract import extract
from graph_autofusion.backend.cpu.runtime import compile_model
from graph_autofusion.ops import OpKind, registered_ops

# Cases that run on the host by design, by op type -> why.
HOST_REASONS = {
    "BatchNormalization": "training mode (running statistics as outputs); inference BN compiles",
    "Dropout": "training mode or a mask output (random); inference Dropout is a view",
    "GroupNormalization": "no generator yet (a reduction over a reshaped channel axis)",
    "LpPool": "no generator yet",
    "MaxPool": "the Indices output (argmax positions); plain MaxPool compiles",
    "ReverseSequence": "no generator yet (per-batch lengths)",
    "ReduceSum": "reductions over an empty tensor (zero-size dims)",
    "ReduceSumSquare": "reductions over an empty tensor (zero-size dims)",
    "ReduceL1": "reductions over an empty tensor (zero-size dims)",
    "ReduceL2": "reductions over an empty tensor (zero-size dims)",
    "ReduceMax": "reductions over an empty tensor (zero-size dims)",
    "ReduceMin": "reductions over an empty tensor (zero-size dims)",
    "ReduceProd": "reductions over an empty tensor (zero-size dims)",
    "ReduceLogSum": "reductions over an empty tensor (zero-size dims)",
    "ReduceLogSumExp": "reductions over an empty tensor (zero-size dims)",
}
_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.BOOL}


def _claimed() -> set[str]:
    return {op for (domain, op), d in registered_ops().items() if domain == "" and d.kind != OpKind.OPAQUE}


def _cases() -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from onnx.backend.test.case.node import collect_testcases

        everything = collect_testcases(None)
    claimed = _claimed()
    kept = []
    for case in everything:
        nodes = case.model.graph.node
        if (
            case.kind != "node"
            or len(nodes) != 1
            or nodes[0].op_type not in claimed
            or len(case.data_sets) != 1
        ):
            continue
        types = {vi.type.tensor_type.elem_type for vi in [*case.model.graph.input, *case.model.graph.output]}
        if onnx.TensorProto.FLOAT in types and types <= _TYPES:
            kept.append(case)
    return kept


def _bind_integer_inputs(case) -> tuple[onnx.ModelProto, dict[str, np.ndarray], list[np.ndarray]]:
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    inputs, outputs = case.data_sets[0]
    feeds = {}
    for vi, value in zip(list(model.graph.input), inputs, strict=False):
        if vi.type.tensor_type.elem_type == onnx.TensorProto.INT64:
            model.graph.initializer.append(numpy_helper.from_array(np.asarray(value), vi.name))
        else:
            feeds[vi.name] = np.asarray(value)
    return model, feeds, list(outputs)


def _prewarm(models: list[onnx.ModelProto], cache) -> None:
    """Compile every case's kernels in one combined batch (far faster than one compile per case)."""
    sources = []
    for model in models:
        try:
            plan = extract(model)
        except Exception:
            continue
        for symbol, spec in plan.specs.items():
            try:
                kernel = generate(spec)
            except CodegenUnsupported:
                continue
            sources.append(KernelSource(symbol, kernel.source, uses_blas=kernel.uses_blas))
    compile_kernels(sources, cache=cache, combine=True)


def test_backend_node_conformance(kernel_cache, capsys: pytest.CaptureFixture[str]) -> None:
    cases = _cases()
    assert len(cases) > 300  # the onnx package ships several hundred such cases
    bound = [_bind_integer_inputs(c) for c in cases]
    _prewarm([m for m, _, _ in bound], kernel_cache)
    results: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    failures, unexplained = [], []
    for case, (model, feeds, expected) in zip(cases, bound, strict=True):
        op = case.model.graph.node[0].op_type
        try:
            compiled = compile_model(model, cache=kernel_cache, threads=1)
            got = compiled(feeds)
            for (name, value), want in zip(got.items(), expected, strict=True):
                np.testing.assert_allclose(
                    value, want, rtol=max(case.rtol, 1e-5), atol=max(case.atol, 1e-6), err_msg=name
                )
        except Exception as exc:
            results[op]["fail"] += 1
            failures.append(f"{case.name}: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        if compiled.stats["host_ops"]:
            results[op]["host"] += 1
            if op not in HOST_REASONS:
                unexplained.append(f"{case.name}: {compiled.stats['host_ops'][0]['reason']}")
        else:
            results[op]["compiled"] += 1
    total = sum(sum(c.values()) for c in results.values())
    compiled_n = sum(c["compiled"] for c in results.values())
    host_n = sum(c["host"] for c in results.values())
    with capsys.disabled():
        print(
            f"\nONNX node conformance: {total} float cases of {len(results)} claimed ops; "
            f"{compiled_n} compiled and correct ({compiled_n / total:.1%}), {host_n} correct on the host "
            f"(listed reasons), {len(failures)} wrong"
        )
    assert not failures, "\n".join(failures)
    assert not unexplained, "\n".join(unexplained)
