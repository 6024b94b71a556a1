"""Distributed mode end to end: a private redis-server, real Celery worker processes and the API
process, driven over HTTP."""

from __future__ import annotations

import hashlib
import io
import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from harness import (
    API_KEYS,
    Proc,
    RedisServer,
    auth,
    finished,
    free_port,
    poll,
    start_api,
    start_worker,
    submit,
    subprocess_env,
    tiny_model,
    wait_for,
    wait_for_workers,
)

pytestmark = pytest.mark.integration


@dataclass
class Cluster:
    redis: RedisServer
    env: dict[str, str]
    tmp: Path
    api: Proc
    base: str
    port: int
    client: httpx.Client
    workers: list[Proc]

    def restart_api(self) -> None:
        self.api.stop()
        self.api, self.base = start_api(self.env, self.tmp / "api.log", self.port)

    def add_worker(self, targets: str = "cpu") -> Proc:
        worker = start_worker(self.env, self.tmp / f"worker-{len(self.workers)}.log", targets)
        self.workers.append(worker)
        return worker

    def logs(self) -> str:
        return "\n".join(f"--- {p.log.name}\n{p.output()[-4000:]}" for p in [self.api, *self.workers])


@pytest.fixture(scope="module")
def cluster(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("cluster")
    env = subprocess_env(
        AUTOFUSION_REDIS_URL=redis_server.url(30),
        AUTOFUSION_DATA_DIR=str(tmp / "data"),
        AUTOFUSION_API_KEYS=API_KEYS,
    )
    port = free_port()
    api, base = start_api(env, tmp / "api.log", port)
    c = Cluster(redis_server, env, tmp, api, base, port, httpx.Client(base_url=base, timeout=30), [])
    c.add_worker()
    wait_for_workers(c.client, "cpu")
    yield c
    c.client.close()
    for p in [c.api, *c.workers]:
        p.stop()


def test_submit_poll_and_download(cluster: Cluster) -> None:
    c = cluster.client
    job = submit(c, tiny_model(seed=11), config={"cost_model": "latency"}).json()
    done = poll(c, job["id"], finished)
    assert done["status"] == "succeeded", (done, cluster.logs())
    assert done["attempt"] == 1 and done["started_at"] and done["finished_at"] and done["error"] is None
    assert done["config"] == {"cost_model": "latency"}
    report = c.get(f"/jobs/{job['id']}/report", headers=auth())
    assert report.status_code == 200 and report.json()["verification"]["passed"] is True
    for path, media in (("model", "application/octet-stream"), ("bundle", "application/gzip")):
        r = c.get(f"/jobs/{job['id']}/{path}", headers=auth())
        assert r.status_code == 200 and r.headers["content-type"] == media
        digest = hashlib.sha256(r.content).hexdigest()
        assert r.headers["etag"] == f'"{digest}"' and int(r.headers["content-length"]) == len(r.content)
        assert done["artifacts"][path] == {"digest": digest, "size": len(r.content)}
        assert c.get(f"/artifacts/{digest}", headers=auth()).content == r.content
    with tarfile.open(fileobj=io.BytesIO(c.get(f"/jobs/{job['id']}/bundle", headers=auth()).content)) as tar:
        assert {"model.onnx", "manifest.json", "report.json"} <= set(tar.getnames())
    metrics = c.get("/metrics").text
    assert 'autofusion_stage_duration_seconds_count{stage="planning"}' in metrics
    assert 'autofusion_jobs{status="succeeded"}' in metrics
    assert re.search(r'autofusion_kernel_cache_total\{result="(hits|misses)"\} [1-9]', metrics)
    assert 'autofusion_workers{target="cpu"} 1.0' in metrics
    assert c.get("/readyz").status_code == 200


def test_duplicates_and_per_tenant_results(cluster: Cluster) -> None:
    """A tenant's resubmission returns its own job; another tenant's identical submission runs as a
    job of its own, so its status, attempt count and timing reveal nothing about the first."""
    c = cluster.client
    model = tiny_model(seed=12)
    first = submit(c, model).json()
    assert submit(c, model).json()["id"] == first["id"]
    done = poll(c, first["id"], finished)
    assert done["status"] == "succeeded"
    again = submit(c, model)
    assert again.status_code == 200 and again.json()["id"] == first["id"]
    bundle = done["artifacts"]["bundle"]["digest"]
    assert c.get(f"/artifacts/{bundle}", headers=auth("bob")).status_code == 404
    bobs = submit(c, model, tenant="bob")
    assert bobs.status_code == 202
    bob_job = bobs.json()
    assert bob_job["id"] != first["id"] and bob_job["status"] == "queued" and bob_job["attempt"] == 0
    bob_done = poll(c, bob_job["id"], finished, tenant="bob")
    assert bob_done["status"] == "succeeded" and bob_done["attempt"] == 1, cluster.logs()
    assert c.get(f"/jobs/{bob_job['id']}/model", headers=auth("bob")).status_code == 200
    assert c.get(f"/jobs/{first['id']}", headers=auth("bob")).status_code == 404
    assert c.get(f"/jobs/{bob_job['id']}", headers=auth()).status_code == 404


def test_failed_job_carries_the_engines_problem(cluster: Cluster) -> None:
    import onnx

    model = onnx.load_model_from_string(tiny_model(seed=13))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    job = submit(cluster.client, model.SerializeToString()).json()
    done = poll(cluster.client, job["id"], finished)
    assert done["status"] == "failed"
    assert (
        done["error"]["code"] == "unbound_dimension"
        and done["error"]["type"] == "/problems/unbound_dimension"
    )
    assert done["error"]["instance"] == f"/jobs/{job['id']}"
    r = cluster.client.get(f"/jobs/{job['id']}/model", headers=auth())
    assert r.status_code == 409 and r.json()["code"] == "job_not_ready"


def test_unserved_target_waits_survives_restarts_then_runs(cluster: Cluster) -> None:
    c = cluster.client
    job = submit(c, tiny_model(seed=14), target="ascend910").json()
    assert job["status"] == "queued" and job["stage"] == "waiting_for_worker"
    targets = {t["name"] for t in c.get("/targets", headers=auth()).json()["targets"]}
    assert "ascend910" not in targets
    cluster.restart_api()  # the API restarts with the job in flight
    cluster.redis.restart()  # Redis restarts with its append-only file
    c = cluster.client = httpx.Client(base_url=cluster.base, timeout=30)
    still = wait_for(lambda: _get_or_none(c, job["id"]), 20, 0.2, what="the API after restarts")
    assert still["status"] == "queued" and still["stage"] == "waiting_for_worker"
    cluster.add_worker("ascend910")
    done = poll(c, job["id"], finished, timeout=90)
    assert done["status"] == "succeeded", (done, cluster.logs())
    assert done["stage"] is None and done["attempt"] == 1


def _get_or_none(c: httpx.Client, job_id: str) -> dict | None:
    try:
        r = c.get(f"/jobs/{job_id}", headers=auth())
    except httpx.HTTPError:
        return None
    return r.json() if r.status_code == 200 else None
