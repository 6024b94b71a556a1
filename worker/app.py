"""The worker's Celery app and all of its configuration, built from the shared settings.

Delivery guarantees come from the job store (leases, attempts, the sweep); Celery is configured so
it never works against them: late acknowledgement and one prefetched message per process (a dying
worker hands its message back), `task_reject_on_worker_lost` (a killed child's message is requeued),
soft < hard time limit < visibility timeout (Redis never redelivers a job that may still run), no
result backend (the job store holds results), and no remote control or events (heartbeats live in
the job store, which also works for the embedded file-system broker). The broker and the task name
are the shared queue contract (`autofusion_core.queue`); the API publishes by that name alone.
"""

from __future__ import annotations

from celery import Celery
from kombu import Queue

from autofusion_core.queue import FUSE_TASK, base_config, queue_name
from autofusion_core.settings import Settings


def make_celery(settings: Settings, targets: list[str] | None = None) -> Celery:
    """A Celery app for these settings; `targets` declares the queues a worker consumes."""
    app = Celery("autofusion", set_as_current=False)
    app.conf.update(base_config(settings))
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=1,
        task_soft_time_limit=settings.soft_time_limit,
        task_time_limit=settings.hard_time_limit,
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
