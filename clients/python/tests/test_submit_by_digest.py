"""`submit` names a large model by its sha256 first and uploads it only when the service asks.

Transport-level tests pin down the request sequence; the live tests show the service answering both
ways (a tenant's own earlier upload is found, another tenant's is not).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Iterator
from urllib.parse import parse_qs

import httpx
import pytest
from graph_autofusion_client import (
    AsyncClient,
    AuthenticationError,
    Client,
    InvalidModelError,
    RetryPolicy,
)

from ._fakes import job_json, problem
from ._live import LiveService, service_available
from ._onnx_models import tiny_mlp

FAST = RetryPolicy(max_retries=2, backoff_base=0.001, backoff_cap=0.002, rng=random.Random(0))
MODEL = b"\x08\x07" + bytes(range(256)) * 8  # 2 KiB: over the threshold the tests set


def fields(request: httpx.Request) -> dict[str, str]:
    assert request.headers["content-type"] == "application/x-www-form-urlencoded"
    return {k: v[0] for k, v in parse_qs(request.read().decode()).items()}


class Service:
    """A fake `/fuse` that holds some digests (or none) and records every request."""

    def __init__(self, holds: set[str], digest_answer: httpx.Response | None = None) -> None:
        self.holds, self.digest_answer, self.seen = holds, digest_answer, []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        if request.headers["content-type"].startswith("multipart/form-data"):
            return httpx.Response(202, json=job_json("uploaded"))
        if self.digest_answer is not None:
            return self.digest_answer
        if fields(request)["model_digest"] in self.holds:
            return httpx.Response(200, json=job_json("by-digest"))
        return problem("unknown_model_digest", 422)


def client_for(service: Service, threshold: int | None = 1024) -> Client:
    transport = httpx.MockTransport(service)
    return Client(
        "http://svc.test", api_key="k", retry=FAST, transport=transport, digest_first_min_bytes=threshold
    )


def test_a_held_model_is_submitted_by_digest_only() -> None:
    service = Service({hashlib.sha256(MODEL).hexdigest()})
    with client_for(service) as client:
        job = client.submit(MODEL, config={"max_rounds": 3}, target="cpu", filename="net.onnx")
    assert job.id == "by-digest" and len(service.seen) == 1
    sent = fields(service.seen[0])
    assert sent == {
        "model_digest": hashlib.sha256(MODEL).hexdigest(),
        "model_filename": "net.onnx",
        "target": "cpu",
        "config": '{"max_rounds": 3}',
    }


def test_an_unknown_digest_falls_back_to_the_upload(tmp_path) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(MODEL)
    service = Service(set())
    with client_for(service) as client:
        job = client.submit(path)
    assert job.id == "uploaded"
    first, second = service.seen
    assert fields(first)["model_digest"] == hashlib.sha256(MODEL).hexdigest()
    body = second.read()
    assert b'filename="m.onnx"' in body and MODEL in body


def test_a_service_without_digest_support_gets_the_upload() -> None:
    """An older service refuses the missing `model` field as `validation_error`."""
    service = Service(set(), digest_answer=problem("validation_error", 422, "body.model: Field required"))
    with client_for(service) as client:
        assert client.submit(MODEL).id == "uploaded"
    assert len(service.seen) == 2


def test_other_errors_of_the_digest_submission_are_raised_without_an_upload() -> None:
    service = Service(set(), digest_answer=problem("unauthorized", 401))
    with client_for(service) as client, pytest.raises(AuthenticationError):
        client.submit(MODEL)
    assert len(service.seen) == 1
    service = Service(set(), digest_answer=problem("unknown_target", 422))
    with client_for(service) as client, pytest.raises(Exception) as info:
        client.submit(MODEL, target="tpu")
    assert info.value.code == "unknown_target" and len(service.seen) == 1
    assert not isinstance(info.value, InvalidModelError)


@pytest.mark.parametrize("threshold", [None, len(MODEL) + 1])
def test_small_models_and_opting_out_upload_directly(threshold: int | None) -> None:
    service = Service({hashlib.sha256(MODEL).hexdigest()})
    with client_for(service, threshold) as client:
        assert client.submit(MODEL).id == "uploaded"
    assert len(service.seen) == 1


def test_the_async_client_does_the_same() -> None:
    async def run(service: Service) -> str:
        transport = httpx.MockTransport(service)
        async with AsyncClient(
            "http://svc.test", api_key="k", retry=FAST, transport=transport, digest_first_min_bytes=1024
        ) as client:
            return (await client.submit(MODEL)).id

    held = Service({hashlib.sha256(MODEL).hexdigest()})
    assert asyncio.run(run(held)) == "by-digest" and len(held.seen) == 1
    unknown = Service(set())
    assert asyncio.run(run(unknown)) == "uploaded" and len(unknown.seen) == 2


# -- against the real service ------------------------------------------------------------------------


@pytest.fixture
def recorded(live_service: LiveService) -> Iterator[tuple[list[httpx.Request], Client, Client]]:
    if not service_available():
        pytest.skip("autofusion_service is not installed")
    seen: list[httpx.Request] = []
    hooks = {"request": [seen.append]}
    a = Client(live_service.url, api_key=live_service.key, digest_first_min_bytes=0)
    b = Client(live_service.url, api_key="key-b", digest_first_min_bytes=0)
    for c in (a, b):
        c._http.event_hooks = hooks
    with a, b:
        yield seen, a, b


def _uploads(seen: list[httpx.Request]) -> int:
    return sum(r.headers.get("content-type", "").startswith("multipart/") for r in seen)


def test_live_resubmission_sends_no_model_bytes(recorded: tuple[list[httpx.Request], Client, Client]) -> None:
    seen, tenant_a, tenant_b = recorded
    model = tiny_mlp(hidden=13)
    first = tenant_a.submit(model, filename="mlp13.onnx")
    assert _uploads(seen) == 1  # the digest was unknown: uploaded
    seen.clear()
    again = tenant_a.submit(model)
    assert again.id == first.id and _uploads(seen) == 0 and len(seen) == 1
    # another tenant's upload does not count for tenant b: b uploads, and gets its own job
    seen.clear()
    theirs = tenant_b.submit(model)
    assert theirs.id != first.id and _uploads(seen) == 1
    assert theirs.model.digest == first.model.digest
