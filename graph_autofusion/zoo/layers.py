"""The torch.nn layers the zoo models share, each emitted the way the exporters lower it.

Every function takes the `GraphBuilder`, the input tensor name and the layer's sizes, draws its
parameters from the builder's generator (so call order fixes the weights) and returns the output
tensor name.  The op sequences follow what `torch.onnx.export` produced for the same modules
(see scripts/export_torch_fixtures.py and the fixtures in tests/data/torch_exports/).
"""

from __future__ import annotations

import math

import numpy as np

from .builder import GraphBuilder


def linear(
    b: GraphBuilder, x: str, fan_in: int, fan_out: int, *, name: str, gemm: bool, bias: bool = True
) -> str:
    """`nn.Linear`: Gemm(transB=1) on a 2-D input (`gemm`), MatMul + Add on a 3-D one.

    Both exporters store the MatMul weight pre-transposed ([in, out]) and keep torch's [out, in]
    layout for Gemm.  TorchScript writes the bias add as Add(bias, y), dynamo as Add(y, bias).
    """
    w = b.normal((fan_out, fan_in), 1.0 / math.sqrt(fan_in))
    bias_value = b.normal((fan_out,), 0.02) if bias else None
    with b.scope(name):
        if gemm:
            inputs = [x, b.initializer(b.param("weight"), w)]
            if bias_value is not None:
                inputs.append(b.initializer(b.param("bias"), bias_value))
            return b.op("Gemm", *inputs, alpha=1.0, beta=1.0, transB=1)
        y = b.op("MatMul", x, b.initializer(b.param("weight.T"), w.T))
        if bias_value is None:
            return y
        bias_name = b.initializer(b.param("bias"), bias_value)
        return b.op("Add", bias_name, y) if b.torchscript else b.op("Add", y, bias_name)


def addmm_linear(
    b: GraphBuilder,
    x: str,
    fan_in: int,
    fan_out: int,
    *,
    name: str,
    lead: list[tuple[str, int]],
    flat_input: bool = False,
) -> str:
    """Hugging Face `Conv1D` (GPT-2): view to 2-D, `addmm` → Gemm with a [in, out] weight, view back.

    `lead` gives the leading dims of `x` (batch, sequence) as (symbol, axis) pairs.  The input
    view is skipped when `x` is already 2-D (dynamo merges it with the reshape before it).
    """
    w = b.normal((fan_in, fan_out), 1.0 / math.sqrt(fan_in))
    bias_value = b.normal((fan_out,), 0.02)
    with b.scope(name):
        flat = x if flat_input else b.reshape(x, [-1, fan_in])
        y = b.op(
            "Gemm",
            flat,
            b.initializer(b.param("weight"), w),
            b.initializer(b.param("bias"), bias_value),
            alpha=1.0,
            beta=1.0,
        )
        return b.reshape(y, [*lead, fan_out], like=x)


def layer_norm(b: GraphBuilder, x: str, hidden: int, *, name: str, eps: float, shared: bool = False) -> str:
    """`nn.LayerNorm` over the last axis: one LayerNormalization from opset 17 on, else decomposed.

    `shared` routes the parameters through Identity nodes (TorchScript style), which is how that
    exporter writes parameters it deduplicated, e.g. tied or identically initialised ones.
    Below opset 17 the TorchScript exporter writes the textbook formula:
    ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add.
    """
    with b.scope(name):
        gamma = b.initializer(b.param("weight"), b.uniform((hidden,), 0.8, 1.2))
        beta = b.initializer(b.param("bias"), b.normal((hidden,), 0.02))
        if shared:
            gamma, beta = b.alias(gamma), b.alias(beta)
        if b.opset >= 17:
            return b.op(
                "LayerNormalization",
                x,
                gamma,
                beta,
                axis=-1,
                epsilon=float(np.float32(eps)),
                stash_type=None if b.torchscript else 1,
            )
        mean = b.reduce_mean(x, [-1])
        centered = b.op("Sub", x, mean)
        var = b.reduce_mean(b.op("Pow", centered, b.const(2.0)), [-1])
        std = b.op("Sqrt", b.op("Add", var, b.const(eps)))
        normed = b.op("Div", centered, std)
        return b.op("Add", b.op("Mul", normed, gamma), beta)


def gelu_erf(b: GraphBuilder, x: str) -> str:
    """Exact GELU, x·½(1 + erf(x/√2)), in the exporters' operand order.

    TorchScript: Div, Erf, Add, Mul(x, ·), Mul(·, 0.5); dynamo: Div, Erf, Add, Mul(0.5, ·), Mul(x, ·).
    """
    erf = b.op("Erf", b.op("Div", x, b.const(math.sqrt(2.0))))
    one_plus = b.op("Add", erf, b.const(1.0))
    if b.torchscript:
        return b.op("Mul", b.op("Mul", x, one_plus), b.const(0.5))
    return b.op("Mul", x, b.op("Mul", b.const(0.5), one_plus))


def gelu_tanh(b: GraphBuilder, x: str) -> str:
    """GPT-2's "new" GELU: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).

    Mul, Pow, Mul, Add, Mul, Tanh, Add, Mul — the order `torch.onnx.export` writes it in.
    """
    half_x = b.op("Mul", x, b.const(0.5))
    cubed = b.op("Mul", b.op("Pow", x, b.const(3.0)), b.const(0.044715))
    inner = b.op("Mul", b.op("Add", x, cubed), b.const(math.sqrt(2.0 / math.pi)))
    return b.op("Mul", half_x, b.op("Add", b.op("Tanh", inner), b.const(1.0)))


def dropout(b: GraphBuilder, x: str, ratio: float) -> str:
    """An inference-mode Dropout (identity) as some TorchScript exports leave behind; dynamo drops it."""
    if not b.torchscript:
        return x
    return b.op("Dropout", x, b.const(ratio))


def conv_bn(
    b: GraphBuilder,
    x: str,
    cin: int,
    cout: int,
    kernel: int,
    *,
    name: str,
    stride: int = 1,
    groups: int = 1,
    act: str | None = "relu",
    fold_batchnorm: bool = False,
    bn_gamma: tuple[float, float] = (0.8, 1.2),
) -> str:
    """Conv2d(bias=False) → BatchNorm2d → ReLU / ReLU6 (Clip(0, 6)) / nothing.

    With `fold_batchnorm` the BN is folded into the conv weight and bias, which is what both
    exporters do in eval mode; otherwise BatchNormalization stays (an export with
    `training=TrainingMode.PRESERVE`), so an engine's own BN folding has something to do.
    `bn_gamma` bounds the BN scale; residual branches use a small one to keep depth stable.
    """
    fan_in = cin // groups * kernel * kernel
    w = b.normal((cout, cin // groups, kernel, kernel), math.sqrt(2.0 / fan_in))
    gamma = b.uniform((cout,), *bn_gamma)
    beta = b.normal((cout,), 0.05)
    mean = b.normal((cout,), 0.05)
    var = b.uniform((cout,), 0.8, 1.2)
    eps = 1e-5
    conv_attrs = {
        "dilations": [1, 1],
        "group": groups,
        "kernel_shape": [kernel, kernel],
        "pads": [(kernel - 1) // 2] * 4,
        "strides": [stride, stride],
    }
    with b.scope(name):
        if fold_batchnorm:
            scale = gamma / np.sqrt(var + eps)
            wf = (w * scale[:, None, None, None]).astype(np.float32)
            bf = (beta - mean * scale).astype(np.float32)
            y = b.op(
                "Conv",
                x,
                b.initializer(b.param("weight"), wf),
                b.initializer(b.param("bias"), bf),
                **conv_attrs,
            )
        else:
            y = b.op("Conv", x, b.initializer(b.param("conv.weight"), w), **conv_attrs)
            params = [
                b.initializer(b.param(f"bn.{p}"), v)
                for p, v in (("weight", gamma), ("bias", beta), ("running_mean", mean), ("running_var", var))
            ]
            extra = {"momentum": 0.9} if b.torchscript else {"training_mode": 0}
            y = b.op("BatchNormalization", y, *params, epsilon=eps, **extra)
        if act == "relu":
            return b.op("Relu", y)
        if act == "relu6":
            return b.op("Clip", y, b.const(0.0), b.const(6.0))
        return y


def global_pool_flatten(b: GraphBuilder, x: str, channels: int) -> str:
    """`adaptive_avg_pool2d(x, 1)` then `flatten(x, 1)`.

    TorchScript: GlobalAveragePool, Flatten.  dynamo: ReduceMean over (-1, -2) with keepdims,
    then a Reshape to (batch, channels).
    """
    if b.torchscript:
        return b.op("Flatten", b.op("GlobalAveragePool", x), axis=1)
    return b.reshape(b.reduce_mean(x, [-1, -2]), [("batch", 0), channels])
