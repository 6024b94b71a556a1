"""Key rotation over HTTP, as an operator does it: restart the API with other keys on the same data."""

from __future__ import annotations

import httpx
from harness import ThreadedServer, fast_settings, tiny_model

from autofusion_service import create_app
from autofusion_service.auth import ensure_key


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_rotated_keys_take_effect_on_restart_and_old_ones_stop(tmp_path) -> None:
    data = tmp_path / "data"
    generated = ensure_key(fast_settings(data, api_keys=""))  # what a first `serve` does
    assert generated
    server = ThreadedServer(create_app(fast_settings(data, api_keys="")))
    try:
        with httpx.Client(base_url=server.base, timeout=30) as c:
            answer = c.post(
                "/fuse", files={"model": ("m.onnx", tiny_model(seed=7))}, headers=_bearer(generated)
            )
            assert answer.status_code == 202, answer.text
            default_job = answer.json()["id"]
    finally:
        server.stop()

    # The operator configures keys: the generated key must stop working, tenants see only their jobs.
    server = ThreadedServer(create_app(fast_settings(data, api_keys="a:keyA-0123456789,b:keyB-0123456789")))
    try:
        with httpx.Client(base_url=server.base, timeout=30) as c:
            refused = c.get("/jobs", headers=_bearer(generated))
            assert refused.status_code == 401 and refused.json()["code"] == "unauthorized"
            assert c.get(f"/jobs/{default_job}", headers=_bearer("keyA-0123456789")).status_code == 404
            mine = c.post(
                "/fuse", files={"model": ("m.onnx", tiny_model(seed=8))}, headers=_bearer("keyA-0123456789")
            )
            assert mine.status_code == 202
            a_job = mine.json()["id"]
    finally:
        server.stop()

    # Rotation of tenant a's key: the new key sees a's jobs, the old one is refused.
    server = ThreadedServer(create_app(fast_settings(data, api_keys="a:keyA2-0123456789,b:keyB-0123456789")))
    try:
        with httpx.Client(base_url=server.base, timeout=30) as c:
            assert c.get(f"/jobs/{a_job}", headers=_bearer("keyA2-0123456789")).status_code == 200
            assert c.get(f"/jobs/{a_job}", headers=_bearer("keyA-0123456789")).status_code == 401
            assert c.get(f"/jobs/{a_job}", headers=_bearer("keyB-0123456789")).status_code == 404
    finally:
        server.stop()
