"""The fuse task: a plain function of a job id, registered on the Celery app in `app.py`.

It only finds this process's storage handles and hands over to the pipeline; everything a run does
is in `pipeline.py` so that the same code runs under Celery, in tests and from a debugger.
"""

from __future__ import annotations

import os
from functools import cache

from autofusion_core.blobs import BlobStore
from autofusion_core.settings import Settings
from autofusion_core.store import open_store

from .pipeline import JobContext, run_job


@cache
def _context(pid: int) -> JobContext:
    settings = Settings()
    return JobContext(settings=settings, store=open_store(settings), blobs=BlobStore(settings.blob_dir))


def fuse(job_id: str) -> None:
    """Run job `job_id` if it can be claimed; a message for a finished or owned job is dropped."""
    run_job(job_id, _context(os.getpid()))
