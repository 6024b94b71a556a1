"""Publishing jobs: the only thing the API and the sweep send to the broker is a job id."""

from __future__ import annotations

from celery import Celery

from autofusion_service.settings import Settings

from .app import FUSE_TASK, make_celery, queue_name


class JobQueue:
    """Sends `fuse(job_id)` to the queue of the job's target."""

    def __init__(self, settings: Settings, app: Celery | None = None) -> None:
        self.app = app or make_celery(settings)

    def publish(self, job_id: str, target: str) -> None:
        self.app.send_task(
            FUSE_TASK,
            args=[job_id],
            queue=queue_name(target),
            routing_key=queue_name(target),
            retry=True,
            retry_policy={"max_retries": 3, "interval_start": 0.1, "interval_step": 0.5, "interval_max": 2},
        )

    def ping(self) -> bool:
        try:
            with self.app.connection_for_write() as conn:
                conn.ensure_connection(max_retries=1, timeout=2)
        except Exception:
            return False
        return True

    def close(self) -> None:
        self.app.close()
