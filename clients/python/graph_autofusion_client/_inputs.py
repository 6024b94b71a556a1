"""What a caller may submit as "the model", normalized into an upload that can be replayed.

A retried ``POST /fuse`` must send the same bytes again, so the upload is described by an opener
that yields a fresh file object (or the bytes) on every attempt instead of a stream that the first
attempt would exhaust. A path is streamed from disk rather than read into memory, since models run
to gigabytes.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol, runtime_checkable


@runtime_checkable
class SerializableModel(Protocol):
    """Anything shaped like ``onnx.ModelProto``; checked structurally so onnx need not be installed."""

    def SerializeToString(self) -> bytes: ...


_HASH_CHUNK = 1 << 20

ModelLike = str | os.PathLike[str] | bytes | bytearray | memoryview | SerializableModel | IO[bytes]


@dataclass(frozen=True)
class ModelUpload:
    filename: str
    open: Callable[[], IO[bytes]]

    def multipart(self) -> dict[str, Any]:
        """The ``files=`` argument for one attempt (a fresh file object each call)."""
        return {"model": (self.filename, self.open(), "application/octet-stream")}

    def measure(self) -> tuple[int, str]:
        """``(size, sha256 hex)`` of the model, read once through the opener (streamed, so a large
        file is never held in memory)."""
        hasher, size = hashlib.sha256(), 0
        with self.open() as stream:
            for chunk in iter(lambda: stream.read(_HASH_CHUNK), b""):
                hasher.update(chunk)
                size += len(chunk)
        return size, hasher.hexdigest()


def model_upload(model: ModelLike, filename: str | None = None) -> ModelUpload:
    """Normalize a path, raw bytes, an ``onnx.ModelProto`` or a binary file object.

    Raises ``FileNotFoundError`` for a missing path and ``TypeError`` for anything else, before any
    request is made, so a typo in a pipeline fails locally with a clear message.
    """
    if isinstance(model, str | os.PathLike):
        path = Path(model)
        if not path.is_file():
            raise FileNotFoundError(f"model file not found: {path}")
        return ModelUpload(filename or path.name, lambda: path.open("rb"))
    if isinstance(model, bytes | bytearray | memoryview):
        data = bytes(model)
        return ModelUpload(filename or "model.onnx", lambda: io.BytesIO(data))
    if isinstance(model, SerializableModel):
        data = model.SerializeToString()
        return ModelUpload(filename or "model.onnx", lambda: io.BytesIO(data))
    if hasattr(model, "read"):
        stream = model
        name = filename or Path(str(getattr(stream, "name", "model.onnx"))).name
        if stream.seekable():
            start = stream.tell()

            def rewind() -> IO[bytes]:
                stream.seek(start)
                return _Unclosable(stream)

            return ModelUpload(name, rewind)
        data = stream.read()
        return ModelUpload(name, lambda: io.BytesIO(data))
    raise TypeError(
        f"model must be a path, bytes, a binary file object or an onnx.ModelProto, not {type(model).__name__}"
    )


class _Unclosable(io.RawIOBase):
    """Wraps a caller's file so that the upload reads it without closing it on them."""

    def __init__(self, inner: IO[bytes]) -> None:
        self._inner = inner

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._inner.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)
