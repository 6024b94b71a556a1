"""Chaos in CI: a real redis-server SIGKILLed and restarted (append-only file on) while jobs are queued
and running, and the API SIGKILLed mid-job. Every job must succeed without help and none be lost.

Bounded: tiny models, a stage delay so that jobs are still running when the fault hits, short
leases and heartbeats (harness.FAST_ENV), one module-wide cluster of an API and two workers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis
from harness import (
    API_KEYS,
    KEYS,
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

#: Routes that need the store, as (method, path template); each must answer 503 while Redis is down.
STORE_ROUTES = [
    ("GET", "/jobs/{id}"),
    ("GET", "/jobs"),
    ("POST", "/fuse"),
    ("GET", "/targets"),
    ("GET", "/metrics"),
    ("POST", "/jobs/{id}/cancel"),
]


@dataclass
class Cluster:
    redis: RedisServer
    url: str
    env: dict[str, str]
    tmp: Path
    api: Proc
    port: int
    client: httpx.Client
    workers: list[Proc]

    def logs(self) -> str:
        return "\n".join(f"--- {p.log.name}\n{p.output()[-3000:]}" for p in [self.api, *self.workers])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("chaos")
    server = RedisServer(tmp / "redis")  # its own server: killing it disturbs no other test
    env = subprocess_env(
        AUTOFUSION_REDIS_URL=server.url(0),
        AUTOFUSION_DATA_DIR=str(tmp / "data"),
        AUTOFUSION_API_KEYS=API_KEYS,
        AUTOFUSION_DEBUG_STAGE_DELAY="0.3",
    )
    port = free_port()
    api, base = start_api(env, tmp / "api.log", port, "--api-workers", "1")
    # Worker 0 waits out the outage (the default); worker 1 gives up on the store after a second, so
    # its task ends — and fails to acknowledge its message — while Redis is away: the case that left
    # Celery's consumer on a dead connection for good, unless the heartbeat makes it reconnect.
    workers = [
        start_worker(env, tmp / "worker-0.log"),
        start_worker({**env, "AUTOFUSION_STORE_WAIT": "1"}, tmp / "worker-1.log"),
    ]
    c = Cluster(server, server.url(0), env, tmp, api, port, httpx.Client(base_url=base, timeout=30), workers)
    wait_for_workers(c.client, "cpu", count=2)
    yield c
    c.client.close()
    for p in [c.api, *c.workers]:
        p.stop()
    server.stop()


def _running(job: dict) -> bool:
    return job["status"] == "running"


def test_redis_killed_and_restarted_while_jobs_are_queued_and_running(cluster: Cluster) -> None:
    from graph_autofusion_client import Client

    c = cluster.client
    ids = [submit(c, tiny_model(seed=300 + i)).json()["id"] for i in range(5)]
    wait_for(lambda: sum(_running(c.get(f"/jobs/{i}", headers=auth()).json()) for i in ids) == 2, 60)

    waited: dict[str, str] = {}  # the SDK waits through the outage (retries, then wait()'s patience)
    sdk = Client(c.base_url.__str__(), api_key=KEYS["alice"])
    follower = threading.Thread(target=lambda: waited.update(s=sdk.wait(ids[-1], timeout=180).status.value))
    follower.start()

    impatient = cluster.workers[1]
    mark = len(impatient.output())
    cluster.redis.kill()
    for method, template in STORE_ROUTES:
        path = template.format(id=ids[1])
        files = {"model": ("m.onnx", tiny_model(seed=399))} if path == "/fuse" else None
        answer = c.request(method, path, headers=auth(), files=files)
        assert answer.status_code == 503, (method, path, answer.status_code, answer.text)
        assert answer.headers["content-type"] == "application/problem+json"
        assert answer.json()["code"] == "broker_unavailable" and int(answer.headers["retry-after"]) >= 1
    assert c.get("/readyz").status_code == 503 and c.get("/healthz").status_code == 200
    # Redis stays away until the impatient worker's task has ended (and its ack failed) meanwhile.
    wait_for(lambda: "Couldn't ack" in impatient.output()[mark:], 60, 0.2, what="a failed ack")
    time.sleep(1)
    cluster.redis.start()

    states = [poll(c, job_id, finished, timeout=120) for job_id in ids]
    assert [s["status"] for s in states] == ["succeeded"] * len(ids), (states, cluster.logs())
    follower.join(timeout=60)
    sdk.close()
    assert waited == {"s": "succeeded"}

    # Both workers consume again and count as ready; no message is left behind.
    wait_for(lambda: c.get("/readyz").status_code == 200, 30, 0.2, what="ready again")
    wait_for_workers(c, "cpu", count=2, timeout=30)
    marks = [len(w.output()) for w in cluster.workers]
    after = [submit(c, tiny_model(seed=310 + i)).json()["id"] for i in range(4)]
    assert all(poll(c, job_id, finished, timeout=90)["status"] == "succeeded" for job_id in after)
    for worker, mark in zip(cluster.workers, marks, strict=True):
        assert "started by" in worker.output()[mark:], f"{worker.log.name} took no job after the restart"
    broker = redis.Redis.from_url(cluster.url)
    try:
        assert broker.llen("fuse.cpu") == 0
    finally:
        broker.close()


def test_api_killed_mid_job(cluster: Cluster) -> None:
    c = cluster.client
    job_id = submit(c, tiny_model(seed=320)).json()["id"]
    poll(c, job_id, _running, timeout=60)
    cluster.api.kill()
    cluster.api, _ = start_api(cluster.env, cluster.tmp / "api-2.log", cluster.port, "--api-workers", "1")
    done = poll(c, job_id, finished, timeout=90)
    assert done["status"] == "succeeded" and done["attempt"] == 1, cluster.logs()
