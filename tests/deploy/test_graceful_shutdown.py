"""What `docker compose stop` / a Kubernetes rollout does: SIGTERM to each container's main process.

A worker (Celery's warm shutdown) must let the running job finish, take no new job, and leave the
queue with the jobs it did not start: a real worker process on a private redis-server (the broker
of the Compose and Kubernetes set-ups) runs an `ascend910` job (Triton kernels in the interpreter)
slowed by the fault-injection delay. The API (uvicorn) must stop accepting connections and finish the requests
already in flight: an upload still streaming in when the signal arrives is answered.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "service"))

from harness import (  # noqa: E402
    ThreadedServer,
    auth,
    enqueue_tiny_job,
    fast_settings,
    redis_db,
    redis_server,
    start_worker,
    subprocess_env,
    tiny_model,
    wait_for,
)

from autofusion_core.store import open_store  # noqa: E402
from autofusion_service import create_app  # noqa: E402

__all__ = ["redis_db", "redis_server"]  # fixtures
TARGET = "ascend910"
STAGE_DELAY_S = 0.3
DRAIN_WAIT_S = 0.5


@pytest.mark.integration
def test_sigterm_lets_the_running_job_finish_and_takes_no_new_one(tmp_path: Path, redis_db: str) -> None:
    settings = fast_settings(tmp_path, debug_stage_delay=STAGE_DELAY_S, redis_url=redis_db)
    env = subprocess_env(
        AUTOFUSION_DATA_DIR=str(tmp_path),
        AUTOFUSION_DEBUG_STAGE_DELAY=str(STAGE_DELAY_S),
        AUTOFUSION_REDIS_URL=redis_db,
    )
    store = open_store(settings)
    worker = start_worker(env, tmp_path / "worker.log", targets=TARGET)
    try:
        wait_for(store.workers, 60, 0.1, what="the worker's heartbeat")
        running = enqueue_tiny_job(settings, store, TARGET, "graceful-1", seed=1, tenant="deploy")

        def mid_pipeline() -> bool:
            job = store.get(running)
            return job is not None and job.status == "running" and job.stage is not None

        wait_for(mid_pipeline, 60, what="the job to be mid-pipeline")

        worker.proc.send_signal(signal.SIGTERM)
        # arrives while the worker drains
        waiting = enqueue_tiny_job(settings, store, TARGET, "graceful-2", seed=2, tenant="deploy")
        exit_code = worker.proc.wait(timeout=60)

        log = worker.output()
        assert exit_code == 0, log[-3000:]
        finished = store.get(running)
        assert finished is not None and finished.status == "succeeded", (finished, log[-3000:])
        assert finished.attempt == 1  # finished by the run SIGTERM interrupted, not a retry
        untouched = store.get(waiting)
        assert untouched is not None and untouched.status == "queued" and untouched.attempt == 0
        assert store.workers() == []  # the heartbeat is withdrawn on the way out
    finally:
        worker.stop()
        store.close()


def test_api_drains_an_upload_in_flight_on_sigterm(tmp_path: Path) -> None:
    server = ThreadedServer(create_app(fast_settings(tmp_path)))
    boundary = "deploy-drain-boundary"
    model = tiny_model(seed=3)
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="model"; filename="m.onnx"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    half, release = threading.Event(), threading.Event()

    def body() -> Iterator[bytes]:
        yield head + model[: len(model) // 2]
        half.set()
        release.wait(30)
        yield model[len(model) // 2 :] + f"\r\n--{boundary}--\r\n".encode()

    answers: list[httpx.Response | BaseException] = []

    def upload() -> None:
        try:
            headers = {**auth(), "Content-Type": f"multipart/form-data; boundary={boundary}"}
            answers.append(httpx.post(f"{server.base}/fuse", content=body(), headers=headers, timeout=30))
        except BaseException as exc:  # reported by the assertion below
            answers.append(exc)

    client = threading.Thread(target=upload)
    client.start()
    try:
        assert half.wait(30), "the upload never started"
        server.server.handle_exit(signal.SIGTERM, None)  # what uvicorn's SIGTERM handler does

        def refused() -> bool:
            try:
                httpx.get(f"{server.base}/healthz", timeout=1)
            except httpx.TransportError:
                return True
            return False

        wait_for(refused, 10, what="the API to stop accepting connections")
        time.sleep(DRAIN_WAIT_S)  # a server that gave up on in-flight requests would have by now
        assert server.thread.is_alive(), "uvicorn exited with a request in flight"
        release.set()
        client.join(30)
        (answer,) = answers
        assert isinstance(answer, httpx.Response), answer
        assert answer.status_code == 202, answer.text
        server.thread.join(10)
        assert not server.thread.is_alive(), "uvicorn did not exit after draining"
    finally:
        release.set()
        server.stop()
