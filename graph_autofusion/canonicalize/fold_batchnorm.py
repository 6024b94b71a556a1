"""Pass `fold_batchnorm`: fold an inference BatchNormalization into the Conv (or ConvTranspose) before it.

    y = scale * (conv(x, W) + B - mean) / sqrt(var + eps) + bias
      = conv(x, W * s) + (B - mean) * s + bias          with s = scale / sqrt(var + eps) per channel

The new weights are computed in float64 and rounded once to the weight dtype, so the folded graph
matches the original within fp32 rounding.  New initializers get fresh names: a weight shared with
another Conv is never changed under it.  The Conv takes over the BN's output name, so names read
elsewhere (graph outputs included) stay as they were.
"""

from __future__ import annotations

import numpy as np
from onnx import NodeProto

from ._graph import DEFAULT_DOMAINS, WorkGraph


def fold_batchnorm(work: WorkGraph) -> int:
    """Fold every eligible Conv→BatchNormalization pair; returns how many BNs were removed."""
    producers = work.producers()
    consumers = work.consumers()
    graph_outputs = set(work.output_names)
    removed: set[int] = set()
    for bn in work.nodes:
        if bn.op_type != "BatchNormalization" or bn.domain not in DEFAULT_DOMAINS:
            continue
        conv = producers.get(bn.input[0])
        if conv is None or conv.domain not in DEFAULT_DOMAINS:
            continue
        if conv.op_type not in ("Conv", "ConvTranspose"):
            continue
        if bn.input[0] in graph_outputs or len(consumers.get(bn.input[0], ())) != 1:
            continue
        if _fold_pair(work, conv, bn):
            removed.add(id(bn))
    work.nodes = [n for n in work.nodes if id(n) not in removed]
    return len(removed)


def _attr(node: NodeProto, name: str, default: float) -> float:
    for attr in node.attribute:
        if attr.name == name:
            return attr.f if attr.type == attr.FLOAT else attr.i
    return default


def _fold_pair(work: WorkGraph, conv: NodeProto, bn: NodeProto) -> bool:
    if any(bn.output[1:]) or _attr(bn, "training_mode", 0):
        return False  # training form: it also updates running statistics
    if not _attr(bn, "spatial", 1):
        return False  # opset < 9 per-position statistics
    params = list(bn.input[1:5])
    weight_names = [conv.input[1]] + ([conv.input[2]] if len(conv.input) > 2 and conv.input[2] else [])
    if len(params) != 4 or not all(work.is_constant(n) for n in params + weight_names):
        return False
    weight = work.array(conv.input[1])
    if weight.dtype.kind != "f" or weight.ndim < 3:
        return False
    group = int(_attr(conv, "group", 1))
    if conv.op_type == "Conv":
        channels = weight.shape[0]
    else:
        if weight.shape[0] % group:
            return False
        channels = weight.shape[1] * group
    scale, bias, mean, var = (np.asarray(work.array(n), dtype=np.float64) for n in params)
    if any(p.shape != (channels,) for p in (scale, bias, mean, var)):
        return False
    conv_bias = (
        np.asarray(work.array(weight_names[1]), dtype=np.float64)
        if len(weight_names) > 1
        else np.zeros(channels)
    )
    if conv_bias.shape != (channels,):
        return False
    factor = scale / np.sqrt(var + _attr(bn, "epsilon", 1e-5))
    kernel_ones = (1,) * (weight.ndim - 2)
    if conv.op_type == "Conv":
        new_weight = weight.astype(np.float64) * factor.reshape((channels, 1, *kernel_ones))
    else:
        # ConvTranspose weights are [C_in, C_out / group, k...]; output channel = g * (C_out/group) + j.
        per_group = weight.shape[1]
        grouped = weight.astype(np.float64).reshape((group, weight.shape[0] // group, *weight.shape[1:]))
        grouped = grouped * factor.reshape((group, 1, per_group, *kernel_ones))
        new_weight = grouped.reshape(weight.shape)
    new_bias = (conv_bias - mean) * factor + bias
    base = conv.name or conv.output[0]
    weight_name = work.fresh_name(f"{base}_bn_weight")
    bias_name = work.fresh_name(f"{base}_bn_bias")
    work.set_constant(weight_name, new_weight.astype(weight.dtype))
    work.set_constant(bias_name, new_bias.astype(weight.dtype))
    conv.input[1] = weight_name
    if len(conv.input) > 2:
        conv.input[2] = bias_name
    else:
        conv.input.append(bias_name)
    conv.output[0] = bn.output[0]
    return True
