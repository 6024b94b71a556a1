"""A Triton target's compiled kernels as blobs: each kernel file, and the manifest that names them.

The engine writes a compiled model's artifacts as a folder (`save_artifacts`): `kernels/<digest>.py`
(the Triton source), `kernels/<digest>.<n>.cubin` for `cuda` (compiled ahead of time, one per
launch) and `manifest.json` (target, mode, profile, host ops, and per kernel its launches: grid,
block sizes, warps, and each binary's metadata — shared memory, stages, ...). Here every kernel
file is stored in the blob store like any other artifact (content-addressed: a kernel that many
jobs produce is stored once) and the manifest gains `files`, each file's sha256 and size — the
digest is also the name `GET /artifacts/{digest}` serves it under. The same members go into the
job's bundle, so the bundle and the blobs are one set of files, stored once each way.

This runs after verification: on a device the first run tunes each kernel's block sizes, and the
manifest and binaries must describe the kernels as tuned.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autofusion_core.blobs import BlobStore
from autofusion_core.store import Artifact

MANIFEST = "manifest.json"


@dataclass
class KernelArtifacts:
    """What a Triton compilation leaves: bundle members, the manifest blob and the file blobs."""

    members: dict[str, bytes] = field(default_factory=dict)
    manifest: Artifact | None = None
    files: list[Artifact] = field(default_factory=list)


def store_kernels(blobs: BlobStore, compiled: Any) -> KernelArtifacts:
    """Store the kernel files of `compiled` (a Triton compiled model) and their manifest as blobs."""
    out = KernelArtifacts()
    with tempfile.TemporaryDirectory(prefix="kernels-", dir=blobs.staging_dir) as tmp:
        root = Path(compiled.save_artifacts(Path(tmp) / "artifacts"))
        manifest = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
        listed: dict[str, dict[str, Any]] = {}
        for path in sorted(p for p in (root / "kernels").rglob("*") if p.is_file()):
            data = path.read_bytes()
            digest, size = blobs.put(data)
            name = path.relative_to(root).as_posix()
            listed[name] = {"sha256": digest, "size": size}
            out.members[name] = data
            out.files.append(Artifact(digest=digest, size=size))
    manifest["files"] = listed
    text = json.dumps(manifest, indent=2, sort_keys=True, default=str).encode()
    digest, size = blobs.put(text)
    out.members[MANIFEST] = text
    out.manifest = Artifact(digest=digest, size=size)
    return out
