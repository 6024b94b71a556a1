"""Pass `normalize_opset`: one set of operator semantics for the planner and the backends.

Several ONNX ops changed meaning or form between opsets: Softmax / LogSoftmax / Hardmax before 13
flatten the input to 2-D at `axis` (default 1) and normalize whole trailing blocks, where from 13
on they normalize the single `axis` (default -1); Reduce* take `axes` as an attribute before 18
(ReduceSum before 13) and as an input after; Split sizes, Clip bounds, Pad pads, Slice windows,
Squeeze/Unsqueeze axes moved from attributes to inputs; Upsample became Resize. A generator that
reads one op under the other opset's rules gives a wrong answer (an opset-11 Softmax over a rank-3
tensor was off by up to 2.7), and every reader re-deciding per opset is how that happens.

So canonicalization raises the default domain to at least `TARGET_OPSET` with ONNX's own version
converter (one adapter per op change, e.g. an old Softmax becomes Flatten → Softmax(axis=-1) →
Reshape), and everything downstream reads the opset-18 forms only. Models at or above the target
are left alone (their forms are the target's). Weights do not travel through the converter: large
initializers go in as typed graph inputs (`WorkGraph.to_model(light=True)`) and stay where they are.

Before converting, the Softmax family of an opset < 13 model is rewritten in place to an exact
opset-independent form, `Flatten(axis) → op(axis=-1) → Reshape(Shape(x))`: on a 2-D input the old
and new semantics agree. The converter does this for Softmax and LogSoftmax itself, but has no
Hardmax adapter (it bumps the version and the answer changes), so the rewrite is ours for all
three. BatchNormalization before 9 with spatial=0 (per-position statistics, which the converter
cannot adapt) becomes its formula in elementwise ops. Where the converter cannot be used — a
control-flow subgraph (Scan 8 → 9 changes its inputs' meaning, which the converter does not
preserve), model-local functions, or a converter error — the opset is kept, and those rewrites
are what make the planner and the generators read these ops the same way under either opset.
"""

from __future__ import annotations

import logging

from onnx import NodeProto, helper, version_converter

from ..onnx_utils import subgraphs
from ._graph import DEFAULT_DOMAINS, WorkGraph

log = logging.getLogger(__name__)

#: The default-domain opset every canonical model is raised to (Reduce* axes as inputs from here).
TARGET_OPSET = 18
#: Opset 18 needs IR version 8.
TARGET_IR_VERSION = 8
_SOFTMAX_FAMILY = frozenset({"Softmax", "LogSoftmax", "Hardmax"})
_COERCED_BEFORE = 13  # the opset from which the Softmax family stopped flattening to 2-D


def normalize_opset(work: WorkGraph) -> int:
    """Raise the model to `TARGET_OPSET`, or rewrite what must be rewritten; return nodes changed."""
    if not work.opset or work.opset >= TARGET_OPSET:
        return 0
    # Always first: the converter has no Hardmax 12 → 13 adapter (it only bumps the version, which
    # silently changes the answer), and on the 2-D form every converter step is a no-op.
    coerced = _coerce_softmax_family(work) + _per_position_batchnorm(work)
    reason = _why_not_convert(work)
    if reason is None:
        try:
            return coerced + _convert(work)
        except Exception as exc:  # the converter raises plain RuntimeError/ValueError: keep the opset
            reason = f"the version converter failed: {exc}"
    log.info("opset %d kept (%s); only the Softmax family was rewritten", work.opset, reason)
    return coerced


def _why_not_convert(work: WorkGraph) -> str | None:
    if work.source.functions:
        return "the model has local functions"
    if any(list(subgraphs(node)) for node in work.nodes):
        return "the model has control-flow subgraphs"
    return None


def _convert(work: WorkGraph) -> int:
    before = [n.SerializeToString(deterministic=True) for n in work.nodes]
    light = work.to_model(light=True)
    converted = version_converter.convert_version(light, TARGET_OPSET)
    for tensor in converted.graph.initializer:
        if tensor.name not in work.initializers:
            work.set_constant(tensor.name, tensor)
    nodes = []
    for node in converted.graph.node:
        copy = NodeProto()
        copy.CopyFrom(node)
        nodes.append(copy)
    work.nodes = nodes
    work.set_default_opset(TARGET_OPSET)
    work.ir_version = max(work.ir_version, TARGET_IR_VERSION)
    work.forget_names()
    unchanged = set(before)
    return sum(1 for n in nodes if n.SerializeToString(deterministic=True) not in unchanged)


def _coerce_softmax_family(work: WorkGraph) -> int:
    """Old-opset Softmax/LogSoftmax/Hardmax → Flatten(axis) → op(axis=-1) → Reshape(Shape(x)).

    On the 2-D Flatten output, axis -1 means the same under either opset's rules.
    """
    if work.opset >= _COERCED_BEFORE:
        return 0
    nodes: list[NodeProto] = []
    rewritten = 0
    for node in work.nodes:
        if node.op_type not in _SOFTMAX_FAMILY or node.domain not in DEFAULT_DOMAINS:
            nodes.append(node)
            continue
        axis = int(next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), 1))
        if axis == -1:  # flattening at the last axis: both semantics normalize each last-axis row
            nodes.append(node)
            continue
        x, y = node.input[0], node.output[0]
        base = node.name or node.op_type
        flat, shape, out2d = (work.fresh_name(f"{base}_{part}") for part in ("flat", "shape", "2d"))
        nodes.extend(
            [
                helper.make_node("Shape", [x], [shape], name=f"{base}_shape"),
                helper.make_node("Flatten", [x], [flat], name=f"{base}_flatten", axis=axis),
                helper.make_node(node.op_type, [flat], [out2d], name=node.name, axis=-1),
                helper.make_node("Reshape", [out2d, shape], [y], name=f"{base}_reshape"),
            ]
        )
        rewritten += 1
    work.nodes = nodes
    return rewritten


def _per_position_batchnorm(work: WorkGraph) -> int:
    """BatchNormalization before 9 with spatial=0 → its formula in elementwise ops.

    Its statistics are per position (C x H x W), which broadcast against N x C x H x W as they
    are; the converter has no adapter for it (it fails), and neither the generator nor
    onnx.reference reads that form. y = (x - mean) / sqrt(var + eps) * scale + bias, exactly.
    """
    if work.opset >= 9:
        return 0
    nodes: list[NodeProto] = []
    rewritten = 0
    for node in work.nodes:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        inference = len([o for o in node.output if o]) == 1
        if node.op_type != "BatchNormalization" or attrs.get("spatial", 1) != 0 or not inference:
            nodes.append(node)
            continue
        x, scale, bias, mean, var = node.input[:5]
        base = node.name or "batchnorm"
        eps, shifted, std, centred, normed, scaled = (
            work.fresh_name(f"{base}_{part}")
            for part in ("eps", "var_eps", "std", "centred", "normed", "scaled")
        )
        elem = work.types[var].tensor_type.elem_type if var in work.types else 1
        work.set_constant(eps, helper.make_tensor(eps, elem, [], [float(attrs.get("epsilon", 1e-5))]))
        nodes.extend(
            [
                helper.make_node("Add", [var, eps], [shifted], name=f"{base}_var_eps"),
                helper.make_node("Sqrt", [shifted], [std], name=f"{base}_std"),
                helper.make_node("Sub", [x, mean], [centred], name=f"{base}_centre"),
                helper.make_node("Div", [centred, std], [normed], name=f"{base}_normalize"),
                helper.make_node("Mul", [normed, scale], [scaled], name=f"{base}_scale"),
                helper.make_node("Add", [scaled, bias], [node.output[0]], name=f"{base}_bias"),
            ]
        )
        rewritten += 1
    work.nodes = nodes
    return rewritten


__all__ = ["TARGET_OPSET", "normalize_opset"]
