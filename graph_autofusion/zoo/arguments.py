"""Checks on zoo builder arguments, and the errors they raise.

A zoo model is built from user-chosen sizes (the CLI and benchmarks pass them through), so a bad
size must fail up front with a sentence naming the argument, not deep inside ONNX shape inference.
The errors are `InvalidConfigError`s (stable `code`) that are also the built-in exception a plain
Python caller would expect (`ValueError`, `KeyError`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from graph_autofusion.errors import InvalidConfigError

Style = Literal["torchscript", "dynamo"]

#: Opsets each exporter style emits: the TorchScript exporter's range and the dynamo exporter's.
OPSETS: dict[str, range] = {"torchscript": range(13, 18), "dynamo": range(18, 22)}


class ZooArgumentError(InvalidConfigError, ValueError):
    """A zoo builder argument is out of range or inconsistent with another one."""

    code = "zoo_invalid_argument"


class UnknownZooModelError(InvalidConfigError, KeyError):
    """`build()` was asked for a model the zoo does not have."""

    code = "zoo_unknown_model"


def check_style(style: str, opset: int) -> None:
    """Reject a style/opset pair no real exporter produces (e.g. dynamo at opset 13)."""
    if style not in OPSETS:
        raise ZooArgumentError(f"style must be 'torchscript' or 'dynamo', got {style!r}", argument="style")
    allowed = OPSETS[style]
    if not isinstance(opset, int) or opset not in allowed:
        raise ZooArgumentError(
            f"opset {opset!r} is not one the {style} exporter emits "
            f"(use {allowed.start}..{allowed.stop - 1})",
            argument="opset",
        )


def check_positive(**values: int) -> None:
    """Every named value must be a positive int (bools are refused: they are ints by accident)."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ZooArgumentError(f"{name} must be a positive integer, got {value!r}", argument=name)


def check_divides(name: str, value: int, by_name: str, by: int) -> None:
    if value % by:
        raise ZooArgumentError(f"{name}={value} is not divisible by {by_name}={by}", argument=name)


def check_at_most(name: str, value: int, limit_name: str, limit: int) -> None:
    if value > limit:
        raise ZooArgumentError(f"{name}={value} exceeds {limit_name}={limit}", argument=name)


def check_layers(name: str, layers: Iterable[int]) -> tuple[int, ...]:
    """A per-stage block count: a non-empty sequence of non-negative ints, at least one positive."""
    try:
        counts = tuple(layers)
    except TypeError:
        raise ZooArgumentError(f"{name} must be a sequence of block counts", argument=name) from None
    if (
        not counts
        or any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in counts)
        or not any(counts)
    ):
        raise ZooArgumentError(
            f"{name} must be non-negative block counts with at least one block, got {counts!r}",
            argument=name,
        )
    return counts
