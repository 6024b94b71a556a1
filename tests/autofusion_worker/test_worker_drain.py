"""A worker told to stop (SIGTERM) in embedded mode (kombu's file-system broker, SQLite store):
it finishes the job it runs, takes no new one, and stops counting as live at once.

The Redis broker's variant of this is tests/deploy/test_graceful_shutdown.py; the file-system
transport polls for messages, so a consumer that is not cancelled would take the next job as soon as
the running one is acknowledged — and `autofusion serve` would then kill it mid-run.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from harness import fast_settings, start_worker, subprocess_env, tiny_model, wait_for

import graph_autofusion as gaf
from autofusion_service.blobs import BlobStore
from autofusion_service.settings import Settings
from autofusion_service.store import JobRecord, JobStore, open_store
from autofusion_service.store.records import new_job_id
from autofusion_worker.queue import JobQueue

pytestmark = pytest.mark.integration
TARGET = "ascend910"  # plans and exports only: no compiler in the way
STAGE_DELAY_S = 0.4


def _submit(settings: Settings, store: JobStore, queue: JobQueue, seed: int) -> str:
    digest, size = BlobStore(settings.blob_dir).put(tiny_model(seed=seed))
    job, created = store.submit(
        JobRecord(
            id=new_job_id(),
            tenant="t",
            job_key=f"drain-{seed}",
            target=TARGET,
            config={},
            model_digest=digest,
            model_size=size,
            model_filename="m.onnx",
            engine_version=gaf.__version__,
        )
    )
    assert created
    queue.publish(job.id, TARGET)
    return job.id


def test_a_draining_embedded_worker_takes_no_new_job(tmp_path: Path) -> None:
    settings = fast_settings(tmp_path, debug_stage_delay=STAGE_DELAY_S)
    assert settings.embedded
    env = subprocess_env(AUTOFUSION_DATA_DIR=str(tmp_path), AUTOFUSION_DEBUG_STAGE_DELAY=str(STAGE_DELAY_S))
    store, queue = open_store(settings), JobQueue(settings)
    worker = start_worker(env, tmp_path / "worker.log", targets=TARGET)
    try:
        wait_for(store.workers, 60, 0.1, what="the worker's heartbeat")
        running = _submit(settings, store, queue, seed=1)

        def mid_pipeline() -> bool:
            job = store.get(running)
            return job is not None and job.status == "running" and job.stage is not None

        wait_for(mid_pipeline, 60, what="the job to be mid-pipeline")
        waiting = _submit(settings, store, queue, seed=2)  # queued behind the running one
        worker.proc.send_signal(signal.SIGTERM)
        # draining: no longer offered as live to /readyz and /targets, long before it exits
        wait_for(lambda: store.workers() == [], 2 * STAGE_DELAY_S + 1, what="the heartbeat withdrawn")
        assert worker.alive() and store.get(running).status == "running"

        exit_code = worker.proc.wait(timeout=60)
        log = worker.output()
        assert exit_code == 0, log[-3000:]
        finished = store.get(running)
        assert finished is not None and finished.status == "succeeded", (finished, log[-3000:])
        assert finished.attempt == 1
        time.sleep(0.5)  # a message taken during the shutdown would show as a claim by now
        untouched = store.get(waiting)
        assert untouched is not None and untouched.status == "queued" and untouched.attempt == 0, log[-3000:]
    finally:
        worker.stop()
        queue.close()
        store.close()
