"""The queue contract between the API and the workers, and publishing a job.

The contract is three facts: the task's name (`FUSE_TASK`), the queue of a target (`fuse.<target>`),
and where the broker is (`broker_options`). Both sides build their Celery apps from them; the API's
app is a bare producer that sends the task *by name* (`send_task`), as Celery's producers do, so it
imports none of the worker's code. A message carries only the job id — the job store holds the rest.

Embedded mode uses kombu's file-system transport in `<data_dir>/broker`: no extra dependency or
daemon, messages are files renamed atomically into a private folder when taken (so two consumers
never take the same one), and they survive restarts of both processes.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from .files import private_dir
from .settings import Settings

FUSE_TASK = "autofusion.fuse"


def queue_name(target: str) -> str:
    return f"fuse.{target}"


def broker_options(settings: Settings) -> tuple[str, dict[str, Any]]:
    """The broker URL and transport options of these settings (Redis, or the embedded file broker)."""
    if settings.redis_url:
        return settings.redis_url, {"visibility_timeout": settings.visibility_timeout}
    root = private_dir(settings.data_dir / "broker")
    folders = {name: root / name for name in ("queue", "processed", "control")}
    for folder in folders.values():
        private_dir(folder)
    return "filesystem://", {
        "data_folder_in": str(folders["queue"]),
        "data_folder_out": str(folders["queue"]),
        "processed_folder": str(folders["processed"]),
        "control_folder": str(folders["control"]),
        "store_processed": False,
        "polling_interval": settings.broker_poll_interval,
    }


def base_config(settings: Settings) -> dict[str, Any]:
    """Celery configuration both sides share: the broker, JSON only, no result backend."""
    url, transport_options = broker_options(settings)
    return {
        "broker_url": url,
        "broker_transport_options": transport_options,
        "broker_connection_retry_on_startup": True,
        "result_backend": None,
        "task_ignore_result": True,
        "task_serializer": "json",
        "accept_content": ["json"],
        "task_create_missing_queues": True,
        "task_default_queue": queue_name("cpu"),
    }


class JobQueue:
    """Sends `fuse(job_id)` to the queue of the job's target, by task name."""

    def __init__(self, settings: Settings, app: Celery | None = None) -> None:
        if app is None:
            app = Celery("autofusion-producer", set_as_current=False)
            app.conf.update(base_config(settings))
        self.app = app

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
