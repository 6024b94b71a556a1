"""`autofusion serve` with no Redis: API + worker on local files, one command, end to end."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from harness import finished, free_port, start_api, subprocess_env, tiny_model, wait_for

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
