"""Bundles: a compiled model that another process loads without recompiling.

Layout (a directory, or the same tree in a .tar.gz / .tgz)::

    model.onnx                 the fused model the kernels were generated from
    kernels/<digest>.so        one shared object per unique kernel (plus the driver and the pool)
    packed.bin                 weights packed for the contraction library, each buffer once
    manifest.json              what belongs to what, with sha256s

`manifest.json`::

    {"format": "graph_autofusion.bundle", "version": 1,
     "model": {"file": "model.onnx", "sha256": "..."},
     "isa": "x86-64-v4+avx512vnni", "machine": "x86_64",
     "compiler": {"version": "...", "target": "..."},
     "driver": {"digest": "...", "file": "kernels/<digest>.so", "sha256": "..."},
     "pool": {"digest": "...", "file": "kernels/<digest>.so", "sha256": "..."},
     "kernels": {"<symbol>": {"digest": "...", "file": "...", "sha256": "...",
                              "template": "...", "method": "...", "uses_blas": false}},
     "host_ops": {"<symbol>": "<why it runs on the host>"},
     "packed": {"layout": 1, "isa": "x86-64-v4+avx512vnni", "file": "packed.bin", "bytes": 8192,
                "buffers": [{"kernel": "<symbol>", "kernel_digest": "...", "operands": ["..."],
                             "offset": 0, "bytes": 4096, "crc32": 123}],
                "released": ["<weights only packed buffers read>"]}}

`load()` checks every sha256 before it maps anything, because a corrupt shared object would
crash the process instead of failing.

Packed weights. The weights the contraction library reads in its panel layout are stored as the
kernels packed them (raw floats, `contraction.PACKED_LAYOUT_VERSION`, tied to the bundle's ISA
and to the digest of the kernel that packed them) in one file, each buffer once, at a multiple of
the runtime's `ALIGNMENT`; `load()` maps it read-only (`np.memmap`: no copy, one file descriptor
per bundle, and processes that load one bundle share its pages) instead of packing again. The
weights that only they serve (`released`, runtime.py) are dropped before the runtime sees them,
and the model too once its plan is built (`CompiledModel.model` reads it back from the bundle),
so a loaded bundle holds each such weight once. A missing or truncated packed file, or a buffer
that differs from the manifest, is refused (`bundle_corrupt`) rather than repacked: a bundle that
differs from what its manifest says is not trusted in part. Buffers are checked by CRC-32, not
sha256: the manifest beside them guards against damage, not tampering, and at 2.8 GB/s against
1.35 (measured on a Xeon host) the check stays well below the cost of packing (GPT-2: 0.14 s for
481 MiB against 0.3-0.8 s to pack). A bundle of another layout version, or one recompiled for
another ISA, packs afresh.

A bundle built for an instruction set this host lacks (an AVX-512 bundle on an AVX2 host, an
x86 bundle on an arm host: `isa` and `machine` against `isa.host_isa()`) is never mapped, since
its first kernel call would die of SIGILL. By default `load()` recompiles the fused model the
bundle carries, for the host (the kernel cache makes that a one-off per host), and says so in
`stats["recompiled"]`; with `recompile=False` (CLI `autofusion load --no-recompile`) it fails
with `isa_mismatch` instead, for callers that must not spend minutes compiling at load time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tarfile
import tempfile
import time
import weakref
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from ...errors import InvalidConfigError, InvalidModelError, IsaMismatchError
from ...onnx_utils import light_model
from .arena import ALIGNMENT
from .contraction import PACKED_LAYOUT_VERSION
from .extract import extract
from .isa import IsaTarget, host_isa, normalise_machine, parse_isa, target_isa
from .runtime import CompiledModel, KernelInfo, PackedKey, compile_model

log = logging.getLogger(__name__)

FORMAT = "graph_autofusion.bundle"
VERSION = 1
MANIFEST = "manifest.json"
MODEL_FILE = "model.onnx"
PACKED_FILE = "packed.bin"


class BundleError(InvalidModelError):
    code = "invalid_bundle"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _is_archive(path: Path) -> bool:
    return path.name.endswith((".tar.gz", ".tgz"))


def _save_support(root: Path, path: Path | None, digest: str | None) -> dict[str, str] | None:
    """Copy a support artifact (the driver, the thread pool) into the bundle; its manifest entry."""
    if path is None or digest is None:
        return None
    rel = f"kernels/{digest}.so"
    shutil.copyfile(path, root / rel)
    return {"digest": digest, "file": rel, "sha256": _sha256(root / rel)}


def save_bundle(compiled: CompiledModel, path: str | Path) -> Path:
    """Write `compiled` as a bundle at `path` (see the module docstring); returns the path."""
    from .compiler import compiler_identity

    target = Path(path)
    with tempfile.TemporaryDirectory(prefix="autofusion-bundle-") as tmp:
        root = Path(tmp) / "bundle"
        (root / "kernels").mkdir(parents=True)
        if compiled.model_file is not None:  # loaded from a bundle: its model file as it was
            shutil.copyfile(compiled.model_file, root / MODEL_FILE)
        else:
            (root / MODEL_FILE).write_bytes(compiled.model.SerializeToString(deterministic=True))
        kernels: dict[str, Any] = {}
        for symbol, info in compiled.kernels.items():
            rel = f"kernels/{info.digest}.so"
            dest = root / rel
            if not dest.exists():
                shutil.copyfile(info.path, dest)
            kernels[symbol] = {
                "digest": info.digest,
                "file": rel,
                "sha256": _sha256(dest),
                "template": info.template,
                "method": info.method,
                "uses_blas": info.uses_blas,
            }
        packed = _save_packed(compiled, root)
        driver = _save_support(root, compiled.driver_path, compiled.driver_digest)
        pool = _save_support(root, compiled.pool_path, compiled.pool_digest)
        cc = compiler_identity()
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "model": {"file": MODEL_FILE, "sha256": _sha256(root / MODEL_FILE)},
            "isa": compiled.isa.name,
            "machine": compiled.isa.arch,
            "compiler": {"version": cc.version, "target": cc.target},
            "driver": driver,
            "kernels": kernels,
            "pool": pool,
            "host_ops": dict(compiled.unsupported),
            "packed": packed,
        }
        (root / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
        target.parent.mkdir(parents=True, exist_ok=True)
        if _is_archive(target):
            partial = target.with_name(target.name + ".partial")
            with tarfile.open(partial, "w:gz") as tar:
                for item in sorted(root.rglob("*")):
                    tar.add(item, arcname=str(item.relative_to(root)), recursive=False)
            partial.replace(target)
        else:
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(root, target)
    return target


def _save_packed(compiled: CompiledModel, root: Path) -> dict[str, Any]:
    """Write the packed weight buffers into one file (`PACKED_FILE`, each buffer once by content,
    at a multiple of `ALIGNMENT`); the manifest's `packed` section."""
    buffers = []
    at: dict[str, int] = {}  # sha256 of a buffer -> its offset
    size = 0
    with (root / PACKED_FILE).open("wb") as out:
        for (symbol, operands), buf in sorted(compiled.packed_weights.items()):
            data = np.ascontiguousarray(buf).view(np.uint8)
            digest = hashlib.sha256(data).hexdigest()
            if digest not in at:
                out.write(bytes(-size % ALIGNMENT))
                size += -size % ALIGNMENT
                at[digest] = size
                data.tofile(out)
                size += data.nbytes
            buffers.append(
                {
                    "kernel": symbol,
                    "kernel_digest": compiled.kernels[symbol].digest,
                    "operands": list(operands),
                    "offset": at[digest],
                    "bytes": int(data.nbytes),
                    "crc32": zlib.crc32(data),
                }
            )
    return {
        "layout": PACKED_LAYOUT_VERSION,
        "isa": compiled.isa.name,
        "file": PACKED_FILE,
        "bytes": size,
        "buffers": buffers,
        "released": compiled.released_weights,
    }


def load(bundle_path: str | Path, *, threads: int | None = None, recompile: bool = True) -> CompiledModel:
    """Load a bundle written by `save_bundle` (in any process) without compiling anything.

    On a host that lacks the bundle's ISA, recompile its fused model for this host, or with
    `recompile=False` raise `IsaMismatchError` (`isa_mismatch`); see the module docstring.
    """
    path = Path(bundle_path)
    if not path.exists():
        raise BundleError(f"no bundle at {str(path)!r}", code="bundle_not_found")
    if _is_archive(path):
        extracted = Path(tempfile.mkdtemp(prefix="autofusion-bundle-"))
        try:
            with tarfile.open(path, "r:gz") as tar:
                tar.extractall(extracted, filter="data")
        except (tarfile.TarError, OSError) as exc:
            shutil.rmtree(extracted, ignore_errors=True)
            raise BundleError(f"{str(path)!r} is not a readable bundle archive: {exc}") from exc
        try:
            compiled = _load_dir(extracted, threads, recompile)
        except BaseException:
            shutil.rmtree(extracted, ignore_errors=True)
            raise
        # The extracted kernels stay on disk while the model lives (save_bundle copies them
        # again) and are removed with it.
        weakref.finalize(compiled, shutil.rmtree, extracted, ignore_errors=True)
        return compiled
    if not path.is_dir():
        raise BundleError(f"{str(path)!r} is neither a bundle directory nor a .tar.gz/.tgz bundle")
    return _load_dir(path, threads, recompile)


def _load_dir(root: Path, threads: int | None, recompile: bool) -> CompiledModel:
    manifest_path = root / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise BundleError(f"bundle {str(root)!r} has no readable {MANIFEST}: {exc}") from exc
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise BundleError(
            f"{MANIFEST} is not a version-{VERSION} {FORMAT} manifest "
            f"(format={manifest.get('format')!r}, version={manifest.get('version')!r})"
        )
    built_for = _manifest_isa(manifest)

    def checked(entry: dict[str, Any], what: str) -> Path:
        file = root / str(entry["file"])
        if not file.is_file():
            raise BundleError(f"{what}: {entry['file']} is missing from the bundle", code="bundle_corrupt")
        actual = _sha256(file)
        if actual != entry["sha256"]:
            raise BundleError(
                f"{what}: sha256 of {entry['file']} is {actual[:16]}..., the manifest says "
                f"{str(entry['sha256'])[:16]}...; the bundle is corrupt or was modified",
                code="bundle_corrupt",
            )
        return file

    model_file = checked(manifest["model"], "model")
    model = onnx.load_model_from_string(model_file.read_bytes())
    host = host_isa()
    missing = built_for.missing_on(host) if isinstance(built_for, IsaTarget) else ["what it needs"]
    if missing:
        if not recompile:
            raise IsaMismatchError(
                f"the bundle's kernels were built for {built_for}; this host ({host.name}) lacks "
                f"{', '.join(missing)}. Load it with recompilation allowed to rebuild them here "
                "from the fused model it carries.",
                bundle_isa=str(built_for),
                host_isa=host.name,
            )
        return _recompile(model, built_for, threads)
    # The plan's graph and nodes are those of a copy without the weights, so that the model (a
    # raw copy of every weight) is freed here: upb keeps a whole message alive while any part of
    # it is referenced. `CompiledModel.model` reads it back from the bundle when asked.
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    graph_only, _ = light_model(model, max_bytes=-1)
    del model
    plan = extract(graph_only, weights)
    del weights
    kernels: dict[str, KernelInfo] = {}
    for symbol, entry in manifest["kernels"].items():
        file = checked(entry, f"kernel {symbol}")
        kernels[symbol] = KernelInfo(
            symbol,
            entry["template"],
            entry["method"],
            bool(entry["uses_blas"]),
            entry["digest"],
            file,
            cached=True,
        )
    missing = [s for s in plan.specs if s not in kernels and s not in manifest.get("host_ops", {})]
    if missing:
        raise BundleError(f"the bundle has no artifact for kernel {missing[0]}", code="bundle_corrupt")
    driver = checked(manifest["driver"], "driver")
    pool_entry = manifest.get("pool")  # absent from bundles saved before the pool: libgomp's teams
    pool_path = checked(pool_entry, "thread pool") if pool_entry else None
    # Before the packed weights are mapped, the weights that only they serve are dropped: never
    # held raw after this.
    usable = _packed_usable(manifest)
    released = _released_weights(manifest, plan.initializers) if usable else []
    for name in released:
        del plan.initializers[name]
    packed = _load_packed(root, manifest, kernels) if usable else {}
    compiled = CompiledModel(
        plan,
        kernels,
        manifest.get("host_ops", {}),
        driver_path=driver,
        driver_digest=manifest["driver"]["digest"],
        pool_path=pool_path,
        pool_digest=pool_entry["digest"] if pool_entry else None,
        threads=threads,
        isa=built_for if isinstance(built_for, IsaTarget) else None,
        packed=packed,
        released=released,
        model_file=model_file,
    )
    compiled.stats["cache"] = {"hits": len(kernels), "misses": 0}
    compiled.stats["compile_seconds"] = 0.0
    return compiled


def _packed_usable(manifest: dict[str, Any]) -> bool:
    """Whether the manifest's packed weights are of this engine's layout for the bundle's ISA."""
    section = manifest.get("packed")
    if not section or not section.get("buffers"):
        return False
    if section.get("layout") != PACKED_LAYOUT_VERSION or section.get("isa") != manifest.get("isa"):
        log.info(
            "the bundle's packed weights are layout %s for %s (here: layout %s for %s): packing afresh",
            section.get("layout"),
            section.get("isa"),
            PACKED_LAYOUT_VERSION,
            manifest.get("isa"),
        )
        return False
    return True


def _released_weights(manifest: dict[str, Any], initializers: dict[str, np.ndarray]) -> list[str]:
    """The weights the manifest says only its packed buffers read."""
    released = [str(n) for n in manifest["packed"].get("released", [])]
    unknown = [n for n in released if n not in initializers]
    if unknown:
        raise BundleError(
            f"the manifest says only packed buffers read {unknown[0]!r}, which is not a weight of the model",
            code="bundle_corrupt",
        )
    return released


def _load_packed(
    root: Path, manifest: dict[str, Any], kernels: dict[str, KernelInfo]
) -> dict[PackedKey, np.ndarray]:
    """The bundle's packed weights (`_packed_usable` ones), by (kernel, operands): views of one
    read-only mapping of the packed file, each checked (CRC-32, bounds, the kernel that packed it)."""
    section = manifest["packed"]
    file = root / str(section["file"])
    size = file.stat().st_size if file.is_file() else -1
    if size != int(section["bytes"]):
        state = "missing" if size < 0 else f"{size} bytes, the manifest says {section['bytes']}"
        raise BundleError(
            f"packed weights: {section['file']} is {state}; save the bundle again", code="bundle_corrupt"
        )
    mapped = np.memmap(file, dtype=np.uint8, mode="r") if size else np.zeros(0, np.uint8)
    found: dict[PackedKey, np.ndarray] = {}
    for entry in section["buffers"]:
        symbol = str(entry["kernel"])
        what = f"packed weights of kernel {symbol} ({', '.join(entry['operands'])})"
        kernel = kernels.get(symbol)
        if kernel is None or kernel.digest != entry["kernel_digest"]:
            raise BundleError(
                f"{what}: packed by kernel digest {entry['kernel_digest']}, which the bundle's kernels "
                "do not include; the bundle is corrupt or was modified",
                code="bundle_corrupt",
            )
        offset, nbytes = int(entry["offset"]), int(entry["bytes"])
        data = mapped[offset : offset + nbytes]
        if (
            offset % ALIGNMENT
            or nbytes <= 0
            or data.nbytes != nbytes
            or zlib.crc32(data) != int(entry["crc32"])
        ):
            raise BundleError(
                f"{what}: bytes {offset}..{offset + nbytes} of {section['file']} differ from what the "
                "manifest says (CRC-32, bounds or alignment); the bundle is corrupt or was modified: "
                "save it again",
                code="bundle_corrupt",
            )
        found[(symbol, tuple(str(o) for o in entry["operands"]))] = data
    return found


def _manifest_isa(manifest: dict[str, Any]) -> IsaTarget | str:
    """The ISA the manifest says the kernels need (its architecture is the `machine` field), or,
    for a name this engine cannot parse, a sentence saying so: nothing here can vouch for it."""
    arch = normalise_machine(str(manifest.get("machine", "")))
    name = str(manifest.get("isa", ""))
    try:
        return parse_isa(name, arch)
    except InvalidConfigError:
        return f"an ISA this engine does not know ({name!r} on {arch!r})"


def _recompile(model: onnx.ModelProto, built_for: IsaTarget | str, threads: int | None) -> CompiledModel:
    """Compile the bundle's fused model for this host: for `target_isa()` when that runs here
    (so `AUTOFUSION_ISA=v3` on an AVX-512 host is honoured), else for the host's own ISA."""
    host = host_isa()
    target = target_isa()
    isa = target if target.runs_on(host) else host
    log.warning("the bundle was built for %s, this host is %s: recompiling for %s", built_for, host, isa)
    started = time.perf_counter()
    compiled = compile_model(model, threads=threads, isa=isa)
    compiled.stats["recompiled"] = {
        "from": str(built_for),
        "to": isa.name,
        "seconds": round(time.perf_counter() - started, 3),
    }
    return compiled
