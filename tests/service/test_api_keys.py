from __future__ import annotations

import json
import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from autofusion_core.settings import Settings
from autofusion_service.auth import ensure_key, hash_key, load_keyring, parse_api_keys


def test_keys_are_kept_as_hashes_only() -> None:
    table = parse_api_keys(f" alice:k1 , bob:sha256:{hash_key('k2')} ")
    assert table == {hash_key("k1"): "alice", hash_key("k2"): "bob"}


@pytest.mark.parametrize("spec", ["alice", ":k", "alice:", "al ice:k", "bob:sha256:xyz"])
def test_bad_key_specs_are_refused(spec: str) -> None:
    with pytest.raises(ValueError):
        parse_api_keys(spec)


def test_generated_key_is_printed_once_and_stored_hashed(tmp_path) -> None:
    settings = Settings(data_dir=tmp_path)
    key = ensure_key(settings)
    assert key and ensure_key(settings) is None
    stored = (tmp_path / "api_keys.json").read_text()
    assert key not in stored and json.loads(stored)[0]["sha256"] == hash_key(key)
    ring = load_keyring(settings)
    assert ring.tenant_for(key) == "default" and ring.tenant_for(key + "x") is None
    assert ensure_key(Settings(data_dir=tmp_path / "other", api_keys="a:b")) is None


def test_time_limits_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="soft_time_limit < hard_time_limit < visibility_timeout"):
        Settings(soft_time_limit=10, hard_time_limit=10, visibility_timeout=100)
    with pytest.raises(ValueError):
        Settings(soft_time_limit=10, hard_time_limit=20, visibility_timeout=15)


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("AUTOFUSION_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("AUTOFUSION_MAX_UPLOAD_MB", "2")
    monkeypatch.setenv("AUTOFUSION_REDIS_URL", "redis://h:1/0")
    s = Settings()
    assert s.data_dir == tmp_path and s.max_upload_bytes == 2 * 1024 * 1024 and not s.embedded


def _race_for_key(data_dir: str, barrier: Any, results: Any) -> None:
    barrier.wait()
    try:
        results.put(ensure_key(Settings(data_dir=Path(data_dir), api_keys="")))
    except BaseException as exc:  # reported by the test, not lost with the child
        results.put(exc)


@pytest.mark.parametrize("round_", range(3))
def test_replicas_starting_together_create_exactly_one_key(tmp_path, round_: int) -> None:
    """Replicas on a fresh shared volume: one creates the key, the others adopt its file."""
    ctx = multiprocessing.get_context("fork")
    replicas = 8
    barrier, results = ctx.Barrier(replicas), ctx.Queue()
    procs = [
        ctx.Process(target=_race_for_key, args=(str(tmp_path / "data"), barrier, results))
        for _ in range(replicas)
    ]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    assert not errors, errors
    created = [k for k in outcomes if k is not None]
    assert len(created) == 1, f"{len(created)} replicas each created (and printed) a key"
    ring = load_keyring(Settings(data_dir=tmp_path / "data", api_keys=""))
    assert ring.tenant_for(created[0]) == "default"
    assert (tmp_path / "data" / "api_keys.json").stat().st_mode & 0o777 == 0o600


def test_configured_keys_replace_the_generated_key_file(tmp_path) -> None:
    generated = ensure_key(Settings(data_dir=tmp_path))
    assert generated and load_keyring(Settings(data_dir=tmp_path)).tenant_for(generated) == "default"
    ring = load_keyring(Settings(data_dir=tmp_path, api_keys="a:keyA-0123456789,b:keyB-0123456789"))
    assert ring.tenant_for(generated) is None
    assert ring.tenant_for("keyA-0123456789") == "a" and ring.tenant_for("keyB-0123456789") == "b"
