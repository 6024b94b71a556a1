"""Bundles: save a compiled model, load it in another process without compiling, detect tampering."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from cpu_backend_helpers import assert_close, fuse_all, make_model, packed_weights_model, random_feeds
from onnx import helper

import graph_autofusion as gaf
from graph_autofusion.backend.cpu.bundle import BundleError, load
from graph_autofusion.backend.cpu.contraction import PACKED_LAYOUT_VERSION
from graph_autofusion.backend.cpu.runtime import compile_model

LOADER = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    import graph_autofusion as gaf
    from graph_autofusion.backend.cpu import compiler

    def no_compiling(*args, **kwargs):
        raise AssertionError("loading a bundle must not compile")

    compiler.compile_kernels = no_compiling
    started = time.perf_counter()
    model = gaf.load(sys.argv[1])
    feeds = dict(np.load(sys.argv[2]))
    np.savez(sys.argv[3], **model(feeds))
    print(model.stats["cache"]["misses"], round(time.perf_counter() - started, 3))
    """
)


def _load_in_child(bundle: Path, feeds: dict, tmp_path: Path) -> tuple[str, dict[str, np.ndarray]]:
    """Run LOADER on `bundle` in a fresh process: (its kernel-cache misses, its outputs)."""
    np.savez(tmp_path / "in.npz", **feeds)
    proc = subprocess.run(
        [sys.executable, "-c", LOADER, str(bundle), str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()[0], dict(np.load(tmp_path / "out.npz"))


@pytest.fixture(scope="module")
def compiled(kernel_cache):
    nodes = [
        helper.make_node("Add", ["x", "b"], ["a"]),
        helper.make_node("Softmax", ["a"], ["s"], axis=-1),
        helper.make_node("Relu", ["x"], ["r"]),
    ]
    model = make_model(nodes, {"x": [3, 10]}, ["s", "r"], {"b": np.linspace(0, 1, 10, dtype=np.float32)})
    return compile_model(fuse_all(model, "reduction"), cache=kernel_cache)


@pytest.mark.parametrize("name", ["bundle", "bundle.tar.gz"])
def test_bundle_loads_in_another_process_without_compiling(compiled, tmp_path: Path, name: str) -> None:
    path = compiled.save_bundle(tmp_path / name)
    feeds = random_feeds(compiled.model)
    misses, got = _load_in_child(path, feeds, tmp_path)
    assert misses == "0"
    assert_close({k: got[k] for k in ("s", "r")}, compiled(feeds), rtol=0, atol=0)


def test_manifest_names_every_kernel_with_its_sha256(compiled, tmp_path: Path) -> None:
    path = compiled.save_bundle(tmp_path / "b")
    manifest = json.loads((path / "manifest.json").read_text())
    assert set(manifest["kernels"]) == set(compiled.kernels)
    for entry in manifest["kernels"].values():
        assert (path / entry["file"]).is_file() and len(entry["sha256"]) == 64
        assert entry["template"] == "reduction"
    assert manifest["isa"] and manifest["compiler"]["version"] and len(manifest["model"]["sha256"]) == 64
    loaded = gaf.load(path)
    feeds = random_feeds(compiled.model, seed=1)
    assert_close(loaded(feeds), compiled(feeds), rtol=0, atol=0)


def test_the_bundle_carries_the_thread_pool(compiled, tmp_path: Path) -> None:
    """The kernels' parallel loops run on the pool the bundle carries; a bundle saved before the
    pool (no "pool" entry) still loads and runs, on libgomp's teams, without compiling."""
    path = compiled.save_bundle(tmp_path / "b")
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["pool"]["digest"] == compiled.pool_digest
    assert (path / manifest["pool"]["file"]).is_file() and len(manifest["pool"]["sha256"]) == 64
    assert gaf.load(path).pool_path == path / manifest["pool"]["file"]
    del manifest["pool"]
    (path / "manifest.json").write_text(json.dumps(manifest))
    feeds = random_feeds(compiled.model, seed=2)
    misses, got = _load_in_child(path, feeds, tmp_path)
    assert misses == "0"
    assert_close({k: got[k] for k in ("s", "r")}, compiled(feeds), rtol=0, atol=0)


def test_tampered_kernel_is_refused(compiled, tmp_path: Path) -> None:
    path = compiled.save_bundle(tmp_path / "b")
    manifest = json.loads((path / "manifest.json").read_text())
    victim = path / next(iter(manifest["kernels"].values()))["file"]
    victim.write_bytes(victim.read_bytes() + b"\0")
    with pytest.raises(BundleError) as info:
        load(path)
    assert info.value.code == "bundle_corrupt" and "sha256" in info.value.message


def test_missing_or_foreign_bundle_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(BundleError) as info:
        load(tmp_path / "nothing-here")
    assert info.value.code == "bundle_not_found"
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "manifest.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(BundleError, match="manifest"):
        load(tmp_path / "dir")


def test_model_loaded_from_an_archive_can_be_saved_again(compiled, tmp_path: Path) -> None:
    loaded = load(compiled.save_bundle(tmp_path / "first.tgz"))
    again = load(loaded.save_bundle(tmp_path / "second"))
    feeds = random_feeds(compiled.model, seed=2)
    assert_close(again(feeds), compiled(feeds), rtol=0, atol=0)


@pytest.fixture(scope="module")
def packed(kernel_cache):
    """A model with weights packed for the contraction library (cpu_backend_helpers)."""
    return compile_model(packed_weights_model(), cache=kernel_cache)


def _packed_stats(model) -> dict[str, object]:
    keys = ("weights_bytes", "released_weights_bytes", "packed_weights_bytes")
    return {k: model.stats[k] for k in keys}


@pytest.mark.parametrize("name", ["bundle", "bundle.tgz"])
def test_packed_weights_round_trip_through_a_bundle(packed, tmp_path: Path, name: str) -> None:
    """Stored packed and mapped back, not packed again: outputs identical to the in-memory run,
    the same raw weights released, the same packed bytes, one file per packed buffer."""
    assert packed.stats["packed_weights_source"] == "packed at load"
    assert packed.stats["released_weights_bytes"] > 0
    path = packed.save_bundle(tmp_path / name)
    loaded = load(path)
    assert loaded.stats["packed_weights_source"] == "bundle"
    assert _packed_stats(loaded) == _packed_stats(packed)
    feeds = random_feeds(packed.model, seed=3)
    assert_close(loaded(feeds), packed(feeds), rtol=0, atol=0)
    if name == "bundle":
        section = json.loads((path / "manifest.json").read_text())["packed"]
        assert section["layout"] == PACKED_LAYOUT_VERSION and section["isa"] == packed.isa.name
        assert len(section["buffers"]) == len(packed.packed_weights)
        assert (path / section["file"]).stat().st_size == section["bytes"]
        for entry in section["buffers"]:
            assert entry["offset"] % 64 == 0 and entry["offset"] + entry["bytes"] <= section["bytes"]
            assert entry["kernel_digest"] == packed.kernels[entry["kernel"]].digest


@pytest.mark.parametrize(
    ("damage", "words"),
    [("flip", "CRC-32"), ("truncate", "bytes, the manifest says"), ("delete", "is missing")],
)
def test_a_damaged_packed_file_is_refused(packed, tmp_path: Path, damage: str, words: str) -> None:
    """Refused, not repacked: a bundle that differs from its manifest is not trusted in part."""
    path = packed.save_bundle(tmp_path / "b")
    section = json.loads((path / "manifest.json").read_text())["packed"]
    entry = section["buffers"][-1]
    victim = path / section["file"]
    data = bytearray(victim.read_bytes())
    if damage == "flip":  # one bit in the middle of the last buffer
        data[entry["offset"] + entry["bytes"] // 2] ^= 0x40
        victim.write_bytes(bytes(data))
    elif damage == "truncate":
        victim.write_bytes(bytes(data[:-4]))
    else:
        victim.unlink()
    with pytest.raises(BundleError) as info:
        load(path)
    assert info.value.code == "bundle_corrupt" and words in info.value.message
    if damage == "flip":
        assert entry["kernel"] in info.value.message


def test_packed_weights_of_another_layout_version_are_packed_afresh(packed, tmp_path: Path) -> None:
    path = packed.save_bundle(tmp_path / "b")
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["packed"]["layout"] = PACKED_LAYOUT_VERSION + 1
    (path / "manifest.json").write_text(json.dumps(manifest))
    loaded = load(path)
    assert loaded.stats["packed_weights_source"] == "packed at load"
    assert _packed_stats(loaded) == _packed_stats(packed)
    feeds = random_feeds(packed.model, seed=4)
    assert_close(loaded(feeds), packed(feeds), rtol=0, atol=0)


def test_a_bundle_loaded_with_released_weights_can_be_saved_again(packed, tmp_path: Path) -> None:
    """The loaded model no longer holds the released weights raw; its bundle still carries the
    full fused model (for a recompile elsewhere) and the packed buffers."""
    again = load(load(packed.save_bundle(tmp_path / "first")).save_bundle(tmp_path / "second"))
    assert again.stats["packed_weights_source"] == "bundle"
    feeds = random_feeds(packed.model, seed=5)
    assert_close(again(feeds), packed(feeds), rtol=0, atol=0)
    recompiled = compile_model(again.model)  # every weight is still in the model it carries
    assert_close(recompiled(feeds), packed(feeds), rtol=0, atol=0)


def test_a_loaded_bundle_holds_neither_the_model_nor_released_weights(packed, tmp_path: Path) -> None:
    """The manifest lists the weights only packed buffers read: load never keeps them raw, and
    drops the model (a raw copy of every weight) once the plan is built; `model` reads it back."""
    path = packed.save_bundle(tmp_path / "b")
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["packed"]["released"] == packed.released_weights == ["k", "w"]
    loaded = load(path)
    assert loaded.released_weights == ["k", "w"]
    assert len(loaded.plan.model.graph.initializer) == 0
    assert set(loaded.plan.initializers) == {"v", "two"}
    assert [t.name for t in loaded.model.graph.initializer] == [
        t.name for t in packed.model.graph.initializer
    ]


@pytest.mark.parametrize(
    ("edit", "words"), [("raw", "is read raw"), ("unpacked", "no stored packed weights")]
)
def test_a_manifest_releasing_a_weight_still_needed_raw_is_refused(
    packed, tmp_path: Path, edit: str, words: str
) -> None:
    path = packed.save_bundle(tmp_path / "b")
    manifest = json.loads((path / "manifest.json").read_text())
    if edit == "raw":  # `v` is also read raw by the Mul kernel
        manifest["packed"]["released"].append("v")
    else:  # `w` released, but its packed buffer not stored: nothing to pack it from
        manifest["packed"]["buffers"] = [b for b in manifest["packed"]["buffers"] if "w" not in b["operands"]]
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(gaf.errors.InvalidModelError) as info:
        load(path)
    assert info.value.code == "bundle_corrupt" and words in info.value.message


def test_a_packed_bundle_loads_in_another_process_without_compiling(packed, tmp_path: Path) -> None:
    path = packed.save_bundle(tmp_path / "b.tgz")
    feeds = random_feeds(packed.model, seed=7)
    misses, got = _load_in_child(path, feeds, tmp_path)
    assert misses == "0"
    assert_close(got, packed(feeds), rtol=0, atol=0)
