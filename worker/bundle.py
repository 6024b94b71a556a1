"""The job's bundle: a reproducible tar.gz of a bundle folder, streamed straight into the blob store.

Fixed mtimes, owners and order make identical bundles byte-identical, so they share one blob.
The archive is written as it is read, file by file, into a staged blob (hashed on the way), never
held in memory. Compression is chosen by size: a large bundle is almost all fp32 weights, which
deflate shrinks by ~7 % at a cost of ~20 s per 400 MB (the whole of a BERT-base job's packaging
stage), so large bundles are stored uncompressed inside the gzip container (still `application/
gzip`, still read by `graph_autofusion.load`); small ones, mostly kernels and JSON, are compressed.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Protocol

import graph_autofusion as gaf

#: Bundles larger than this (bytes before compression) are stored, not deflated.
STORE_ABOVE = 16 << 20
_CHUNK = 1 << 20


class Writable(Protocol):
    def write(self, data: bytes, /) -> object: ...


def write_bundle(directory: Path, out: Writable, *, write_manifest: bool = True) -> None:
    """Write a reproducible tar.gz of `directory` to `out`; with `write_manifest`, plus a
    `manifest.json` giving the sha256 and size of every file (compiled bundles carry the runtime's
    own manifest instead)."""
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    names = {p.relative_to(directory).as_posix(): p for p in files}
    extra: dict[str, bytes] = {}
    if write_manifest:
        names.pop("manifest.json", None)
        manifest = {
            "format": "graph_autofusion.bundle.uncompiled",
            "engine_version": gaf.__version__,
            "files": {
                name: {"sha256": _sha256(path), "size": path.stat().st_size} for name, path in names.items()
            },
        }
        extra["manifest.json"] = json.dumps(manifest, indent=2, sort_keys=True).encode()
    total = sum(p.stat().st_size for p in names.values()) + sum(map(len, extra.values()))
    level = 0 if total > STORE_ABOVE else 6
    with (
        gzip.GzipFile(fileobj=out, mode="wb", mtime=0, compresslevel=level, filename="") as gz,  # type: ignore[arg-type]
        tarfile.open(fileobj=gz, mode="w") as tar,
    ):
        for name in sorted([*names, *extra]):
            data = extra.get(name)
            info = tarfile.TarInfo(name)
            info.mtime, info.mode = 0, 0o644
            if data is not None:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                info.size = names[name].stat().st_size
                with names[name].open("rb") as stream:
                    tar.addfile(info, stream)


def build_bundle(directory: Path, *, write_manifest: bool = True) -> bytes:
    """`write_bundle` into memory (small bundles, tests)."""
    raw = io.BytesIO()
    write_bundle(directory, raw, write_manifest=write_manifest)
    return raw.getvalue()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()
