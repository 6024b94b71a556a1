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
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import graph_autofusion as gaf

#: Bundles larger than this (bytes before compression) are stored, not deflated.
STORE_ABOVE = 16 << 20
_CHUNK = 1 << 20


class Writable(Protocol):
    def write(self, data: bytes, /) -> object: ...


def write_bundle(
    directory: Path,
    out: Writable,
    *,
    write_manifest: bool = True,
    late: Callable[[], dict[str, bytes]] | None = None,
) -> None:
    """Write a reproducible tar.gz of `directory` to `out`; with `write_manifest`, plus a
    `manifest.json` giving the sha256 and size of every file (compiled bundles carry the runtime's
    own manifest instead).

    `late()` returns members known only later — the report, once verification ran — and is called
    after the folder's files are written, so a bundle streams out while verification still runs.
    Late members (and the manifest) follow the files, in name order."""
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    names = {p.relative_to(directory).as_posix(): p for p in files}
    if write_manifest:
        names.pop("manifest.json", None)
    total = sum(p.stat().st_size for p in names.values())
    level = 0 if total > STORE_ABOVE else 6
    with (
        gzip.GzipFile(fileobj=out, mode="wb", mtime=0, compresslevel=level, filename="") as gz,  # type: ignore[arg-type]
        tarfile.open(fileobj=gz, mode="w") as tar,
    ):
        for name in sorted(names):
            info = _info(name, names[name].stat().st_size)
            with names[name].open("rb") as stream:
                tar.addfile(info, stream)
        extra = dict(late()) if late is not None else {}
        if write_manifest:
            listed = {name: (_sha256(path), path.stat().st_size) for name, path in names.items()}
            listed.update(
                (name, (hashlib.sha256(data).hexdigest(), len(data))) for name, data in extra.items()
            )
            manifest = {
                "format": "graph_autofusion.bundle.uncompiled",
                "engine_version": gaf.__version__,
                "files": {
                    name: {"sha256": sha, "size": size} for name, (sha, size) in sorted(listed.items())
                },
            }
            extra["manifest.json"] = json.dumps(manifest, indent=2, sort_keys=True).encode()
        for name in sorted(extra):
            tar.addfile(_info(name, len(extra[name])), io.BytesIO(extra[name]))


def _info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 0, 0o644
    return info


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
