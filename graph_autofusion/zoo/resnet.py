"""ResNet-50 (torchvision layout: v1.5 Bottleneck, stride on the 3x3 conv)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx

from .arguments import Style, check_layers, check_positive, check_style
from .builder import GraphBuilder
from .layers import conv_bn, global_pool_flatten, linear

EXPANSION = 4
#: BN scale range of the last conv in each residual branch: small, so the residual stream stays
#: bounded through 16 blocks of random weights (torchvision's zero_init_residual, softened).
RESIDUAL_GAMMA = (0.1, 0.3)


def resnet50(
    batch: int = 1,
    image_size: int = 224,
    width: int = 64,
    layers: Sequence[int] = (3, 4, 6, 3),
    num_classes: int = 1000,
    channels: int = 3,
    fold_batchnorm: bool = False,
    style: Style = "torchscript",
    opset: int | None = None,
    dynamic_batch: bool = False,
    seed: int = 0,
) -> onnx.ModelProto:
    """ResNet-50: input `input` [batch, channels, image, image]; output `logits` [batch, num_classes].

    `width` is the stem width (stage widths are width·2^i, outputs 4x that); `layers` the bottleneck
    count per stage.  BatchNormalization nodes are kept unless `fold_batchnorm` (what an eval-mode
    export does).  `opset` defaults to 17 (torchscript) or 18 (dynamo).
    """
    opset = opset if opset is not None else (17 if style == "torchscript" else 18)
    check_style(style, opset)
    check_positive(
        batch=batch, image_size=image_size, width=width, num_classes=num_classes, channels=channels
    )
    stages = check_layers("layers", layers)
    b = GraphBuilder(
        style=style,
        opset=opset,
        seed=seed,
        sizes={"batch": batch},
        dynamic=("batch",) if dynamic_batch else (),
    )
    x = b.add_input("input", np.float32, ["batch", channels, image_size, image_size])
    x = conv_bn(b, x, channels, width, 7, name="conv1", stride=2, fold_batchnorm=fold_batchnorm)
    x = b.op("MaxPool", x, ceil_mode=0, kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])
    cin = width
    for stage, blocks in enumerate(stages):
        planes = width * 2**stage
        for block in range(blocks):
            stride = 2 if (block == 0 and stage > 0) else 1
            with b.scope(f"layer{stage + 1}"), b.scope(str(block)):
                x = _bottleneck(b, x, cin, planes, stride, fold_batchnorm)
            cin = planes * EXPANSION
    x = global_pool_flatten(b, x, cin)
    logits = linear(b, x, cin, num_classes, name="fc", gemm=True)
    b.add_output(logits, "logits", np.float32, ["batch", num_classes])
    args = dict(
        batch=batch, image_size=image_size, width=width, layers=list(stages), num_classes=num_classes,
        channels=channels, fold_batchnorm=fold_batchnorm, style=style, opset=opset,
        dynamic_batch=dynamic_batch, seed=seed,
    )  # fmt: skip
    return b.build("resnet50", args)


def _bottleneck(b: GraphBuilder, x: str, cin: int, planes: int, stride: int, fold: bool) -> str:
    """1x1 reduce → 3x3 (strided) → 1x1 expand, plus the (downsampled) identity, then ReLU."""
    cout = planes * EXPANSION
    out = conv_bn(b, x, cin, planes, 1, name="conv1", fold_batchnorm=fold)
    out = conv_bn(b, out, planes, planes, 3, name="conv2", stride=stride, fold_batchnorm=fold)
    out = conv_bn(
        b, out, planes, cout, 1, name="conv3", act=None, fold_batchnorm=fold, bn_gamma=RESIDUAL_GAMMA
    )
    identity = x
    if stride != 1 or cin != cout:
        identity = conv_bn(
            b, x, cin, cout, 1, name="downsample", stride=stride, act=None, fold_batchnorm=fold
        )
    return b.op("Relu", b.op("Add", out, identity))
