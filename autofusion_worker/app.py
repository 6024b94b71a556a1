"""The Celery app and all of its configuration, built from the service settings.

Delivery guarantees come from the job store (leases, attempts, the sweep); Celery is configured so
it never works against them: late acknowledgement and one prefetched message per process (a dying
worker hands its message back), `task_reject_on_worker_lost` (a killed child's message is requeued),
soft < hard time limit < visibility timeout (Redis never redelivers a job that may still run), no
result backend (the job store holds results), and no remote control or events (heartbeats live in
the job store, which also works for the embedded file-system broker).

Embedded mode uses kombu's file-system transport in `<data_dir>/broker`: no extra dependency or
daemon, messages are files renamed atomically into a private folder when taken (so two consumers
never take the same one), and they survive restarts of both processes.
"""

from __future__ import annotations

from celery import Celery
from kombu import Queue

from autofusion_service.settings import Settings

FUSE_TASK = "autofusion.fuse"


def queue_name(target: str) -> str:
    return f"fuse.{target}"


def broker_options(settings: Settings) -> tuple[str, dict]:
    if settings.redis_url:
        return settings.redis_url, {"visibility_timeout": settings.visibility_timeout}
    root = settings.data_dir / "broker"
    folders = {name: root / name for name in ("queue", "processed", "control")}
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    return "filesystem://", {
        "data_folder_in": str(folders["queue"]),
        "data_folder_out": str(folders["queue"]),
        "processed_folder": str(folders["processed"]),
        "control_folder": str(folders["control"]),
        "store_processed": False,
        "polling_interval": settings.broker_poll_interval,
    }


def make_celery(settings: Settings, targets: list[str] | None = None) -> Celery:
    """A Celery app for these settings; `targets` declares the queues a worker consumes."""
    url, transport_options = broker_options(settings)
    app = Celery("autofusion", set_as_current=False)
    app.conf.update(
        broker_url=url,
        broker_transport_options=transport_options,
        broker_connection_retry_on_startup=True,
        result_backend=None,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=1,
        task_soft_time_limit=settings.soft_time_limit,
        task_time_limit=settings.hard_time_limit,
        task_create_missing_queues=True,
        task_default_queue=queue_name("cpu"),
        task_queues=[Queue(queue_name(t), routing_key=queue_name(t)) for t in (targets or ["cpu"])],
        worker_enable_remote_control=False,
        worker_send_task_events=False,
        worker_hijack_root_logger=False,
        worker_concurrency=settings.worker_concurrency,
        worker_cancel_long_running_tasks_on_connection_loss=False,
    )
    from .tasks import fuse

    app.task(name=FUSE_TASK, acks_late=True, reject_on_worker_lost=True)(fuse)
    return app
