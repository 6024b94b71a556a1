"""Workers of the fusion service: the Celery app, the fuse task and the pipeline it runs.

A worker process serves the queues `fuse.<target>` of the targets its host can compile for, claims
jobs through the job store's leases, runs `autofusion_worker.pipeline.run_job`, and keeps a
heartbeat (with its targets) and a lease sweep going in the background.
"""

from __future__ import annotations

from .app import FUSE_TASK, make_celery, queue_name
from .targets import TARGETS, Target, get_target

__all__ = ["FUSE_TASK", "TARGETS", "Target", "get_target", "make_celery", "queue_name"]
