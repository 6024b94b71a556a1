"""`autofusion serve` with no Redis: API + worker on local files, one command, end to end."""

from __future__ import annotations

import json
import os
import re
import signal
import time

import httpx
import pytest
from harness import (
    API_KEYS,
    fast_settings,
    finished,
    free_port,
    start_api,
    subprocess_env,
    tiny_model,
    wait_for,
)

from autofusion_core.store import open_store
from autofusion_service.cli import uvicorn_config

pytestmark = pytest.mark.integration


def test_embedded_serve_end_to_end(tmp_path) -> None:
    env = subprocess_env(AUTOFUSION_DATA_DIR=str(tmp_path / "data"))
    port = free_port()
    api, base = start_api(env, tmp_path / "serve.log", port)
    try:
        key = wait_for(
            lambda: re.search(r"^\s+(af_\S+)$", api.output(), re.M), 10, what="the printed key"
        ).group(1)
        stored = json.loads((tmp_path / "data" / "api_keys.json").read_text())
        assert key not in json.dumps(stored) and stored[0]["tenant"] == "default"
        c = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=30)
        wait_for(lambda: c.get("/targets").json()["targets"], 60, 0.1, what="the embedded worker")
        job = c.post("/fuse", files={"model": ("m.onnx", tiny_model(seed=41))}).json()
        done = wait_for(lambda: (j := c.get(f"/jobs/{job['id']}").json()) and finished(j) and j, 60, 0.05)
        assert done["status"] == "succeeded", api.output()[-3000:]
        assert c.get(f"/jobs/{job['id']}/bundle").headers["content-type"] == "application/gzip"
        assert c.get("/readyz").status_code == 200
    finally:
        api.stop()
    # a restart keeps the key (no new one printed) and the jobs
    api, base = start_api(env, tmp_path / "serve2.log", port)
    try:
        assert "af_" not in api.output()
        c = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=30)
        assert c.get(f"/jobs/{job['id']}").json()["status"] == "succeeded"
    finally:
        api.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve_stops_its_worker_before_exiting(tmp_path, sig: signal.Signals) -> None:
    """`docker stop`, a Kubernetes rollout or Ctrl-C: serve drains the API, stops its worker (which
    withdraws its heartbeat) and exits 0 — it does not die of the signal and orphan the worker."""
    env = subprocess_env(AUTOFUSION_DATA_DIR=str(tmp_path / "data"), AUTOFUSION_API_KEYS=API_KEYS)
    api, _ = start_api(env, tmp_path / "serve.log", free_port(), "--drain-timeout", "5")
    store = open_store(fast_settings(tmp_path / "data"))
    try:
        (worker,) = wait_for(store.workers, 60, 0.1, what="the embedded worker's heartbeat")
        assert _alive(worker.pid)
        started = time.monotonic()
        api.proc.send_signal(sig)  # the serve process only, as a container runtime does
        exit_code = api.proc.wait(timeout=60)
        took = time.monotonic() - started
        assert exit_code == 0, api.output()[-3000:]
        assert not _alive(worker.pid), "serve exited but left its worker running"
        assert store.workers() == [], "the worker did not withdraw its heartbeat"
        assert took < 20, f"serve took {took:.1f} s to stop an idle worker"
    finally:
        api.stop()
        store.close()


def test_serve_uses_the_fast_server_stack_and_the_drain_timeout(tmp_path) -> None:
    from graph_autofusion.cli import build_parser

    args = build_parser().parse_args(["serve", "--drain-timeout", "7", "--api-workers", "2"])
    assert args.drain_timeout == 7 and args.api_workers == 2
    settings = fast_settings(tmp_path)
    config = uvicorn_config(settings, "127.0.0.1", 0, drain_timeout=args.drain_timeout)
    assert config.timeout_graceful_shutdown == 7
    assert (config.loop, config.http) == ("uvloop", "httptools")
    loop = config.get_loop_factory()()  # fails if uvloop is not installed
    try:
        assert type(loop).__module__.startswith("uvloop")
    finally:
        loop.close()
    config.load()  # fails if httptools is not installed
    assert config.http_protocol_class.__name__ == "HttpToolsProtocol"


def test_default_api_workers_follow_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    from autofusion_service import cli

    for cores, expected in ((1, 1), (2, 1), (4, 2), (8, 4), (64, 4)):
        monkeypatch.setattr(cli.os, "sched_getaffinity", lambda _pid, n=cores: set(range(n)))
        assert cli.default_api_workers() == expected
