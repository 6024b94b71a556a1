from __future__ import annotations

import hashlib
import io

import pytest

from autofusion_core.blobs import BlobStore


def test_content_addressed_and_idempotent(tmp_path) -> None:
    blobs = BlobStore(tmp_path)
    digest, size = blobs.put(b"hello")
    assert digest == hashlib.sha256(b"hello").hexdigest() and size == 5
    assert blobs.put_file(io.BytesIO(b"hello")) == (digest, 5)
    assert blobs.read(digest) == b"hello" and blobs.exists(digest) and blobs.size(digest) == 5
    assert list((tmp_path / "tmp").iterdir()) == []


def test_bad_digests_never_touch_the_filesystem(tmp_path) -> None:
    blobs = BlobStore(tmp_path)
    assert not blobs.exists("../../etc/passwd")
    with pytest.raises(ValueError):
        blobs.path("../x")
