"""From a fused (or plain canonical) ONNX model to an execution plan.

The plan is a list of steps in graph order, each one of

* `ViewStep`   Reshape/Flatten/Squeeze/Unsqueeze/Identity/Dropout: the output aliases the input;
* `KernelStep` a call of a generated kernel (a fused `ai.graph_autofusion` node, whose spec comes
               from its model-local function, or a default-domain op compiled on its own);
* `HostStep`   an op no generator compiles (data-dependent shapes, control flow, ...), run
               through `onnx.reference` and listed as such in the compiled model's stats.

Identical kernels (same body, shapes, attributes and compile-time constants, whatever the
tensors are called) get the same symbol — a digest of the canonicalized spec — so a repeated
block compiles once (docs/fused-format.md allows several nodes to call one function; unfused
models repeat single ops all the time).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from ...errors import UnsupportedModelError
from ...onnx_utils import has_subgraph, node_inputs
from ...ops import OpKind, lookup, registered_ops
from .kernel_spec import KernelSpec, TensorInfo

FUSED_DOMAIN = "ai.graph_autofusion"
VIEW_OPS = frozenset(
    op.op_type for (d, _), op in registered_ops().items() if not d and op.kind == OpKind.VIEW
)
# Initializers read by a kernel are also handed to the generator as values when they are small:
# shape/axes/index tensors and scalars let it specialise (Slice bounds, Pow(x, 2) -> x*x).
CONST_MAX_ELEMENTS = 64
CONST_MAX_INT_ELEMENTS = 4096


@dataclass(frozen=True)
class ViewStep:
    input: str
    output: str
    node_name: str = ""


@dataclass(frozen=True)
class KernelStep:
    symbol: str
    inputs: tuple[str, ...]  # graph tensor names, in the kernel's parameter order ("" = absent)
    outputs: tuple[str, ...]
    node_name: str = ""
    node: onnx.NodeProto | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class HostStep:
    """A node run by onnx.reference; `code` is a stable reason code (see hostops.HOST_REASONS)."""

    node: onnx.NodeProto
    reason: str
    code: str = "no_generator"

    @property
    def inputs(self) -> tuple[str, ...]:
        # Outer-scope reads of If/Loop/Scan bodies are inputs too: the arena must keep them
        # alive until the host op has run, and the host op must be handed their values.
        return tuple(node_inputs(self.node))

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(self.node.output)


Step = ViewStep | KernelStep | HostStep


@dataclass
class ExecutionPlan:
    model: onnx.ModelProto
    steps: list[Step]
    specs: dict[str, KernelSpec]  # symbol -> spec (one per unique kernel)
    tensors: dict[str, TensorInfo]  # every tensor of the main graph
    inputs: list[TensorInfo]  # graph inputs that are not initializers
    outputs: list[TensorInfo]
    initializers: dict[str, np.ndarray]
    opset: int = 17
    notes: list[str] = field(default_factory=list)

    def kernel_steps(self) -> list[KernelStep]:
        return [s for s in self.steps if isinstance(s, KernelStep)]

    def host_steps(self) -> list[HostStep]:
        return [s for s in self.steps if isinstance(s, HostStep)]


def _tensor_info(vi: onnx.ValueInfoProto) -> TensorInfo | None:
    if not vi.type.HasField("tensor_type"):
        return None
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return None
    dims = []
    for d in tt.shape.dim:
        if not d.HasField("dim_value"):
            return None
        dims.append(int(d.dim_value))
    return TensorInfo(vi.name, tuple(dims), int(tt.elem_type))


def _collect(values: list[onnx.ValueInfoProto]) -> dict[str, TensorInfo]:
    out = {}
    for vi in values:
        info = _tensor_info(vi)
        if info is not None:
            out[vi.name] = info
    return out


def constant_value(node: onnx.NodeProto) -> np.ndarray:
    """The value of a Constant node, whichever attribute carries it."""
    for attr in node.attribute:
        value = onnx.helper.get_attribute_value(attr)
        if attr.name == "value":
            return numpy_helper.to_array(value)
        if attr.name == "value_float":
            return np.array(value, dtype=np.float32)
        if attr.name == "value_floats":
            return np.array(value, dtype=np.float32)
        if attr.name == "value_int":
            return np.array(value, dtype=np.int64)
        if attr.name == "value_ints":
            return np.array(value, dtype=np.int64)
    raise UnsupportedModelError(
        f"Constant node {node.name!r} carries no value this backend reads", code="unsupported_constant"
    )


def _info_of_array(name: str, value: np.ndarray) -> TensorInfo:
    return TensorInfo(
        name, tuple(int(d) for d in value.shape), onnx.helper.np_dtype_to_tensor_dtype(value.dtype)
    )


def _opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return 17


def _small(value: np.ndarray) -> bool:
    if value.dtype.kind in "iub":
        return value.size <= CONST_MAX_INT_ELEMENTS
    return value.size <= CONST_MAX_ELEMENTS


def _axis(node: onnx.NodeProto) -> int | None:
    for attr in node.attribute:
        if attr.name == "axis":
            return int(attr.i)
    return None


def single_template(node: onnx.NodeProto, opset: int) -> str | None:
    """The template that compiles one default-domain op, or None when it runs on the host."""
    op = node.op_type
    kind = lookup(op, node.domain).kind
    if node.domain not in ("", "ai.onnx"):
        return None
    if op in ("Softmax", "LogSoftmax") and opset < 13 and _axis(node) != -1:
        # The old "flatten from axis" semantics (canonicalization rewrites them to axis -1, where
        # both opsets agree; a model that skipped it runs on onnx.reference).
        return None
    if op == "MaxPool" and len(node.output) > 1 and node.output[1]:
        return None
    tags = lookup(op).tags
    if "pool" in tags:
        return "pool"
    if "row" in tags:
        return "reduction"
    if "scan" in tags:
        return "single"
    if kind == OpKind.ANCHOR:
        return "anchor"
    if kind in (OpKind.ELEMENTWISE, OpKind.BROADCAST, OpKind.INJECTIVE):
        return "pointwise"
    return None


def spec_digest(spec: KernelSpec) -> str:
    """sha256 of the spec with tensors renamed by first appearance (names do not matter)."""
    names: dict[str, str] = {"": ""}

    def canon(name: str) -> str:
        if name not in names:
            names[name] = f"v{len(names)}"
        return names[name]

    parts: list[object] = [spec.template]
    for t in (*spec.inputs, *spec.outputs):
        parts.append([canon(t.name), list(t.shape), t.elem_type])
    for node in spec.nodes:
        attrs = sorted((a.name, a.SerializeToString(deterministic=True).hex()) for a in node.attribute)
        parts.append(
            [
                node.op_type,
                node.domain,
                [canon(i) for i in node.input],
                [canon(o) for o in node.output],
                attrs,
            ]
        )
    if spec.weights:
        parts.append(["weights", sorted(canon(n) for n in spec.weights)])
    for name in list(names):
        info = spec.tensors.get(name)
        if info is not None:
            parts.append([canon(name), list(info.shape), info.elem_type])
    for name in sorted(spec.constants, key=lambda n: canon(n)):
        value = np.ascontiguousarray(spec.constants[name])
        parts.append(
            [canon(name), str(value.dtype), list(value.shape), hashlib.sha256(value.tobytes()).hexdigest()]
        )
    blob = json.dumps(parts, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def _finish_spec(spec: KernelSpec) -> KernelSpec:
    symbol = f"af_{spec.template}_{spec_digest(spec)[:16]}"
    return KernelSpec(
        symbol=symbol,
        template=spec.template,
        nodes=spec.nodes,
        inputs=spec.inputs,
        outputs=spec.outputs,
        tensors=spec.tensors,
        constants=spec.constants,
        pattern=spec.pattern,
        members=spec.members,
        weights=spec.weights,
    )


def _function_doc(fn: onnx.FunctionProto) -> dict[str, object]:
    try:
        doc = json.loads(fn.doc_string) if fn.doc_string else {}
    except json.JSONDecodeError:
        doc = {}
    return doc if isinstance(doc, dict) else {}


def _infer_body(
    fn: onnx.FunctionProto,
    inputs: list[TensorInfo],
    outputs: list[TensorInfo],
    opset_import: list[onnx.OperatorSetIdProto],
) -> dict[str, TensorInfo]:
    """Shape inference over a function body whose value_info is incomplete (a fallback)."""
    graph = onnx.helper.make_graph(
        list(fn.node),
        "body",
        [
            onnx.helper.make_tensor_value_info(f, t.elem_type, t.shape)
            for f, t in zip(fn.input, inputs, strict=True)
        ],
        [
            onnx.helper.make_tensor_value_info(f, t.elem_type, t.shape)
            for f, t in zip(fn.output, outputs, strict=True)
        ],
    )
    model = onnx.helper.make_model(
        graph, opset_imports=[o for o in opset_import if o.domain in ("", "ai.onnx")]
    )
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    return _collect(list(inferred.graph.value_info))


def extract(model: onnx.ModelProto, initializers: Mapping[str, np.ndarray] | None = None) -> ExecutionPlan:
    """Build the execution plan of a fused or canonical model (see the module docstring).

    `initializers`: the model's weights as arrays, for a model whose graph holds none (a bundle
    loads its model without keeping the weights twice: onnx_utils.light_model)."""
    graph = model.graph
    opset = _opset(model)
    if initializers is None:
        initializers = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    else:
        initializers = dict(initializers)
    tensors = _collect([*graph.input, *graph.output, *graph.value_info])
    for name, value in initializers.items():
        tensors[name] = _info_of_array(name, value)
    for node in graph.node:  # Constant nodes in the main graph become initializers
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            initializers[node.output[0]] = constant_value(node)
            tensors[node.output[0]] = _info_of_array(node.output[0], initializers[node.output[0]])
    missing = [o for n in graph.node for o in n.output if o and o not in tensors]
    if missing:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
        for name, info in _collect([*inferred.graph.value_info, *inferred.graph.output]).items():
            tensors.setdefault(name, info)
        missing = [o for o in missing if o not in tensors]
        if missing:
            raise UnsupportedModelError(
                f"tensor {missing[0]!r} has no static shape; bind symbolic dims with "
                f"FusionConfig.input_shapes "
                f"({len(missing)} tensor(s) without one)",
                code="dynamic_shape",
                tensors=missing[:10],
            )
    inputs = [tensors[vi.name] for vi in graph.input if vi.name not in initializers]
    outputs = []
    for vi in graph.output:
        if vi.name not in tensors:
            raise UnsupportedModelError(f"graph output {vi.name!r} has no static shape", code="dynamic_shape")
        outputs.append(tensors[vi.name])
    functions = {(f.domain, f.name): f for f in model.functions}

    specs: dict[str, KernelSpec] = {}
    steps: list[Step] = []
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            continue
        if node.domain == FUSED_DOMAIN:
            fn = functions.get((node.domain, node.op_type))
            if fn is None:
                raise UnsupportedModelError(
                    f"node {node.name!r} calls function {node.op_type!r}, which the model does not define",
                    code="missing_function",
                )
            spec = _function_spec(node, fn, tensors, initializers, model)
        elif node.domain in ("", "ai.onnx") and node.op_type in VIEW_OPS and _is_plain_view(node):
            steps.append(ViewStep(node.input[0], node.output[0], node.name))
            continue
        else:
            template = single_template(node, opset)
            if template is None:
                steps.append(_host_step(node, opset))
                continue
            spec = _single_spec(node, template, tensors, initializers)
        spec = _finish_spec(spec)
        specs.setdefault(spec.symbol, spec)
        args = tuple(i for i in node.input if i) if node.domain != FUSED_DOMAIN else tuple(node.input)
        steps.append(KernelStep(spec.symbol, args, tuple(node.output), node.name, node))
    return ExecutionPlan(
        model=model,
        steps=steps,
        specs=specs,
        tensors=tensors,
        inputs=inputs,
        outputs=outputs,
        initializers=initializers,
        opset=opset,
    )


def _host_step(node: onnx.NodeProto, opset: int) -> HostStep:
    """Why `node` runs on the host, as a stable code and a sentence (single_template said no)."""
    op = node.op_type
    if node.domain not in ("", "ai.onnx"):
        return HostStep(node, f"operator domain {node.domain!r} has no code generator", "foreign_domain")
    if has_subgraph(node):
        return HostStep(node, f"{op} is control flow: its subgraphs run in onnx.reference", "control_flow")
    if op in ("Softmax", "LogSoftmax") and opset < 13:
        return HostStep(node, f"{op} before opset 13 (flatten-from-axis semantics)", "legacy_semantics")
    if op == "MaxPool":
        return HostStep(node, "MaxPool with an Indices output", "unsupported_variant")
    return HostStep(node, f"{op} has no code generator", "no_generator")


def _is_plain_view(node: onnx.NodeProto) -> bool:
    if node.op_type == "Dropout":
        # Inference dropout is the identity; a mask output or a training_mode input is not.
        return (len(node.output) < 2 or not node.output[1]) and (len(node.input) < 3 or not node.input[2])
    return True


def _kernel_constants(names: list[str], initializers: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {n: initializers[n] for n in names if n in initializers and _small(initializers[n])}


def _single_spec(
    node: onnx.NodeProto, template: str, tensors: dict[str, TensorInfo], initializers: dict[str, np.ndarray]
) -> KernelSpec:
    ins = [tensors[i] for i in node.input if i]
    outs = [tensors.get(o) for o in node.output]
    if any(o is None for o in outs):
        raise UnsupportedModelError(
            f"an output of node {node.name!r} has no static shape", code="dynamic_shape"
        )
    body = onnx.NodeProto()
    body.CopyFrom(node)
    # Absent optional inputs in the middle stay "" in the body; trailing ones are dropped.
    used = {n: tensors[n] for n in [*node.input, *node.output] if n}
    return KernelSpec(
        symbol="",
        template=template,
        nodes=(body,),
        inputs=tuple(ins),
        outputs=tuple(o for o in outs if o is not None),
        tensors=used,
        constants=_kernel_constants([i for i in node.input if i], initializers),
        pattern="",
        members=(node.name or node.op_type,),
        weights=frozenset(i for i in node.input if i in initializers),
    )


def _function_spec(
    node: onnx.NodeProto,
    fn: onnx.FunctionProto,
    tensors: dict[str, TensorInfo],
    initializers: dict[str, np.ndarray],
    model: onnx.ModelProto,
) -> KernelSpec:
    doc = _function_doc(fn)
    template = str(doc.get("template") or "pointwise")
    if len(node.input) != len(fn.input) or len(node.output) != len(fn.output):
        raise UnsupportedModelError(
            f"node {node.name!r} passes {len(node.input)} inputs/{len(node.output)} outputs to function "
            f"{fn.name!r}, which declares {len(fn.input)}/{len(fn.output)}",
            code="function_arity",
        )
    body_tensors = _collect(list(fn.value_info))
    inputs = []
    for formal, actual in zip(fn.input, node.input, strict=True):
        info = tensors[actual]
        inputs.append(TensorInfo(formal, info.shape, info.elem_type))
    outputs = []
    for formal, actual in zip(fn.output, node.output, strict=True):
        if actual not in tensors:
            raise UnsupportedModelError(
                f"output {actual!r} of node {node.name!r} has no static shape", code="dynamic_shape"
            )
        info = tensors[actual]
        outputs.append(TensorInfo(formal, info.shape, info.elem_type))
    for t in (*inputs, *outputs):
        body_tensors[t.name] = t
    constants: dict[str, np.ndarray] = {}
    nodes = []
    for n in fn.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            value = constant_value(n)
            constants[n.output[0]] = value
            body_tensors[n.output[0]] = _info_of_array(n.output[0], value)
        else:
            nodes.append(n)
    missing = [o for n in nodes for o in n.output if o and o not in body_tensors]
    if missing:
        for name, info in _infer_body(fn, inputs, outputs, list(model.opset_import)).items():
            body_tensors.setdefault(name, info)
        still = [o for o in missing if o not in body_tensors]
        if still:
            raise UnsupportedModelError(
                f"function {fn.name!r} gives no static shape for {still[0]!r}", code="dynamic_shape"
            )
    for formal, actual in zip(fn.input, node.input, strict=True):
        # An attention kernel reads its masks as parameters whatever their size; their values
        # only tell its match whether a Where keeps a causal triangle (plan/attention_match.py).
        if actual in initializers and (_small(initializers[actual]) or template == "attention"):
            constants[formal] = initializers[actual]
    members = doc.get("members") or [n.name for n in nodes]
    return KernelSpec(
        symbol="",
        template=template,
        nodes=tuple(nodes),
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        tensors=body_tensors,
        constants=constants,
        pattern=str(doc.get("pattern") or ""),
        members=tuple(str(m) for m in members),  # type: ignore[union-attr]
        weights=frozenset(f for f, a in zip(fn.input, node.input, strict=True) if a in initializers),
    )
