"""The kernel cache: atomic publication, one build per digest across processes, LRU bounds."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from graph_autofusion.backend.cpu.cache import KernelCache
from graph_autofusion.backend.cpu.compiler import KernelSource, compile_kernels
from graph_autofusion.errors import InvalidConfigError


def _digest(label: str) -> str:
    return hashlib.sha256(label.encode()).hexdigest()


def _writer(size: int):
    def produce(path: Path) -> None:
        path.write_bytes(b"x" * size)

    return produce


def test_lru_eviction_under_a_tiny_bound(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path, max_bytes=250)
    a, b, c = _digest("a"), _digest("b"), _digest("c")
    cache.put(a, _writer(100))
    cache.put(b, _writer(100))
    assert cache.get(a) is not None  # a is now more recently used than b
    cache.put(c, _writer(100))
    assert cache.digests() == sorted([a, c])
    assert cache.get(b) is None
    stats = cache.stats
    assert (stats.evictions, stats.hits, stats.misses, stats.bytes) == (1, 1, 1, 200)


def test_eviction_never_drops_the_batch_being_built(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path, max_bytes=1)
    sources = [KernelSource(f"k{i}", f"int k{i}(int x) {{ return x + {i}; }}\n") for i in range(3)]
    first = compile_kernels(sources[:2], cache=cache, jobs=1)
    assert all(a.path.is_file() for a in first)  # over the bound, but protected while in use
    (third,) = compile_kernels(sources[2:], cache=cache)
    assert cache.digests() == [third.digest]
    assert cache.stats.evictions == 2


def test_failed_producer_leaves_no_file(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path)

    def explode(path: Path) -> None:
        path.write_bytes(b"partial")
        raise RuntimeError("compiler died")

    with pytest.raises(RuntimeError, match="compiler died"):
        cache.put(_digest("x"), explode, source="int x;")
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == []


def test_put_of_an_existing_digest_does_not_rebuild(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path)
    d = _digest("same")
    _, created = cache.put(d, _writer(10))
    assert created
    _, created = cache.put(d, lambda p: pytest.fail("rebuilt a cached artifact"))
    assert not created


def test_stale_temporaries_are_swept(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path)
    stale = tmp_path / ".tmp-deadbeef-abc.so"
    stale.write_bytes(b"half")
    old = time.time() - 7200
    os.utime(stale, (old, old))
    fresh = tmp_path / ".tmp-cafe-def.so"
    fresh.write_bytes(b"in progress")
    cache.evict()
    assert not stale.exists() and fresh.exists()


def test_digest_must_be_sha256(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        KernelCache(tmp_path).path_for("../../evil")


def test_default_root_follows_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOFUSION_CACHE_DIR", str(tmp_path / "here"))
    assert KernelCache().root == tmp_path / "here"


_FILL = r"""
import json, sys, time
from pathlib import Path
from graph_autofusion.backend.cpu.cache import KernelCache
from graph_autofusion.backend.cpu.compiler import KernelSource, compile_kernels
from graph_autofusion.errors import InvalidConfigError

root, go, me, combine = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
sources = [KernelSource(f"k{i}_{me}", f"int f{i}(int x) {{ return x * {i + 2}; }}\n") for i in range(4)]
Path(f"{go}.{me}").touch()
while not go.exists():
    time.sleep(0.005)
arts = compile_kernels(sources, cache=KernelCache(root), jobs=2, combine=combine)
print(json.dumps([[a.digest, a.cached] for a in arts]))
"""


@pytest.mark.parametrize("combine", [False, True], ids=["per-kernel", "combined"])
def test_two_processes_fill_the_same_cache(tmp_path: Path, combine: bool) -> None:
    root, go = tmp_path / "cache", tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[4])}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _FILL, str(root), str(go), name, str(int(combine))],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for name in ("p1", "p2")
    ]
    deadline = time.monotonic() + 60
    while not all(Path(f"{go}.{n}").exists() for n in ("p1", "p2")) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()  # both are past their imports: release them together
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        outputs.append(json.loads(out))

    digests = [d for d, _ in outputs[0]]
    assert digests == [d for d, _ in outputs[1]]  # same sources, same keys, whatever the name
    cache = KernelCache(root)
    assert not any(p.name.startswith(".tmp-") for p in root.iterdir())
    objects = sorted(p.stem for p in root.iterdir() if p.suffix == ".so" and not p.is_symlink())
    assert sorted(p.stem for p in root.iterdir() if p.suffix == ".c") == objects  # each with its source
    if combine:  # the same deterministic units in both processes: built once, members aliased
        assert len(objects) == 2 and set(cache.digests(aliases=True)) == {*digests, *objects}
        assert all(cache.resolve(d) is not None for d in digests)
    else:
        assert objects == sorted(digests)
    # The per-digest lock means each kernel was built by exactly one of the two processes.
    built = sum(not cached for out in outputs for _, cached in out)
    assert built == len(digests)


def test_alias_follows_its_unit_and_dangles_after_eviction(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path, max_bytes=150)
    unit, member, other = _digest("unit"), _digest("member"), _digest("other")
    cache.put(unit, _writer(100))
    cache.alias(member, unit)
    assert cache.resolve(member) == cache.path_for(unit).resolve()
    assert cache.get(member) is not None and cache.stats.bytes == 100  # aliases weigh nothing
    cache.put(other, _writer(100))  # over the bound: the unit goes, its alias is swept
    assert cache.get(member) is None and cache.resolve(member) is None
    assert cache.digests(aliases=True) == [other]


def test_import_file_brings_an_external_artifact_in(tmp_path: Path) -> None:
    external = tmp_path / "bundle.so"
    external.write_bytes(b"\x7fELF fake")
    cache = KernelCache(tmp_path / "cache")
    d = _digest("bundle")
    path = cache.import_file(d, external, source="int x;")
    assert path.read_bytes() == external.read_bytes()
    assert cache.source_path(d).read_text() == "int x;"
    assert cache.get(d) == path


def test_unusable_directory_is_a_config_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(InvalidConfigError) as info:
        KernelCache(blocker / "kernels")
    assert info.value.code == "cache_dir_unusable"


def test_size_bound_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOFUSION_CACHE_MAX_BYTES", "1234")
    assert KernelCache(tmp_path).max_bytes == 1234
    monkeypatch.setenv("AUTOFUSION_CACHE_MAX_BYTES", "lots")
    with pytest.raises(InvalidConfigError):
        KernelCache(tmp_path)
