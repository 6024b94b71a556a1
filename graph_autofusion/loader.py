"""Stage 1 of the pipeline: turn what a user handed us into a trustworthy `onnx.ModelProto`.

Everything a user (or a tenant of the service) can send is hostile until proven otherwise, so this
stage refuses early and precisely: every refusal is a `FusionError` with a stable `code` —

    not_onnx            the bytes are not an ONNX model (empty, not protobuf, no graph)
    file_not_found      the path does not name a readable file
    model_too_large     over `config.max_model_bytes` (checked before parsing)
    too_many_nodes      over `config.max_nodes`
    unsupported_opset   default-domain opset outside [7, newest] or an unknown domain
    external_data       external tensor data referenced from bytes / an in-memory model
    external_data_path  external data outside the model's own folder
    graph_cycle         nodes that cannot be topologically ordered
    invalid_graph       anything else onnx.checker rejects

A graph that is merely listed out of order is sorted rather than refused.  External data is only
ever read from regular files inside the model's folder (after resolving symlinks).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import ModelProto, TensorProto

from .config import FusionConfig
from .errors import InvalidModelError, ModelTooLargeError, UnsupportedModelError
from .onnx_utils import (
    count_nodes,
    default_opset,
    expected_nbytes,
    iter_graphs,
    iter_tensors,
    light_model,
    topological_order,
)

MIN_OPSET = 7

#: Domains whose ops some runtime we target knows.  Any other domain must be defined by the model's
#: own functions, or the model cannot be run anywhere we verify it.
KNOWN_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "com.microsoft", "ai.graph_autofusion"})

Source = str | os.PathLike[str] | bytes | bytearray | memoryview | ModelProto


def load_model(source: Source, config: FusionConfig) -> ModelProto:
    """Load, guard and (if needed) topologically sort a model.

    `source` is a path, the serialized bytes, or a `ModelProto`.  A `ModelProto` is returned as it
    is when nothing needs fixing (it is not copied: callers treat stage outputs as read-only), and
    as a sorted copy when its nodes were out of order.
    """
    if isinstance(source, ModelProto):
        model = source
        _check_external_data_absent(model)
        light, data_bytes = light_model(model)
        size = light.ByteSize() + data_bytes  # ByteSize of the full model would serialize the weights
        _check_size(size, config, what="model")
    elif isinstance(source, bytes | bytearray | memoryview):
        data = bytes(source)
        _check_size(len(data), config, what="model")
        model = _parse(data, origin="the uploaded bytes")
        _check_external_data_absent(model)
    elif isinstance(source, str | os.PathLike):
        model = _load_path(Path(os.fspath(source)), config)
    else:
        raise TypeError(f"load_model expects a path, bytes or onnx.ModelProto, not {type(source).__name__}")

    _check_opsets(model)
    _check_node_count(model, config)
    model = _sorted(model, copy=model is source)
    _check_structure(model)
    return model


def _check_size(size: int, config: FusionConfig, *, what: str) -> None:
    if size > config.max_model_bytes:
        raise ModelTooLargeError(
            f"the {what} is {size:,} bytes, over the limit of {config.max_model_bytes:,} bytes "
            "(config.max_model_bytes); raise the limit or submit a smaller model.",
            code="model_too_large",
            size=size,
            limit=config.max_model_bytes,
        )


def _parse(data: bytes, *, origin: str) -> ModelProto:
    if not data:
        raise InvalidModelError(f"{origin} are empty; expected a serialized ONNX model.", code="not_onnx")
    model = ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise InvalidModelError(
            f"{origin} are not an ONNX model (protobuf parsing failed: {exc}); "
            "send the .onnx file itself, not an archive or another format.",
            code="not_onnx",
        ) from exc
    # Protobuf happily parses many non-protobuf byte strings into an empty message full of unknown
    # fields, so a model must also look like one: an IR version and a graph.
    if model.ir_version <= 0 or not model.HasField("graph"):
        raise InvalidModelError(
            f"{origin} parse as protobuf but are not an ONNX model (no IR version or no graph); "
            "send the .onnx file itself.",
            code="not_onnx",
        )
    return model


def _load_path(path: Path, config: FusionConfig) -> ModelProto:
    try:
        stat = path.stat()
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise InvalidModelError(f"model file '{path}' does not exist.", code="file_not_found") from exc
    except OSError as exc:
        raise InvalidModelError(f"model file '{path}' cannot be read: {exc}.", code="file_not_found") from exc
    if not path.is_file():
        raise InvalidModelError(
            f"'{path}' is not a regular file; pass the .onnx file.", code="file_not_found"
        )
    _check_size(stat.st_size, config, what=f"model file '{path}'")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InvalidModelError(f"model file '{path}' cannot be read: {exc}.", code="file_not_found") from exc
    model = _parse(data, origin=f"the contents of '{path}'")
    _load_external_data(model, path, stat.st_size, config)
    return model


def _external_tensors(model: ModelProto) -> list[TensorProto]:
    return [t for t in iter_tensors(model) if t.data_location == TensorProto.EXTERNAL]


def _check_external_data_absent(model: ModelProto) -> None:
    tensors = _external_tensors(model)
    if tensors:
        raise UnsupportedModelError(
            f"tensor {tensors[0].name!r} keeps its data in an external file, which cannot be "
            "resolved for a model given as bytes; save the model with all tensors inside "
            "(onnx.save(model, path, save_as_external_data=False)) or load it from its path.",
            code="external_data",
            tensor=tensors[0].name,
        )


def _load_external_data(model: ModelProto, path: Path, model_size: int, config: FusionConfig) -> None:
    """Read external tensor data from files inside the model's folder, refusing any other file."""
    tensors = _external_tensors(model)
    if not tensors:
        return
    folder = path.absolute().parent.resolve()
    total = model_size
    for tensor in tensors:
        info = {entry.key: entry.value for entry in tensor.external_data}
        location = info.get("location", "")
        target = _resolve_inside(folder, location, tensor.name)
        try:
            offset = int(info.get("offset", "0") or 0)
            length = int(info["length"]) if info.get("length") else None
        except ValueError as exc:
            raise InvalidModelError(
                f"tensor {tensor.name!r} has a malformed external data offset/length: {exc}.",
                code="invalid_graph",
            ) from exc
        file_size = target.stat().st_size
        if length is None:
            length = file_size - offset
        if offset < 0 or length < 0 or offset + length > file_size:
            raise InvalidModelError(
                f"tensor {tensor.name!r} reads bytes {offset}..{offset + length} of '{location}', "
                f"which holds only {file_size} bytes; the external data file is truncated or stale.",
                code="invalid_graph",
            )
        total += length
        _check_size(total, config, what="model with its external data")
        with target.open("rb") as handle:
            handle.seek(offset)
            tensor.raw_data = handle.read(length)
        tensor.data_location = TensorProto.DEFAULT
        del tensor.external_data[:]


def _resolve_inside(folder: Path, location: str, tensor_name: str) -> Path:
    def refuse(why: str) -> UnsupportedModelError:
        return UnsupportedModelError(
            f"tensor {tensor_name!r} keeps its data at {location!r}, {why}; external data must be a "
            "file inside the model's own folder.",
            code="external_data_path",
            tensor=tensor_name,
            location=location,
        )

    if not location or "\x00" in location:
        raise refuse("which is not a file name")
    if os.path.isabs(location) or Path(location).is_absolute() or location.startswith(("/", "\\")):
        raise refuse("an absolute path")
    # Resolve symlinks *before* deciding: a link inside the folder pointing outside is refused too.
    try:
        target = (folder / location).resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop, a name too long
        raise refuse(f"which cannot be resolved ({exc})") from exc
    if not target.is_relative_to(folder):
        raise refuse("which resolves outside the model's folder")
    if not target.is_file():
        raise InvalidModelError(
            f"tensor {tensor_name!r} keeps its data in '{location}', which does not exist next to the "
            "model; copy the external data file into the model's folder.",
            code="file_not_found",
            tensor=tensor_name,
        )
    return target


def _check_opsets(model: ModelProto) -> None:
    newest = onnx.defs.onnx_opset_version()
    version = default_opset(model)
    if version is None:
        raise UnsupportedModelError(
            "the model imports no default ONNX opset; re-export it with an opset between "
            f"{MIN_OPSET} and {newest}.",
            code="unsupported_opset",
        )
    if not MIN_OPSET <= version <= newest:
        raise UnsupportedModelError(
            f"the model uses ONNX opset {version}; supported opsets are {MIN_OPSET} to {newest}. "
            "Convert it with onnx.version_converter or re-export it.",
            code="unsupported_opset",
            opset=version,
        )
    local = {f.domain for f in model.functions}
    for opset in model.opset_import:
        if opset.domain not in KNOWN_DOMAINS and opset.domain not in local:
            raise UnsupportedModelError(
                f"the model imports operator domain {opset.domain!r}, which no supported runtime "
                f"implements (known: {', '.join(repr(d) for d in sorted(KNOWN_DOMAINS))}).",
                code="unsupported_opset",
                domain=opset.domain,
            )


def _check_node_count(model: ModelProto, config: FusionConfig) -> None:
    nodes = count_nodes(model.graph)
    if nodes > config.max_nodes:
        raise ModelTooLargeError(
            f"the model has {nodes:,} nodes, over the limit of {config.max_nodes:,} (config.max_nodes).",
            code="too_many_nodes",
            nodes=nodes,
            limit=config.max_nodes,
        )


def _sorted(model: ModelProto, *, copy: bool) -> ModelProto:
    """Detect cycles in every graph and sort graphs whose nodes are listed out of order."""
    unsorted = []
    for graph in iter_graphs(model.graph):
        order = topological_order(graph.node)
        if order != sorted(order):
            unsorted.append(graph)
    if not unsorted:
        return model
    if copy:
        # Never reorder the caller's object; one copy of a model that needs fixing is acceptable.
        fixed = ModelProto()
        fixed.CopyFrom(model)
        return _sorted(fixed, copy=False)
    for graph in unsorted:
        order = topological_order(graph.node)
        nodes = [graph.node[i] for i in order]
        copies = [type(n)() for n in nodes]
        for dst, src in zip(copies, nodes, strict=True):
            dst.CopyFrom(src)
        del graph.node[:]
        graph.node.extend(copies)
    return model


#: Typed storage fields holding one value per element (complex types hold two).
_PER_ELEMENT = {
    TensorProto.FLOAT: ("float_data", 1),
    TensorProto.DOUBLE: ("double_data", 1),
    TensorProto.INT64: ("int64_data", 1),
    TensorProto.INT32: ("int32_data", 1),
    TensorProto.UINT64: ("uint64_data", 1),
    TensorProto.UINT32: ("uint64_data", 1),
    TensorProto.COMPLEX64: ("float_data", 2),
    TensorProto.COMPLEX128: ("double_data", 2),
}


def _check_tensor_data(tensor: TensorProto) -> None:
    """The data of a weight must match its shape (the checker skips the large ones we hide from it)."""
    if tensor.HasField("raw_data"):
        want = expected_nbytes(tensor)
        have = len(tensor.raw_data)
        unit = "bytes"
    elif tensor.data_type in _PER_ELEMENT:
        field, per = _PER_ELEMENT[tensor.data_type]
        want = per * (int(np.prod(tensor.dims, dtype=np.int64)) if tensor.dims else 1)
        have = len(getattr(tensor, field))  # len() of a repeated field copies nothing
        unit = "values"
    else:
        return
    if want is not None and have != want:
        raise InvalidModelError(
            f"initializer {tensor.name!r} holds {have} {unit} but its shape {list(tensor.dims)} "
            f"and type need {want}; the file is corrupt or truncated.",
            code="invalid_graph",
            tensor=tensor.name,
        )


def _check_structure(model: ModelProto) -> None:
    """onnx.checker on a light copy (large weights as typed inputs), plus the weights' byte sizes."""
    for tensor in model.graph.initializer:
        _check_tensor_data(tensor)
    light, _ = light_model(model)
    try:
        onnx.checker.check_model(light)
    except onnx.checker.ValidationError as exc:
        raise InvalidModelError(
            f"the model fails the ONNX checker: {str(exc).strip()}",
            code="invalid_graph",
        ) from exc
