"""Client behaviour at the transport level: retries, polling, downloads, sync/async parity.

The real-service tests (test_live_service.py) cover the contract end to end; these pin down the
timing and failure paths a live server cannot be made to produce on demand.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import random
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from graph_autofusion_client import (
    AsyncClient,
    AsyncJob,
    Client,
    FusionConfig,
    IntegrityError,
    InvalidModelError,
    Job,
    JobFailedError,
    JobState,
    RetryPolicy,
    ServiceUnavailableError,
    WaitTimeoutError,
)

from ._fakes import job_json, problem, sha

FAST = RetryPolicy(max_retries=3, backoff_base=0.001, backoff_cap=0.002, rng=random.Random(0))
Handler = Callable[[httpx.Request], httpx.Response]


def client_for(handler: Handler, retry: RetryPolicy = FAST) -> Client:
    return Client("http://svc.test", api_key="key-a", retry=retry, transport=httpx.MockTransport(handler))


def test_submit_sends_multipart_auth_and_config(tmp_path: Path) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(202, json=job_json(), headers={"Location": "/jobs/job-1"})

    model = tmp_path / "m.onnx"
    model.write_bytes(b"onnx-bytes")
    with client_for(handler) as client:
        job = client.submit(model, config=FusionConfig(max_fusion_size=8), target="cpu")
    assert isinstance(job, Job) and job.id == "job-1"
    request = seen[0]
    assert (request.method, request.url.path) == ("POST", "/fuse")
    assert request.headers["Authorization"] == "Bearer key-a"
    body = request.read()
    assert b'filename="m.onnx"' in body and b"onnx-bytes" in body
    assert b'{"max_fusion_size": 8}' in body  # only the fields that were set


def test_connection_errors_are_retried_then_succeed() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(202, json=job_json())

    with client_for(handler) as client:
        job = client.submit(b"model")
    assert job.id == "job-1" and calls == 3


def test_retries_are_bounded_and_end_in_service_unavailable() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(503, text="down for maintenance")

    with client_for(handler) as client, pytest.raises(ServiceUnavailableError) as info:
        client.get_job("job-1")
    assert calls == FAST.max_retries + 1
    assert info.value.status == 503
    assert info.value.detail == "down for maintenance"


def test_client_errors_are_not_retried() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return problem("not_onnx", 422, "not a protobuf")

    with client_for(handler) as client, pytest.raises(InvalidModelError) as info:
        client.submit(b"garbage")
    assert calls == 1
    assert info.value.reason == "not_onnx"


def test_backoff_is_capped_full_jitter_and_honours_retry_after() -> None:
    policy = RetryPolicy(max_retries=10, backoff_base=0.5, backoff_cap=4.0, rng=random.Random(1))
    delays = [policy.delay(n) for n in range(10) for _ in range(50)]
    assert all(0.0 <= d <= 4.0 for d in delays)
    assert max(delays[:50]) <= 0.5  # first retry within the base window
    assert len({round(d, 6) for d in delays}) > 100  # jittered, not lockstep
    assert policy.delay(0, retry_after=2.5) == 2.5
    assert policy.delay(0, retry_after=60) == 4.0


def test_wait_polls_until_terminal_and_reports_moves_only() -> None:
    states = [
        job_json(status="queued"),
        job_json(status="running", stage="plan"),
        job_json(status="running", stage="plan"),
        job_json(status="running", stage="compile", progress={"done": 1, "total": 2}),
        job_json(status="succeeded", stage="package"),
    ]
    polls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        polls.append(request.url.path)
        state = states[min(len(polls) - 1, len(states) - 1)]
        headers = {} if state["status"] == "succeeded" else {"Retry-After": "0"}
        return httpx.Response(200, json=state, headers=headers)

    seen: list[tuple[str, str | None]] = []
    with client_for(handler) as client:
        job = client.get_job("job-1")
        job.wait(on_progress=lambda j: seen.append((j.status.value, j.stage)))
    assert job.status.value == "succeeded"
    assert seen == [("running", "plan"), ("running", "compile"), ("succeeded", "package")]
    assert len(polls) == len(states)


def test_wait_timeout_leaves_the_job_alone() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.method == "GET"  # no cancel on timeout
        return httpx.Response(200, json=job_json(status="running"), headers={"Retry-After": "0"})

    with client_for(handler) as client, pytest.raises(WaitTimeoutError) as info:
        client.wait("job-1", timeout=0.3)
    assert info.value.job.status.value == "running"


def test_wait_rides_out_a_broker_outage_longer_than_the_retries() -> None:
    """The service answers 503 broker_unavailable while its Redis restarts: wait() keeps polling
    (the client's per-request retries run out several times over) and sees the job finish."""
    polls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        polls.append(1)
        if len(polls) <= 3 * (FAST.max_retries + 1):
            return problem("broker_unavailable", 503, "the job store or queue is unavailable")
        return httpx.Response(200, json=job_json(status="succeeded"))

    with client_for(handler) as client:
        job = client.wait(JobState.model_validate(job_json(status="running")))
    assert job.status.value == "succeeded" and len(polls) == 3 * (FAST.max_retries + 1) + 1


def test_wait_gives_up_on_an_outage_past_its_deadline() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return problem("broker_unavailable", 503, "the job store or queue is unavailable")

    with client_for(handler) as client, pytest.raises(ServiceUnavailableError):
        client.wait(JobState.model_validate(job_json(status="running")), timeout=0.5)


def _download_service(payload: bytes, etag: str) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/model"):
            return httpx.Response(200, content=payload, headers={"ETag": f'"{etag}"'})
        artifacts = {"model": {"digest": sha(payload), "size": len(payload)}, "bundle": None}
        return httpx.Response(200, json=job_json(status="succeeded", artifacts=artifacts))

    return handler


def test_download_streams_and_verifies(tmp_path: Path) -> None:
    payload = b"fused" * 1000
    with client_for(_download_service(payload, sha(payload))) as client:
        path = client.get_job("job-1").download_model(tmp_path / "out" / "fused.onnx")
    assert path.read_bytes() == payload
    assert [p.name for p in path.parent.iterdir()] == ["fused.onnx"]  # no temp file left


def test_download_with_wrong_etag_leaves_nothing(tmp_path: Path) -> None:
    payload = b"fused"
    with client_for(_download_service(payload, "ab" * 32)) as client, pytest.raises(IntegrityError):
        client.get_job("job-1").download_model(tmp_path / "fused.onnx")
    assert list(tmp_path.iterdir()) == []


def test_download_checks_the_jobs_artifact_digest(tmp_path: Path) -> None:
    # the ETag is consistent with the bytes, but the job said the model has another digest
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b"other", headers={"ETag": f'"{sha(b"other")}"'})

    state = job_json(status="succeeded", artifacts={"model": {"digest": sha(b"fused"), "size": 5}})
    with client_for(handler) as client, pytest.raises(IntegrityError) as info:
        client.download_model(JobState.model_validate(state), tmp_path / "f")
    assert "job artifact" in str(info.value)
    assert list(tmp_path.iterdir()) == []


class _BrokenStream(httpx.SyncByteStream):
    """A body that breaks after its first chunk, as a dropped connection does."""

    def __init__(self, first: bytes) -> None:
        self.first = first

    def __iter__(self):
        yield self.first
        raise httpx.ReadError("connection reset by peer")


def test_download_interrupted_mid_body_is_retried_from_scratch(tmp_path: Path) -> None:
    payload = b"0123456789" * 100
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        headers = {"ETag": f'"{sha(payload)}"'}
        if calls == 1:
            return httpx.Response(200, stream=_BrokenStream(payload[:10]), headers=headers)
        return httpx.Response(200, content=payload, headers=headers)

    with client_for(handler) as client:
        path = client.download_model("job-1", tmp_path / "fused.onnx")
    assert calls == 2
    assert path.read_bytes() == payload
    assert [p.name for p in tmp_path.iterdir()] == ["fused.onnx"]


def test_fuse_raises_job_failed_with_problem(tmp_path: Path) -> None:
    failed = job_json(status="failed", error={"code": "compilation_failed", "title": "x", "detail": "cc"})

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(202 if request.method == "POST" else 200, json=failed)

    with client_for(handler) as client, pytest.raises(JobFailedError) as info:
        client.fuse(b"model", tmp_path / "fused.onnx")
    assert info.value.code == "compilation_failed"
    assert not (tmp_path / "fused.onnx").exists()


def test_list_jobs_follows_cursors() -> None:
    pages = {
        None: {"items": [job_json("a"), job_json("b")], "next_cursor": "c1"},
        "c1": {"items": [job_json("c")], "next_cursor": None},
    }

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.params.get("limit") == "2"
        return httpx.Response(200, json=pages[request.url.params.get("cursor")])

    with client_for(handler) as client:
        assert [job.id for job in client.list_jobs(page_size=2)] == ["a", "b", "c"]


def test_env_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOFUSION_URL", "http://from-env:9000")
    monkeypatch.setenv("AUTOFUSION_API_KEY", "env-key")
    client = Client()
    assert str(client.base_url) == "http://from-env:9000/"
    assert client.api_key == "env-key"
    client.close()
    monkeypatch.delenv("AUTOFUSION_URL")
    with pytest.raises(ValueError, match="AUTOFUSION_URL"):
        Client()


def _public(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }


def test_sync_and_async_surfaces_are_identical() -> None:
    sync, asynchronous = _public(Client), _public(AsyncClient)
    sync.pop("close")
    asynchronous.pop("aclose")
    assert sync.keys() == asynchronous.keys()
    for name in sync:
        assert list(sync[name].parameters) == list(asynchronous[name].parameters), name
    assert _public(Job).keys() == _public(AsyncJob).keys()


def test_async_client_runs_the_same_flow(tmp_path: Path) -> None:
    payload = b"fused-async"
    polls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal polls
        if request.method == "POST":
            return httpx.Response(202, json=job_json())
        if request.url.path.endswith("/model"):
            return httpx.Response(200, content=payload, headers={"ETag": f'"{sha(payload)}"'})
        polls += 1
        status = "succeeded" if polls > 1 else "running"
        return httpx.Response(200, json=job_json(status=status), headers={"Retry-After": "0"})

    async def run() -> AsyncJob:
        async with AsyncClient(
            "http://svc.test", api_key="k", retry=FAST, transport=httpx.MockTransport(handler)
        ) as client:
            seen: list[str] = []

            async def on_progress(job: AsyncJob) -> None:
                seen.append(job.status.value)

            job = await client.fuse(b"m", tmp_path / "f.onnx", on_progress=on_progress)
            assert seen == ["running", "succeeded"]
            return job

    job = asyncio.run(run())
    assert job.status.value == "succeeded"
    assert (tmp_path / "f.onnx").read_bytes() == payload


def test_config_accepts_engine_style_models_and_dicts() -> None:
    from graph_autofusion_client._config import config_to_dict

    assert config_to_dict({"max_rounds": 3}) == {"max_rounds": 3}
    assert config_to_dict(FusionConfig(cost_model="latency")) == {"cost_model": "latency"}
    assert json.loads(json.dumps(config_to_dict(FusionConfig.model_validate({"future_knob": 1})))) == {
        "future_knob": 1
    }
    with pytest.raises(TypeError):
        config_to_dict(42)  # type: ignore[arg-type]
