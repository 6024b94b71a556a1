"""Failure handling with real workers: cancellation, a worker killed mid-job, a job that kills its
worker twice. Workers here sleep after each stage (AUTOFUSION_DEBUG_STAGE_DELAY) so that "mid-job"
is a window a test can hit."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import httpx
import pytest
from harness import (
    API_KEYS,
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

from autofusion_core.store.redis import RedisJobStore

pytestmark = pytest.mark.integration
DB = 29


@pytest.fixture(scope="module")
def setup(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("failures")
    env = subprocess_env(
        AUTOFUSION_REDIS_URL=redis_server.url(DB),
        AUTOFUSION_DATA_DIR=str(tmp / "data"),
        AUTOFUSION_API_KEYS=API_KEYS,
        AUTOFUSION_DEBUG_STAGE_DELAY="0.6",
    )
    port = free_port()
    api, base = start_api(env, tmp / "api.log", port)
    workers = [start_worker(env, tmp / f"worker-{i}.log") for i in range(2)]
    client = httpx.Client(base_url=base, timeout=30)
    wait_for_workers(client, "cpu", count=2)
    state = {"client": client, "workers": workers, "env": env, "tmp": tmp, "api": api, "port": port}
    state["store"] = RedisJobStore(env["AUTOFUSION_REDIS_URL"])
    yield state
    client.close()
    for p in [state["api"], *workers]:
        p.stop()


def running(job: dict) -> bool:
    return job["status"] == "running" and job["stage"] in ("canonicalizing", "planning", "exporting")


def owner_pid(store: RedisJobStore, job_id: str) -> int:
    lease = store.get(job_id).lease
    assert lease is not None
    return lease.pid


def test_cancel_running_job(setup: dict) -> None:
    c = setup["client"]
    job = submit(c, tiny_model(seed=31)).json()
    poll(c, job["id"], running)
    r = c.post(f"/jobs/{job['id']}/cancel", headers=auth())
    assert r.status_code == 202 and r.json()["status"] in ("cancelling", "cancelled")
    done = poll(c, job["id"], finished, timeout=30)
    assert done["status"] == "cancelled" and done["artifacts"]["model"] is None


def test_api_restart_mid_job_leaves_it_intact(setup: dict) -> None:
    c = setup["client"]
    job = submit(c, tiny_model(seed=35)).json()
    poll(c, job["id"], running)
    setup["api"].stop()
    setup["api"], _ = start_api(setup["env"], setup["tmp"] / "api-2.log", setup["port"])
    done = poll(c, job["id"], finished, timeout=60)
    assert done["status"] == "succeeded" and done["attempt"] == 1 and done["created_at"] == job["created_at"]


def test_sigkill_worker_mid_job_and_another_finishes_it(setup: dict) -> None:
    c, store = setup["client"], setup["store"]
    job = submit(c, tiny_model(seed=32)).json()
    poll(c, job["id"], running)
    pid = owner_pid(store, job["id"])
    victim = next(w for w in setup["workers"] if os.getpgid(pid) == w.pid)
    victim.kill()  # the worker and its pool child, like a host dying
    done = poll(c, job["id"], finished, timeout=90)
    assert done["status"] == "succeeded", done
    assert done["attempt"] == 2
    setup["workers"].remove(victim)
    setup["workers"].append(start_worker(setup["env"], setup["tmp"] / "worker-2.log"))
    wait_for_workers(c, "cpu", count=2)


def test_job_that_kills_its_worker_twice_fails_as_worker_crashed(setup: dict) -> None:
    c, store = setup["client"], setup["store"]
    job = submit(c, tiny_model(seed=33)).json()
    for attempt in (1, 2):
        poll(c, job["id"], lambda j, a=attempt: running(j) and j["attempt"] == a, timeout=90)
        os.kill(owner_pid(store, job["id"]), signal.SIGKILL)  # the process running the job dies
    done = poll(c, job["id"], finished, timeout=90)
    assert done["status"] == "failed" and done["attempt"] == 2
    assert done["error"]["code"] == "worker_crashed" and done["error"]["status"] == 500
    # the workers themselves survived (their pool replaced the dead children)
    wait_for(lambda: all(w.alive() for w in setup["workers"]), 5)


def test_soft_time_limit_fails_the_job_cleanly(setup: dict) -> None:
    # a worker for another target, with a soft limit shorter than one stage's debug delay
    env = {
        **setup["env"],
        "AUTOFUSION_SOFT_TIME_LIMIT": "1",
        "AUTOFUSION_HARD_TIME_LIMIT": "20",
        "AUTOFUSION_DEBUG_STAGE_DELAY": "3",
    }
    worker = start_worker(env, setup["tmp"] / "worker-limits.log", targets="ascend910")
    try:
        c = setup["client"]
        wait_for_workers(c, "ascend910")
        job = submit(c, tiny_model(seed=34), target="ascend910").json()
        done = poll(c, job["id"], finished, timeout=60)
        assert done["status"] == "failed" and done["error"]["code"] == "time_limit_exceeded", done
        assert done["attempt"] == 1
    finally:
        worker.stop()
