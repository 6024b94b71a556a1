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
from harness import enqueue_tiny_job, fast_settings, start_worker, subprocess_env, wait_for

from autofusion_core.store import open_store

pytestmark = pytest.mark.integration
TARGET = "ascend910"  # Triton kernels in the interpreter (harness.FAST_ENV): no C compiler in the way
STAGE_DELAY_S = 0.4


def test_a_draining_embedded_worker_takes_no_new_job(tmp_path: Path) -> None:
    settings = fast_settings(tmp_path, debug_stage_delay=STAGE_DELAY_S)
    assert settings.embedded
    env = subprocess_env(AUTOFUSION_DATA_DIR=str(tmp_path), AUTOFUSION_DEBUG_STAGE_DELAY=str(STAGE_DELAY_S))
    store = open_store(settings)
    worker = start_worker(env, tmp_path / "worker.log", targets=TARGET)
    try:
        wait_for(store.workers, 60, 0.1, what="the worker's heartbeat")
        running = enqueue_tiny_job(settings, store, TARGET, "drain-1", seed=1)

        def mid_pipeline() -> bool:
            job = store.get(running)
            return job is not None and job.status == "running" and job.stage is not None

        wait_for(mid_pipeline, 60, what="the job to be mid-pipeline")
        # queued behind the running one
        waiting = enqueue_tiny_job(settings, store, TARGET, "drain-2", seed=2)
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
        store.close()
