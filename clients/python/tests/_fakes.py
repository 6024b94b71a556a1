"""Canned service answers for the transport-level unit tests (the live tests use the real service)."""

from __future__ import annotations

import hashlib
from typing import Any

import httpx

PROBLEM = "application/problem+json"


def job_json(job_id: str = "job-1", status: str = "queued", **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": job_id,
        "status": status,
        "stage": None,
        "progress": None,
        "target": "cpu",
        "config": {},
        "model": {"digest": "0" * 64, "size": 10, "filename": "m.onnx"},
        "attempt": 0,
        "created_at": "2026-01-01T00:00:00Z",
        "started_at": None,
        "finished_at": None,
        "updated_at": "2026-01-01T00:00:00Z",
        "error": None,
        "links": {"self": f"/jobs/{job_id}", "report": f"/jobs/{job_id}/report"},
        "artifacts": {"model": None, "bundle": None},
    }
    body.update(overrides)
    return body


def problem(code: str, status: int, detail: str = "nope", **extra: Any) -> httpx.Response:
    body = {"type": f"/problems/{code}", "title": "t", "status": status, "detail": detail, "code": code}
    body.update(extra)
    return httpx.Response(status, json=body, headers={"Content-Type": PROBLEM})


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
