"""MobileNetV2 (torchvision layout): inverted residuals with depthwise convs and ReLU6."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx

from .arguments import Style, ZooArgumentError, check_positive, check_style
from .builder import GraphBuilder
from .layers import conv_bn, dropout, global_pool_flatten, linear

#: (expansion t, output channels c, repeats n, first stride s) per stage, as in the paper.
INVERTED_RESIDUAL_SETTING = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                             (6, 160, 3, 2), (6, 320, 1, 1))  # fmt: skip
PROJECT_GAMMA = (0.2, 0.5)


def make_divisible(value: float, divisor: int = 8) -> int:
    """torchvision's channel rounding: the nearest multiple of `divisor`, never 10% below `value`."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def mobilenet_v2(
    width_mult: float = 1.0,
    image_size: int = 224,
    batch: int = 1,
    num_classes: int = 1000,
    channels: int = 3,
    fold_batchnorm: bool = False,
    setting: Sequence[Sequence[int]] = INVERTED_RESIDUAL_SETTING,
    last_channel: int | None = None,
    style: Style = "torchscript",
    opset: int | None = None,
    dynamic_batch: bool = False,
    seed: int = 0,
) -> onnx.ModelProto:
    """MobileNetV2: input `input` [batch, channels, image, image]; output `logits` [batch, num_classes].

    ReLU6 is Clip(0, 6); depthwise convs have group = channels.  BatchNormalization nodes are kept
    unless `fold_batchnorm`.  `setting` lists (t, c, n, s) per stage and `last_channel` the width
    of the final 1x1 conv (default 1280·max(1, width_mult)), so that small variants can be cut.
    `opset` defaults to 17 (torchscript) or 18 (dynamo).
    """
    opset = opset if opset is not None else (17 if style == "torchscript" else 18)
    check_style(style, opset)
    check_positive(image_size=image_size, batch=batch, num_classes=num_classes, channels=channels)
    if isinstance(width_mult, bool) or not isinstance(width_mult, int | float) or not width_mult > 0:
        raise ZooArgumentError(
            f"width_mult must be a positive number, got {width_mult!r}", argument="width_mult"
        )
    b = GraphBuilder(
        style=style,
        opset=opset,
        seed=seed,
        sizes={"batch": batch},
        dynamic=("batch",) if dynamic_batch else (),
    )
    x = b.add_input("input", np.float32, ["batch", channels, image_size, image_size])
    cin = make_divisible(32 * width_mult)
    stages = _check_setting(setting)
    last = last_channel if last_channel is not None else make_divisible(1280 * max(1.0, width_mult))
    check_positive(last_channel=last)
    index = 0
    with b.scope("features"), b.scope(str(index)):
        x = conv_bn(b, x, channels, cin, 3, name="0", stride=2, act="relu6", fold_batchnorm=fold_batchnorm)
    for t, c, n, s in stages:
        cout = make_divisible(c * width_mult)
        for i in range(n):
            index += 1
            with b.scope("features"), b.scope(str(index)), b.scope("conv"):
                x = _inverted_residual(b, x, cin, cout, s if i == 0 else 1, t, fold_batchnorm)
            cin = cout
    with b.scope("features"), b.scope(str(index + 1)):
        x = conv_bn(b, x, cin, last, 1, name="0", act="relu6", fold_batchnorm=fold_batchnorm)
    x = global_pool_flatten(b, x, last)
    with b.scope("classifier"):
        logits = linear(b, dropout(b, x, 0.2), last, num_classes, name="1", gemm=True)
    b.add_output(logits, "logits", np.float32, ["batch", num_classes])
    args = dict(
        width_mult=width_mult, image_size=image_size, batch=batch, num_classes=num_classes,
        channels=channels, fold_batchnorm=fold_batchnorm, setting=[list(st) for st in stages],
        last_channel=last, style=style, opset=opset,
        dynamic_batch=dynamic_batch, seed=seed,
    )  # fmt: skip
    return b.build("mobilenet_v2", args)


def _inverted_residual(
    b: GraphBuilder, x: str, cin: int, cout: int, stride: int, expand: int, fold: bool
) -> str:
    """[1x1 expand, ReLU6] → 3x3 depthwise, ReLU6 → 1x1 linear projection [+ x]."""
    hidden = round(cin * expand)
    y = x
    if expand != 1:
        y = conv_bn(b, y, cin, hidden, 1, name="expand", act="relu6", fold_batchnorm=fold)
    y = conv_bn(
        b, y, hidden, hidden, 3, name="dw", stride=stride, groups=hidden, act="relu6", fold_batchnorm=fold
    )
    gamma = PROJECT_GAMMA if stride == 1 and cin == cout else (0.8, 1.2)
    y = conv_bn(b, y, hidden, cout, 1, name="project", act=None, fold_batchnorm=fold, bn_gamma=gamma)
    return b.op("Add", x, y) if stride == 1 and cin == cout else y


def _check_setting(setting: Sequence[Sequence[int]]) -> tuple[tuple[int, int, int, int], ...]:
    """Each stage must be four positive ints (t, c, n, s); at least one stage."""
    try:
        stages = tuple(tuple(stage) for stage in setting)
    except TypeError:
        stages = ()

    def valid(stage: tuple[int, ...]) -> bool:
        return len(stage) == 4 and all(type(v) is int and v > 0 for v in stage)

    if not stages or not all(valid(stage) for stage in stages):
        raise ZooArgumentError(
            f"setting must be a non-empty list of (t, c, n, s) positive ints, got {setting!r}",
            argument="setting",
        )
    return stages  # type: ignore[return-value]
