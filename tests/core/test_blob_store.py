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


def test_adopt_moves_a_file_in_without_copying(tmp_path) -> None:
    blobs = BlobStore(tmp_path / "blobs")
    made = blobs.staging_dir / "model.onnx"
    made.write_bytes(b"fused")
    inode = made.stat().st_ino
    digest, size = blobs.adopt(made)
    assert (digest, size) == (hashlib.sha256(b"fused").hexdigest(), 5) and not made.exists()
    assert blobs.path(digest).stat().st_ino == inode and blobs.read(digest) == b"fused"
    assert blobs.path(digest).stat().st_mode & 0o777 == 0o600
    again = blobs.staging_dir / "again.onnx"
    again.write_bytes(b"fused")
    assert blobs.adopt(again) == (digest, 5) and not again.exists()  # an identical blob is kept
