"""Content-addressed blob store: every model, fused model, report and bundle is a file named by its sha256.

Content addressing makes writes idempotent (two workers storing the same fused model write the same
file) and lets jobs of different tenants share bytes without copying. Writes go to a temporary file
in the same directory and are renamed into place, so a reader never sees a half-written blob.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

from .files import DIR_MODE, private_dir

_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1 << 20


def is_digest(value: str) -> bool:
    return bool(_DIGEST.match(value))


class BlobStore:
    """A directory of blobs, fanned out by the first two hex digits of the digest."""

    def __init__(self, root: Path) -> None:
        self.root = private_dir(Path(root))
        self._tmp = private_dir(self.root / "tmp")

    def path(self, digest: str) -> Path:
        if not is_digest(digest):
            raise ValueError(f"not a sha256 hex digest: {digest!r}")
        return self.root / digest[:2] / digest

    def exists(self, digest: str) -> bool:
        return is_digest(digest) and self.path(digest).is_file()

    def size(self, digest: str) -> int:
        return self.path(digest).stat().st_size

    def read(self, digest: str) -> bytes:
        return self.path(digest).read_bytes()

    def put(self, data: bytes) -> tuple[str, int]:
        """Store bytes; returns (digest, size)."""
        return self.put_chunks([data])

    def put_file(self, stream: BinaryIO) -> tuple[str, int]:
        """Store a readable binary stream without holding it in memory; returns (digest, size)."""
        return self.put_chunks(iter(lambda: stream.read(_CHUNK), b""))

    def put_chunks(self, chunks: Iterable[bytes]) -> tuple[str, int]:
        staged = self.stage()
        try:
            for chunk in chunks:
                staged.write(chunk)
            staged.commit()
        finally:
            staged.discard()
        return staged.digest, staged.size

    @property
    def staging_dir(self) -> Path:
        """A folder on the store's file system: files made there can be `adopt`ed by a rename."""
        return self._tmp

    def adopt(self, path: Path) -> tuple[str, int]:
        """Move the file at `path` (on the store's file system, e.g. under `staging_dir`) into the
        store without copying it; returns (digest, size). An identical stored blob is kept."""
        digest = hashlib.sha256()
        with open(path, "rb") as stream:
            for chunk in iter(lambda: stream.read(_CHUNK), b""):
                digest.update(chunk)
        hexdigest, size = digest.hexdigest(), path.stat().st_size
        target = self.path(hexdigest)
        if target.is_file():
            path.unlink()
        else:
            target.parent.mkdir(exist_ok=True, mode=DIR_MODE)
            path.chmod(0o600)
            os.replace(path, target)
        return hexdigest, size

    def stage(self) -> StagedBlob:
        """A blob written piece by piece (an upload as it streams in), hashed on the way; `commit()`
        moves it into the store, `discard()` drops it."""
        return StagedBlob(self)


class StagedBlob:
    """A blob being written: a temporary file beside the store (so that the final rename stays on
    one file system) and the running sha256 of what was written."""

    def __init__(self, store: BlobStore) -> None:
        self.store = store
        fd, name = tempfile.mkstemp(dir=store._tmp)
        self.path = Path(name)
        self._out: BinaryIO | None = os.fdopen(fd, "wb")
        self._hasher = hashlib.sha256()
        self.size = 0
        self._digest: str | None = None

    def write(self, data: bytes | memoryview) -> None:
        if self._out is None:
            raise ValueError("the blob is already complete")
        self._hasher.update(data)
        self._out.write(data)
        self.size += len(data)

    def close(self) -> str:
        """Finish writing; returns the digest."""
        if self._out is not None:
            self._out.close()
            self._out = None
            self._digest = self._hasher.hexdigest()
        assert self._digest is not None
        return self._digest

    @property
    def digest(self) -> str:
        return self.close()

    def read(self) -> bytes:
        self.close()
        return self.path.read_bytes()

    def commit(self) -> str:
        """Move the blob into the store (an identical stored blob makes this a no-op)."""
        digest = self.close()
        target = self.store.path(digest)
        if not target.is_file():
            target.parent.mkdir(exist_ok=True, mode=DIR_MODE)
            os.replace(self.path, target)
        return digest

    def discard(self) -> None:
        """Remove the temporary file, if still there (safe to call more than once)."""
        if self._out is not None:
            self._out.close()
            self._out = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
