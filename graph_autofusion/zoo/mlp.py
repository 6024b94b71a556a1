"""A plain MLP classifier (784 → 512 → 256 → 10 with ReLU), the smallest end-to-end model."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx

from .arguments import Style, ZooArgumentError, check_positive, check_style
from .builder import GraphBuilder
from .layers import dropout, linear


def mlp(
    in_features: int = 784,
    hidden: Sequence[int] = (512, 256),
    num_classes: int = 10,
    batch: int = 1,
    use_gemm: bool = True,
    style: Style = "torchscript",
    opset: int | None = None,
    dynamic_batch: bool = False,
    seed: int = 0,
) -> onnx.ModelProto:
    """MLP: input `input` [batch, in_features]; output `logits` [batch, num_classes].

    Each Linear is a Gemm (what both exporters emit for a 2-D input) or, with `use_gemm=False`,
    MatMul + Add (what they emit when the input has a leading sequence axis).
    `opset` defaults to 17 (torchscript) or 18 (dynamo).
    """
    opset = opset if opset is not None else (17 if style == "torchscript" else 18)
    check_style(style, opset)
    check_positive(in_features=in_features, num_classes=num_classes, batch=batch)
    widths = tuple(hidden) if not isinstance(hidden, int) else (hidden,)
    for i, width in enumerate(widths):
        check_positive(**{f"hidden[{i}]": width})
    if not isinstance(use_gemm, bool):
        raise ZooArgumentError(f"use_gemm must be a bool, got {use_gemm!r}", argument="use_gemm")
    b = GraphBuilder(
        style=style,
        opset=opset,
        seed=seed,
        sizes={"batch": batch},
        dynamic=("batch",) if dynamic_batch else (),
    )
    x = b.add_input("input", np.float32, ["batch", in_features])
    dims = (in_features, *widths, num_classes)
    with b.scope("net"):
        for i in range(len(dims) - 1):
            x = linear(b, x, dims[i], dims[i + 1], name=str(2 * i), gemm=use_gemm)
            if i < len(dims) - 2:
                with b.scope(str(2 * i + 1)):
                    x = b.op("Relu", x)
                if i == 0:
                    x = dropout(b, x, 0.1)
    b.add_output(x, "logits", np.float32, ["batch", num_classes])
    args = dict(
        in_features=in_features, hidden=list(widths), num_classes=num_classes, batch=batch,
        use_gemm=use_gemm, style=style, opset=opset, dynamic_batch=dynamic_batch, seed=seed,
    )  # fmt: skip
    return b.build("mlp", args)
