"""The client against a real service on loopback: the contract end to end, every typed error."""

from __future__ import annotations

import asyncio
import hashlib
import io
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from graph_autofusion_client import (
    AsyncClient,
    AuthenticationError,
    Client,
    InvalidConfigError,
    InvalidModelError,
    Job,
    JobCancelledError,
    JobFailedError,
    JobNotReadyError,
    JobStatus,
    NotFoundError,
    PayloadTooLargeError,
    RetryPolicy,
    ServiceUnavailableError,
    UnknownTargetError,
)

from ._live import UPLOAD_LIMIT_MB, LiveService, free_port, new_service, service_available
from ._onnx_models import cyclic, symbolic_batch, tiny_mlp, zoo_mlp

pytestmark = pytest.mark.skipif(not service_available(), reason="autofusion_service is not installed")

WAIT = 120.0


@pytest.fixture
def client(live_service: LiveService) -> Iterator[Client]:
    with Client(live_service.url, api_key=live_service.key) as client:
        yield client


@pytest.fixture(scope="module")
def fused(live_service: LiveService, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One zoo model fused through `Client.fuse`, shared by the tests that read its results."""
    out = tmp_path_factory.mktemp("fused")
    stages: list[tuple[str, str | None]] = []
    with Client(live_service.url, api_key=live_service.key) as client:
        job = client.fuse(
            zoo_mlp(),
            out / "fused.onnx",
            bundle=out / "bundle.tgz",
            timeout=WAIT,
            on_progress=lambda j: stages.append((j.status.value, j.stage)),
        )
    return {"job": job, "model": out / "fused.onnx", "bundle": out / "bundle.tgz", "stages": stages}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_fuse_submits_waits_and_downloads_verified_results(fused: dict[str, Any]) -> None:
    import onnx

    job: Job = fused["job"]
    assert job.status is JobStatus.SUCCEEDED
    assert job.artifacts.model is not None and job.artifacts.bundle is not None
    assert _sha(fused["model"]) == job.artifacts.model.digest
    assert _sha(fused["bundle"]) == job.artifacts.bundle.digest
    onnx.checker.check_model(onnx.load(str(fused["model"])))
    with tarfile.open(fused["bundle"]) as bundle:
        assert any(name.endswith(".onnx") for name in bundle.getnames())
    assert fused["stages"][-1][0] == "succeeded"
    assert len(fused["stages"]) >= 2  # progress was reported while it ran, not only at the end


def test_report_is_typed(client: Client, fused: dict[str, Any]) -> None:
    import onnx

    report = client.report(fused["job"].id)
    assert report.operators.original is not None and report.operators.original > 0
    assert report.kernels.before is not None and report.kernels.after is not None
    assert 0 < report.kernels.after <= report.kernels.before
    assert report.fusions == len(report.groups)
    fused_model = onnx.load(str(fused["model"]))
    calls = [node for node in fused_model.graph.node if node.domain == "ai.graph_autofusion"]
    assert len(calls) >= len(report.groups) > 0  # every fused group is a kernel in the model
    member_names = {name for group in report.groups for name in group.members}
    assert member_names and all(group.template for group in report.groups)
    assert sum(report.refusals().values()) == len(report.refused)
    assert report.estimates.latency_us.after is not None


def test_submission_is_idempotent_and_reattachable(live_service: LiveService, fused: dict[str, Any]) -> None:
    original: Job = fused["job"]
    with Client(live_service.url, api_key=live_service.key) as later_step:
        again = later_step.submit(zoo_mlp())
        assert again.id == original.id
        reattached = later_step.get_job(original.id)
        assert reattached.status is JobStatus.SUCCEEDED
        assert reattached.artifacts == original.artifacts
        assert original.id in {job.id for job in later_step.list_jobs(page_size=1)}


def test_the_engines_own_config_object_is_accepted(client: Client) -> None:
    engine_config = pytest.importorskip("graph_autofusion.config")
    job = client.submit(
        tiny_mlp(hidden=9), config=engine_config.FusionConfig(max_rounds=4, cost_model="latency")
    )
    assert job.config["max_rounds"] == 4 and job.config["cost_model"] == "latency"


def test_tenants_do_not_see_each_others_jobs(live_service: LiveService, fused: dict[str, Any]) -> None:
    with Client(live_service.url, api_key="key-b") as other, pytest.raises(NotFoundError) as info:
        other.get_job(fused["job"].id)
    assert info.value.status == 404 and info.value.code == "not_found"


def test_download_to_a_fresh_path_matches_the_artifact(
    client: Client, fused: dict[str, Any], tmp_path: Path
) -> None:
    job = client.get_job(fused["job"].id)
    path = job.download_model(tmp_path / "again.onnx")
    assert path.read_bytes() == fused["model"].read_bytes()
    assert job.artifacts.model is not None
    client.download_artifact(job.artifacts.model.digest, tmp_path / "by-digest.onnx")
    assert (tmp_path / "by-digest.onnx").read_bytes() == path.read_bytes()


def test_cancel(client: Client) -> None:
    job = client.submit(tiny_mlp(hidden=24), config={"max_rounds": 7})
    job.cancel()
    assert job.status in (JobStatus.CANCELLING, JobStatus.CANCELLED)
    job.wait(timeout=WAIT)
    assert job.status is JobStatus.CANCELLED
    with pytest.raises(JobCancelledError):
        job.raise_for_status()
    with pytest.raises(JobNotReadyError) as info:
        job.report()
    assert info.value.code == "job_not_ready"


@pytest.mark.parametrize("key", ["wrong-key", None])
def test_authentication_error(
    live_service: LiveService, key: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AUTOFUSION_API_KEY", raising=False)
    with Client(live_service.url, api_key=key) as client, pytest.raises(AuthenticationError) as info:
        client.get_job("anything")
    assert info.value.status == 401 and info.value.code == "unauthorized"


def test_not_found(client: Client) -> None:
    with pytest.raises(NotFoundError):
        client.get_job("no-such-job")


@pytest.mark.parametrize(
    ("model", "reason"), [(b"this is not an onnx model", "not_onnx"), (cyclic(), "graph_cycle")]
)
def test_invalid_model_keeps_the_engine_reason(client: Client, model: Any, reason: str) -> None:
    with pytest.raises(InvalidModelError) as info:
        client.submit(model)
    assert info.value.status == 422
    assert info.value.reason == reason
    assert info.value.detail and info.value.instance == "/fuse"


def test_failed_job_raises_job_failed_with_its_problem(client: Client, tmp_path: Path) -> None:
    with pytest.raises(JobFailedError) as info:
        client.fuse(symbolic_batch(), tmp_path / "never.onnx", timeout=WAIT)
    error = info.value
    assert error.job.status is JobStatus.FAILED
    assert error.code == "unbound_dimension" and error.status == 422
    assert error.extra.get("input") == "x"  # the engine's details survive as problem extensions
    assert not (tmp_path / "never.onnx").exists()
    with pytest.raises(JobNotReadyError):
        client.download_model(error.job, tmp_path / "never.onnx")


@pytest.mark.parametrize("config", [{"max_fusion_size": -1}, {"no_such_knob": True}])
def test_invalid_config(client: Client, config: dict[str, Any]) -> None:
    with pytest.raises(InvalidConfigError) as info:
        client.submit(tiny_mlp(), config=config)
    assert info.value.code == "invalid_config" and info.value.status == 422


def test_unknown_target(client: Client) -> None:
    with pytest.raises(UnknownTargetError):
        client.submit(tiny_mlp(), target="no-such-chip")


def test_payload_too_large(client: Client) -> None:
    with pytest.raises(PayloadTooLargeError) as info:
        client.submit(io.BytesIO(b"\0" * ((UPLOAD_LIMIT_MB + 1) * 1024 * 1024)))
    assert info.value.status == 413


def test_unreachable_service_is_typed(tmp_path: Path) -> None:
    retry = RetryPolicy(max_retries=2, backoff_base=0.01, backoff_cap=0.02)
    client = Client(f"http://127.0.0.1:{free_port()}", api_key="k", retry=retry)
    with client, pytest.raises(ServiceUnavailableError) as info:
        client.submit(tiny_mlp())
    assert "3 attempt" in str(info.value)


def test_targets_patterns_and_probes(client: Client) -> None:
    assert client.healthy() and client.ready()
    assert "cpu" in {target.name for target in client.targets()}
    patterns = client.patterns()
    assert patterns and all(pattern.name for pattern in patterns)


def test_async_client_against_the_service(live_service: LiveService, tmp_path: Path) -> None:
    async def run() -> tuple[str, bytes]:
        async with AsyncClient(live_service.url, api_key=live_service.key) as client:
            job = await client.fuse(tiny_mlp(hidden=12), tmp_path / "a.onnx", timeout=WAIT)
            ids = [j.id async for j in client.list_jobs()]
            assert job.id in ids
            return job.id, (tmp_path / "a.onnx").read_bytes()

    job_id, data = asyncio.run(run())
    with Client(live_service.url, api_key=live_service.key) as client:
        state = client.get_job(job_id)
    assert state.artifacts.model is not None
    assert hashlib.sha256(data).hexdigest() == state.artifacts.model.digest


def test_retry_reaches_a_service_that_starts_late(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The first attempt finds nothing listening; the service comes up; the same call succeeds."""
    service = new_service(tmp_path_factory, "late")
    first_failure = threading.Event()
    attempts = 0

    class Counting(httpx.HTTPTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            nonlocal attempts
            attempts += 1
            try:
                return super().handle_request(request)
            except httpx.TransportError:
                first_failure.set()
                raise

    retry = RetryPolicy(max_retries=60, backoff_base=0.25, backoff_cap=1.0)
    client = Client(service.url, api_key=service.key, retry=retry, transport=Counting())
    result: dict[str, Any] = {}

    def submit() -> None:
        try:
            result["job"] = client.submit(tiny_mlp(hidden=20))
        except Exception as exc:  # surfaced by the assertion below
            result["error"] = exc

    worker = threading.Thread(target=submit)
    worker.start()
    try:
        assert first_failure.wait(30), "the first attempt never happened"
        service.start()
        worker.join(READY := 120)
        assert not worker.is_alive(), f"submit still retrying after {READY}s:\n{service.log_tail()}"
        assert "error" not in result, result.get("error")
        assert attempts >= 2
        job = result["job"]
        assert client.get_job(job.id).id == job.id
    finally:
        client.close()
        service.stop()
