"""Registry mechanics: `OpKind`, `OpDef`, and lookup with an `opaque` fallback for unknown ops."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

Shape = tuple[int, ...]


class OpKind(IntEnum):
    """Fusion kinds ordered like TVM's op-pattern lattice: legality is mostly a max over kinds."""

    VIEW = 0  # changes only metadata (Reshape, Squeeze, ...): no kernel, the runtime aliases buffers
    ELEMENTWISE = 1  # out[i] = f(in[i])
    BROADCAST = 2  # out[i] = f(in_a[bcast(i)], in_b[bcast(i)], ...)
    INJECTIVE = 3  # out[i] = in[map(i)]: Transpose, Slice, Gather, Concat, Expand, ...
    REDUCE = 4  # reduces (or windows) over axes: Reduce*, Softmax, LayerNorm, pooling
    ANCHOR = 5  # compute-bound contraction that takes an elementwise epilogue: Conv, MatMul, Gemm
    OPAQUE = 6  # anything else: stays a kernel of its own

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class OpCost:
    flops: int
    bytes: int


@dataclass(frozen=True)
class NodeShapes:
    """What a cost function sees: static input/output shapes, element sizes and attributes."""

    inputs: Sequence[Shape | None]
    outputs: Sequence[Shape]
    itemsizes_in: Sequence[int]
    itemsizes_out: Sequence[int]
    attrs: Mapping[str, object]

    def io_bytes(self) -> int:
        total = sum(
            numel(s) * b for s, b in zip(self.inputs, self.itemsizes_in, strict=False) if s is not None
        )
        return total + sum(numel(s) * b for s, b in zip(self.outputs, self.itemsizes_out, strict=False))


FlopsFn = Callable[[NodeShapes], int]
# The op's formula in the kernel IR: argument expressions (None for an absent optional input) and
# attributes in, one expression out.
ScalarFn = Callable[[Sequence[Any], Mapping[str, object]], Any]


@dataclass(frozen=True)
class OpDef:
    op_type: str
    kind: OpKind
    flops: FlopsFn
    domain: str = ""
    scalar: ScalarFn | None = None  # the IR formula of an elementwise/broadcast op
    description: str = ""
    tags: frozenset[str] = field(default_factory=frozenset)

    def cost(self, shapes: NodeShapes) -> OpCost:
        return OpCost(flops=int(self.flops(shapes)), bytes=shapes.io_bytes())


_REGISTRY: dict[tuple[str, str], OpDef] = {}


def numel(shape: Shape | None) -> int:
    return math.prod(shape) if shape else (1 if shape == () else 0)


def register(op: OpDef) -> OpDef:
    key = (op.domain, op.op_type)
    if key in _REGISTRY:
        raise ValueError(f"op {op.op_type!r} registered twice")
    _REGISTRY[key] = op
    return op


def _opaque_flops(s: NodeShapes) -> int:
    return sum(numel(o) for o in s.outputs)


def lookup(op_type: str, domain: str = "") -> OpDef:
    """The entry for an op; unknown ops are `opaque` (a kernel of their own), never an error."""
    domain = "" if domain == "ai.onnx" else domain
    found = _REGISTRY.get((domain, op_type))
    if found is not None:
        return found
    return OpDef(
        op_type=op_type,
        kind=OpKind.OPAQUE,
        flops=_opaque_flops,
        domain=domain,
        description="not in the registry: kept as a kernel of its own",
    )


def registered_ops() -> dict[tuple[str, str], OpDef]:
    return dict(_REGISTRY)


def ops_tagged(tag: str) -> frozenset[str]:
    """Default-domain op types that carry `tag` (which template computes them, ...)."""
    return frozenset(op.op_type for (domain, _), op in _REGISTRY.items() if not domain and tag in op.tags)


def per_output(cost: float) -> FlopsFn:
    """Flops = cost × output elements (elementwise-like ops)."""
    return lambda s: int(cost * sum(numel(o) for o in s.outputs))


def per_input(cost: float) -> FlopsFn:
    """Flops = cost × elements of the first input (reductions)."""
    return lambda s: int(cost * numel(s.inputs[0]) if s.inputs and s.inputs[0] is not None else 0)


ZERO: FlopsFn = lambda s: 0  # noqa: E731
