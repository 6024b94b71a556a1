"""Shared by the CPU backend tests: hand-built (fused) models and the onnxruntime reference.

Tolerance: fp32 results must match onnxruntime (optimizations disabled) within rtol 1e-5 and
atol 1e-6, the bar the backend promises (docs/fused-format.md, DESIGN.md §1).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from graph_autofusion.backend.cpu.cache import KernelCache
from graph_autofusion.backend.cpu.runtime import CompiledModel, compile_model
from graph_autofusion.verify import random_inputs

RTOL = 1e-5
ATOL = 1e-6
FUSED_DOMAIN = "ai.graph_autofusion"
IR_VERSION = 9  # what the pinned onnxruntime accepts

Spec = tuple[Sequence[int], int]  # (shape, elem_type); a bare shape means float


def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Mapping[str, Spec | Sequence[int]],
    outputs: Sequence[str],
    initializers: Mapping[str, np.ndarray] | None = None,
    opset: int = 18,
) -> onnx.ModelProto:
    """A canonical model with static shapes everywhere (shape inference fills value_info)."""
    ins = []
    for name, spec in inputs.items():
        if len(spec) == 2 and isinstance(spec[0], (list, tuple)):  # (shape, elem_type)
            shape, elem = spec[0], int(spec[1])  # type: ignore[arg-type]
        else:
            shape, elem = spec, onnx.TensorProto.FLOAT
        ins.append(helper.make_tensor_value_info(name, elem, list(shape)))
    inits = [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in (initializers or {}).items()]
    graph = helper.make_graph(
        list(nodes), "test", ins, [helper.make_empty_tensor_value_info(o) for o in outputs], inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION)
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    known = {vi.name: vi for vi in [*model.graph.value_info, *model.graph.output]}
    del model.graph.output[:]
    for o in outputs:
        model.graph.output.append(known[o])
    onnx.checker.check_model(model, full_check=True)
    return model


def fuse_all(model: onnx.ModelProto, template: str, pattern: str = "test") -> onnx.ModelProto:
    """Wrap every node of `model` into one fused kernel (docs/fused-format.md)."""
    graph = model.graph
    produced = {o for n in graph.node for o in n.output}
    external: list[str] = []
    for n in graph.node:
        for i in n.input:
            if i and i not in produced and i not in external:
                external.append(i)
    outs = [o.name for o in graph.output]
    body_vi = [vi for vi in graph.value_info if vi.name not in outs]
    fn = helper.make_function(
        FUSED_DOMAIN,
        "fused_0",
        external,
        outs,
        list(graph.node),
        opset_imports=[helper.make_opsetid("", model.opset_import[0].version)],
    )
    fn.value_info.extend(body_vi)
    fn.doc_string = json.dumps(
        {"pattern": pattern, "template": template, "members": [n.name or n.op_type for n in graph.node]}
    )
    call = helper.make_node("fused_0", external, outs, domain=FUSED_DOMAIN, name="fused_0")
    new_graph = helper.make_graph(
        [call], graph.name, list(graph.input), list(graph.output), list(graph.initializer)
    )
    new_graph.value_info.extend([vi for vi in graph.value_info if vi.name in outs])
    fused = helper.make_model(
        new_graph,
        opset_imports=[*model.opset_import, helper.make_opsetid(FUSED_DOMAIN, 1)],
        ir_version=IR_VERSION,
        functions=[fn],
    )
    return fused


def random_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """The engine's own verification inputs: N(0,1) floats, ids bounded by the tables they index."""
    return random_inputs(model, seed=seed)


def ort_run(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, dict(feeds)), strict=True))


def assert_close(
    actual: Mapping[str, np.ndarray],
    expected: Mapping[str, np.ndarray],
    rtol: float = RTOL,
    atol: float = ATOL,
) -> None:
    assert list(actual) == list(expected)
    for name, want in expected.items():
        got = actual[name]
        assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
        assert got.dtype == want.dtype, f"{name}: dtype {got.dtype} != {want.dtype}"
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=name)


def check(
    model: onnx.ModelProto,
    cache: KernelCache,
    template: str | None = None,
    seed: int = 0,
    feeds: Mapping[str, np.ndarray] | None = None,
) -> CompiledModel:
    """Compile `model` (fused into one `template` kernel when given) and compare with onnxruntime."""
    feeds = dict(feeds) if feeds is not None else random_feeds(model, seed)
    expected = ort_run(model, feeds)
    target = fuse_all(model, template) if template else model
    compiled = compile_model(target, cache=cache, threads=2)
    assert compiled.stats["host_ops"] == [], compiled.stats["host_ops"]
    assert_close(compiled(feeds), expected)
    return compiled


def packed_weights_model() -> onnx.ModelProto:
    """Weights the contraction library packs (library mode, the default): `w` and `k` are read
    only packed (a MatMul's and a Conv's weight); `v` is packed for its MatMul and also read raw
    by an elementwise kernel, so it must stay raw."""
    rng = np.random.default_rng(7)
    weights = {
        "w": rng.standard_normal((48, 64)).astype(np.float32),
        "v": rng.standard_normal((48, 48)).astype(np.float32),
        "k": rng.standard_normal((16, 3, 3, 3)).astype(np.float32),
        "two": np.float32(2.0),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Relu", ["xw"], ["y"]),
        helper.make_node("MatMul", ["x", "v"], ["xv"]),
        helper.make_node("Mul", ["v", "two"], ["v2"]),
        helper.make_node("Conv", ["img", "k"], ["c"], pads=[1, 1, 1, 1]),
    ]
    return make_model(nodes, {"x": [40, 48], "img": [1, 3, 12, 12]}, ["y", "xv", "v2", "c"], weights)
