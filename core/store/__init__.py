"""Job stores: Redis (distributed) and SQLite (embedded) behind one interface, `JobStore`."""

from __future__ import annotations

from ..settings import Settings
from .base import JobStore
from .records import TERMINAL, Artifact, JobRecord, Lease, WorkerInfo

__all__ = ["TERMINAL", "Artifact", "JobRecord", "JobStore", "Lease", "WorkerInfo", "open_store"]


def open_store(settings: Settings) -> JobStore:
    """The store the settings name: Redis when a URL is configured, else SQLite in the data dir."""
    if settings.redis_url:
        from .redis import RedisJobStore

        return RedisJobStore(settings.redis_url, prefix=settings.redis_prefix)
    from .sqlite import SqliteJobStore

    return SqliteJobStore(settings.data_dir / "jobs.sqlite3")
