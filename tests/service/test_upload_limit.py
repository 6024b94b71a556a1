"""The upload limit is enforced while the body streams in: driven through raw ASGI calls so the
test can see how much of the body the app actually read."""

from __future__ import annotations

import asyncio
import json

from harness import API_KEYS, fast_settings

from autofusion_service import create_app
from autofusion_service.limits import FORM_OVERHEAD


def call(app, headers: list[tuple[bytes, bytes]], chunks: list[bytes]) -> tuple[int, dict, int]:
    """POST /fuse with the body in `chunks`; returns (status, body, chunks the app pulled)."""
    pulled = 0
    sent: list[dict] = []

    async def receive() -> dict:
        nonlocal pulled
        if pulled < len(chunks):
            pulled += 1
            return {"type": "http.request", "body": chunks[pulled - 1], "more_body": pulled < len(chunks)}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/fuse",
        "raw_path": b"/fuse",
        "root_path": "",
        "query_string": b"",
        "server": ("t", 80),
        "client": ("c", 1),
        "headers": [(b"authorization", b"Bearer " + API_KEYS.split(",")[0].split(":")[1].encode()), *headers],
    }
    asyncio.run(asyncio.wait_for(app(scope, receive, send), 30))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], json.loads(body), pulled


def test_declared_length_over_limit_is_refused_before_reading(tmp_path) -> None:
    app = create_app(fast_settings(tmp_path, max_upload_mb=0.1))
    headers = [(b"content-type", b"multipart/form-data; boundary=x"), (b"content-length", b"999999999")]
    status, body, pulled = call(app, headers, [b"--x\r\n"] * 10)
    assert status == 413 and body["code"] == "payload_too_large" and pulled == 0


def test_streamed_body_is_cut_off_at_the_limit(tmp_path) -> None:
    app = create_app(fast_settings(tmp_path, max_upload_mb=0.1))
    head = b'--x\r\nContent-Disposition: form-data; name="model"; filename="m.onnx"\r\n\r\n'
    chunk = b"\0" * (64 * 1024)
    limit = int(0.1 * 1024 * 1024) + FORM_OVERHEAD
    chunks = [head] + [chunk] * 100  # 6.4 MB, no Content-Length: chunked transfer
    status, body, pulled = call(app, [(b"content-type", b"multipart/form-data; boundary=x")], chunks)
    assert status == 413 and body["code"] == "payload_too_large"
    assert pulled <= limit // len(chunk) + 2  # stopped at the first chunk over the limit
