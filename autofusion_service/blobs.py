"""Content-addressed blob store: every model, fused model, report and bundle is a file named by its sha256.

Content addressing makes writes idempotent (two workers storing the same fused model write the same
file) and lets jobs of different tenants share bytes without copying. Writes go to a temporary file
in the same directory and are renamed into place, so a reader never sees a half-written blob.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1 << 20


def is_digest(value: str) -> bool:
    return bool(_DIGEST.match(value))


class BlobStore:
    """A directory of blobs, fanned out by the first two hex digits of the digest."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._tmp = self.root / "tmp"
        self._tmp.mkdir(exist_ok=True)

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
        hasher = hashlib.sha256()
        size = 0
        fd, tmp_name = tempfile.mkstemp(dir=self._tmp)
        try:
            with os.fdopen(fd, "wb") as out:
                for chunk in chunks:
                    hasher.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
            digest = hasher.hexdigest()
            target = self.path(digest)
            if target.is_file():
                os.unlink(tmp_name)
            else:
                target.parent.mkdir(exist_ok=True)
                os.replace(tmp_name, target)
        except BaseException:
            if os.path.exists(tmp_name):
                os.unlink(tmp_name)
            raise
        return digest, size
