"""Pass `bind_shapes`: give every graph input concrete dims from `config.input_shapes`.

Everything downstream (planning, codegen, the memory arena) needs static shapes, so symbolic
input dims must be bound here.  ONNX treats equal `dim_param` names as the same size, so a value
bound for `batch` on one input also binds `batch` on the others.
"""

from __future__ import annotations

from onnx import TensorShapeProto, ValueInfoProto

from ..config import FusionConfig
from ..errors import InvalidConfigError, UnboundDimensionError, UnsupportedModelError
from ._graph import WorkGraph


def bind_shapes(work: WorkGraph, config: FusionConfig) -> int:
    """Bind input dims in place; returns how many dims changed from symbolic/unknown to concrete."""
    inputs = {i.name: i for i in work.inputs if i.name not in work.initializers}
    for info in inputs.values():
        if info.type.WhichOneof("value") != "tensor_type":
            raise UnsupportedModelError(
                f"graph input {info.name!r} is not a tensor ({info.type.WhichOneof('value')}); "
                "only tensor inputs are supported.",
                code="unsupported_input",
                input=info.name,
            )
    symbols: dict[str, tuple[int, str]] = {}  # dim_param -> (value, input that bound it)
    bound = 0
    for name, dims in config.input_shapes.items():
        info = inputs.get(name)
        if info is None:
            raise InvalidConfigError(
                f"input_shapes names {name!r}, which is not an input of the model; its inputs are "
                f"{', '.join(repr(n) for n in inputs) or 'none'}.",
                code="invalid_input_shapes",
                input=name,
            )
        bound += _bind(info, dims, symbols)
    for info in inputs.values():
        if info.name in config.input_shapes:
            continue
        shape = info.type.tensor_type.shape
        for dim in shape.dim:
            if dim.WhichOneof("value") == "dim_param" and dim.dim_param in symbols:
                dim.dim_value = symbols[dim.dim_param][0]
                bound += 1
    for info in inputs.values():
        _require_static(info)
        work.types[info.name].CopyFrom(info.type)
    return bound


def _bind(info: ValueInfoProto, dims: list[int], symbols: dict[str, tuple[int, str]]) -> int:
    tensor_type = info.type.tensor_type
    if not tensor_type.HasField("shape"):
        tensor_type.shape.CopyFrom(TensorShapeProto())
        for value in dims:
            tensor_type.shape.dim.add().dim_value = value
        return len(dims)
    current = tensor_type.shape.dim
    if len(current) != len(dims):
        raise InvalidConfigError(
            f"input_shapes[{info.name!r}] = {dims} has rank {len(dims)}, but the input has rank "
            f"{len(current)} ({_describe(info)}).",
            code="invalid_input_shapes",
            input=info.name,
        )
    changed = 0
    for axis, (dim, value) in enumerate(zip(current, dims, strict=True)):
        kind = dim.WhichOneof("value")
        if kind == "dim_value":
            if dim.dim_value != value:
                raise InvalidConfigError(
                    f"input_shapes[{info.name!r}] sets dimension {axis} to {value}, but the model fixes "
                    f"it at {dim.dim_value} ({_describe(info)}).",
                    code="invalid_input_shapes",
                    input=info.name,
                )
            continue
        if kind == "dim_param":
            previous = symbols.get(dim.dim_param)
            if previous is not None and previous[0] != value:
                raise InvalidConfigError(
                    f"input_shapes gives dimension {dim.dim_param!r} the value {value} for {info.name!r} "
                    f"but {previous[0]} for {previous[1]!r}; the model declares them the same size.",
                    code="invalid_input_shapes",
                    input=info.name,
                )
            symbols[dim.dim_param] = (value, info.name)
        dim.dim_value = value
        changed += 1
    return changed


def _require_static(info: ValueInfoProto) -> None:
    tensor_type = info.type.tensor_type
    if not tensor_type.HasField("shape"):
        raise UnboundDimensionError(
            f"input {info.name!r} has an unknown rank; bind it with input_shapes={{{info.name!r}: [...]}}.",
            code="unbound_dimension",
            input=info.name,
        )
    for axis, dim in enumerate(tensor_type.shape.dim):
        if dim.WhichOneof("value") == "dim_value":
            continue
        label = f" ({dim.dim_param!r})" if dim.dim_param else ""
        kind = "symbolic" if dim.dim_param else "unknown"
        raise UnboundDimensionError(
            f"input {info.name!r} dimension {axis}{label} is {kind}; bind it with "
            f"input_shapes={{{info.name!r}: {_template(info)}}} using concrete sizes.",
            code="unbound_dimension",
            input=info.name,
            dimension=axis,
            dim_param=dim.dim_param,
        )


def _template(info: ValueInfoProto) -> str:
    parts = []
    for dim in info.type.tensor_type.shape.dim:
        kind = dim.WhichOneof("value")
        parts.append(str(dim.dim_value) if kind == "dim_value" else f"<{dim.dim_param or '?'}>")
    return "[" + ", ".join(parts) + "]"


def _describe(info: ValueInfoProto) -> str:
    return f"declared shape {_template(info)}"
