"""Bundles across instruction sets: built for an ISA this host lacks, they never run here (no
SIGILL); they recompile from the fused model they carry, or fail with `isa_mismatch` when asked
not to recompile.

The foreign bundle is built here for x86-64-v4 (or v4 with extensions, whichever this host lacks).
Whatever could reach a foreign kernel runs in a child process, so a regression that did call one
shows as a child killed by SIGILL instead of taking the test session down.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from cpu_backend_helpers import assert_close, fuse_all, make_model, packed_weights_model, random_feeds
from onnx import helper

from graph_autofusion.backend.cpu.bundle import load
from graph_autofusion.backend.cpu.isa import IsaTarget, host_isa, machine, parse_isa
from graph_autofusion.backend.cpu.runtime import compile_model
from graph_autofusion.errors import IsaMismatchError

CANDIDATES = ["v4", "v4+avx512vnni", "v4+avx512bf16+avx512vnni"]


def _foreign_isa() -> IsaTarget | None:
    """An x86 ISA this host cannot run (None on an arm host, or on one that has them all)."""
    if machine() != "x86_64":
        return None
    for name in CANDIDATES:
        target = parse_isa(name)
        if not target.runs_on(host_isa()):
            return target
    return None


FOREIGN = _foreign_isa()
needs_foreign = pytest.mark.skipif(FOREIGN is None, reason="this host runs every x86-64-v4 variant")

LOADER = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import graph_autofusion as gaf
    from graph_autofusion.errors import FusionError

    bundle, feeds_path, out_path, recompile = sys.argv[1:5]
    try:
        model = gaf.load(bundle, recompile=recompile == "1")
    except FusionError as err:
        print(json.dumps({"error": err.code, "message": err.message}))
        sys.exit(0)
    np.savez(out_path, **model(dict(np.load(feeds_path))))
    stats = model.stats
    print(json.dumps({"isa": model.isa.name, "recompiled": stats.get("recompiled"),
                      "packed": stats["packed_weights_source"], "released": stats["released_weights_bytes"]}))
    """
)


@pytest.fixture(scope="module")
def fused_model():
    nodes = [
        helper.make_node("Add", ["x", "b"], ["a"]),
        helper.make_node("Softmax", ["a"], ["s"], axis=-1),
        helper.make_node("Tanh", ["x"], ["t"]),
    ]
    b = np.linspace(0, 1, 40, dtype=np.float32)
    return fuse_all(make_model(nodes, {"x": [6, 40]}, ["s", "t"], {"b": b}), "reduction")


@pytest.fixture(scope="module")
def native(fused_model, kernel_cache):
    return compile_model(fused_model, cache=kernel_cache)


def _load_in_child(bundle: Path, feeds: dict, tmp_path: Path, *, recompile: bool) -> dict:
    np.savez(tmp_path / "in.npz", **feeds)
    env = {**os.environ, "AUTOFUSION_CACHE_DIR": str(tmp_path / "child-cache")}
    env.pop("AUTOFUSION_ISA", None)
    args = [str(bundle), str(tmp_path / "in.npz"), str(tmp_path / "out.npz"), "1" if recompile else "0"]
    return _child_json(LOADER, args, env)


def _child_json(script: str, args: list[str], env: dict[str, str]) -> dict:
    """Run `script` in a fresh process with `env`; the JSON object its last line prints. A kernel
    of another ISA executed there would die of SIGILL: that is reported as such."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )
    assert done.returncode != -signal.SIGILL, "a kernel built for another ISA was executed"
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def foreign_bundle(fused_model, kernel_cache, tmp_path_factory) -> Path:
    assert FOREIGN is not None
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AUTOFUSION_ISA", FOREIGN.name)
        built = compile_model(fused_model, cache=kernel_cache)  # compiles here; never called
    assert built.isa == FOREIGN
    return built.save_bundle(tmp_path_factory.mktemp("foreign") / "model.bundle.tgz")


FOREIGN_RUNNER = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import onnx
    from graph_autofusion.backend.cpu.runtime import compile_model
    from graph_autofusion.errors import IsaMismatchError

    model = compile_model(onnx.load(sys.argv[1]))  # built for $AUTOFUSION_ISA, loaded, never called
    feeds = dict(np.load(sys.argv[2]))
    codes = []
    for call in (lambda: model(feeds), lambda: model.profile(feeds)):
        try:
            call()
        except IsaMismatchError as err:
            codes.append(err.code)
            message = err.message
    print(json.dumps({"isa": model.isa.name, "codes": codes, "message": message}))
    """
)


@needs_foreign
def test_a_foreign_build_refuses_to_run_here(fused_model, tmp_path: Path) -> None:
    import onnx

    onnx.save(fused_model, tmp_path / "fused.onnx")
    np.savez(tmp_path / "in.npz", **random_feeds(fused_model))
    env = {**os.environ, "AUTOFUSION_ISA": FOREIGN.name, "AUTOFUSION_CACHE_DIR": str(tmp_path / "cache")}
    result = _child_json(FOREIGN_RUNNER, [str(tmp_path / "fused.onnx"), str(tmp_path / "in.npz")], env)
    assert result["isa"] == FOREIGN.name and result["codes"] == ["isa_mismatch", "isa_mismatch"]
    assert FOREIGN.name in result["message"] and host_isa().name in result["message"]


@needs_foreign
def test_manifest_names_the_foreign_isa(foreign_bundle, tmp_path: Path) -> None:
    import tarfile

    with tarfile.open(foreign_bundle) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))
        assert "model.onnx" in tar.getnames()  # the fused model travels with the kernels
    assert manifest["isa"] == FOREIGN.name and manifest["machine"] == "x86_64"


@needs_foreign
def test_foreign_bundle_without_recompilation_is_isa_mismatch(foreign_bundle, fused_model, tmp_path) -> None:
    result = _load_in_child(foreign_bundle, random_feeds(fused_model), tmp_path, recompile=False)
    assert result["error"] == "isa_mismatch"
    assert FOREIGN.name in result["message"] and host_isa().name in result["message"]
    with pytest.raises(IsaMismatchError):
        load(foreign_bundle, recompile=False)


@needs_foreign
def test_foreign_bundle_recompiles_for_this_host(foreign_bundle, fused_model, native, tmp_path) -> None:
    feeds = random_feeds(fused_model, seed=3)
    result = _load_in_child(foreign_bundle, feeds, tmp_path, recompile=True)
    assert result["isa"] == host_isa().name
    assert result["recompiled"]["from"] == FOREIGN.name and result["recompiled"]["to"] == host_isa().name
    got = dict(np.load(tmp_path / "out.npz"))
    assert_close({k: got[k] for k in ("s", "t")}, native(feeds), rtol=0, atol=0)


def _rewrite_manifest(bundle: Path, **fields: str) -> None:
    path = bundle / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest.update(fields)
    path.write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    ("machine_name", "isa_name"),
    [("aarch64", "aarch64+sve"), ("riscv64", "riscv64"), ("", "x86-64-v9+avx1024")],
)
def test_other_architecture_or_unknown_isa(native, tmp_path: Path, machine_name: str, isa_name: str) -> None:
    """A bundle of another architecture (or an ISA this engine cannot name) is never mapped."""
    machine_name = machine_name or machine()  # "": this host's architecture, an ISA it cannot name
    if machine_name == machine() and isa_name.startswith(machine_name):
        pytest.skip("this host is that architecture")
    bundle = native.save_bundle(tmp_path / "b")
    _rewrite_manifest(bundle, machine=machine_name, isa=isa_name)
    with pytest.raises(IsaMismatchError) as info:
        load(bundle, recompile=False)
    assert info.value.code == "isa_mismatch"
    recompiled = load(bundle)
    assert recompiled.stats["recompiled"]["to"] == host_isa().name
    feeds = random_feeds(native.model, seed=4)
    assert_close(recompiled(feeds), native(feeds), rtol=0, atol=0)


def test_a_native_bundle_loads_as_built(native, tmp_path: Path) -> None:
    loaded = load(native.save_bundle(tmp_path / "b"), recompile=False)
    assert loaded.isa == native.isa and "recompiled" not in loaded.stats
    assert loaded.stats["isa"] == native.isa.name


FOREIGN_BUILDER = textwrap.dedent(
    """
    import json, sys
    import onnx
    from graph_autofusion.backend.cpu.runtime import compile_model

    model = compile_model(onnx.load(sys.argv[1]))  # built for $AUTOFUSION_ISA: packing would run it
    path = model.save_bundle(sys.argv[2])
    stats = model.stats
    print(json.dumps({k: stats[k] for k in ("packed_weights_bytes", "released_weights_bytes")}))
    """
)


@needs_foreign
def test_a_foreign_build_packs_nothing_and_its_bundle_packs_afresh_here(kernel_cache, tmp_path: Path) -> None:
    """Packing runs the kernels' own code, so a build for an ISA this host lacks packs nothing
    (and keeps every weight raw); the bundle, recompiled here, packs for this host."""
    import onnx

    model = packed_weights_model()
    onnx.save(model, tmp_path / "model.onnx")
    env = {**os.environ, "AUTOFUSION_ISA": FOREIGN.name, "AUTOFUSION_CACHE_DIR": str(tmp_path / "cache")}
    bundle = tmp_path / "foreign.bundle"
    assert _child_json(FOREIGN_BUILDER, [str(tmp_path / "model.onnx"), str(bundle)], env) == {
        "packed_weights_bytes": 0,
        "released_weights_bytes": 0,
    }
    assert json.loads((bundle / "manifest.json").read_text())["packed"]["buffers"] == []
    feeds = random_feeds(model, seed=6)
    result = _load_in_child(bundle, feeds, tmp_path, recompile=True)
    assert result["recompiled"]["to"] == host_isa().name
    assert result["packed"] == "packed at load" and result["released"] > 0
    got = dict(np.load(tmp_path / "out.npz"))
    native = compile_model(model, cache=kernel_cache)
    assert_close(got, native(feeds), rtol=0, atol=0)
