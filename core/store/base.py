"""The job store interface: the source of truth for jobs, leases, worker heartbeats and counters.

Two backends implement a handful of atomic primitives (`_insert_unless_live`, `_update`, lookups);
every state transition — submit, claim, progress, finish, cancel, sweep — is written once here as a
pure function over a `JobRecord` and applied through `_update`, so Redis and SQLite cannot drift
apart in behaviour. Celery only carries job ids; whatever Celery redelivers, these transitions
decide whether a run may start (`claim`) and whether its results count (`finish` checks the lease).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable

from .records import STATUSES, Artifact, JobRecord, Lease, WorkerInfo

#: Upper bounds of the stage-duration histogram, seconds.
STAGE_BUCKETS: tuple[float, ...] = (
    0.01,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    1800.0,
)

#: A failed job with one of these codes says nothing about the model, so resubmitting runs it again.
RETRYABLE_FAILURES: frozenset[str] = frozenset({"broker_unavailable"})


def counter_key(name: str, **labels: str) -> str:
    """Counters are flat `name|label=value|...` keys so both backends can keep them in one map."""
    return "|".join([name, *(f"{k}={labels[k]}" for k in sorted(labels))])


def parse_counter_key(key: str) -> tuple[str, dict[str, str]]:
    name, *pairs = key.split("|")
    return name, dict(pair.split("=", 1) for pair in pairs)


def _is_live(record: JobRecord) -> bool:
    """Whether a resubmission of the same job should return this record instead of a new job."""
    if record.status == "cancelled":
        return False
    return not (record.status == "failed" and (record.error or {}).get("code") in RETRYABLE_FAILURES)


class JobStore(ABC):
    """Atomic job state transitions over a backend (Redis or SQLite)."""

    # --- backend primitives -------------------------------------------------------------------

    @abstractmethod
    def _insert_unless_live(
        self, record: JobRecord, is_live: Callable[[JobRecord], bool]
    ) -> tuple[JobRecord, bool]:
        """Atomically: if (tenant, job_key) names a job for which `is_live` holds, return it and False;
        otherwise insert `record`, point (tenant, job_key) at it and return it and True."""

    @abstractmethod
    def _update(self, job_id: str, change: Callable[[JobRecord], JobRecord | None]) -> JobRecord | None:
        """Atomically apply `change` to a copy of the record; `None` from it means no change.
        Returns the written record, or None if the job is unknown or nothing changed."""

    @abstractmethod
    def get(self, job_id: str) -> JobRecord | None: ...

    @abstractmethod
    def get_raw(self, job_id: str) -> str | None:
        """The record's stored JSON, unparsed: status polls answer from a cache keyed by it."""

    @abstractmethod
    def list_jobs(self, tenant: str, cursor: str | None, limit: int) -> tuple[list[JobRecord], str | None]:
        """The tenant's jobs, newest first, starting after `cursor` (an id); returns the next cursor."""

    @abstractmethod
    def ids_by_status(self, status: str) -> list[str]: ...

    @abstractmethod
    def count_by_status(self) -> dict[str, int]: ...

    @abstractmethod
    def queued_by_target(self) -> dict[str, int]: ...

    @abstractmethod
    def heartbeat(self, worker: WorkerInfo, ttl: float) -> None: ...

    @abstractmethod
    def remove_worker(self, worker_id: str) -> None: ...

    @abstractmethod
    def workers(self) -> list[WorkerInfo]:
        """Workers whose heartbeat has not expired."""

    @abstractmethod
    def incr(self, amounts: dict[str, float]) -> None: ...

    @abstractmethod
    def counters(self) -> dict[str, float]: ...

    @abstractmethod
    def grant(self, tenant: str, digests: Iterable[str]) -> None:
        """Record that `tenant` may download these blobs."""

    @abstractmethod
    def owns(self, tenant: str, digest: str) -> bool: ...

    @abstractmethod
    def ping(self) -> bool: ...

    @abstractmethod
    def instance_id(self) -> str:
        """An id of the backend's running instance, which changes when it restarts (Redis' `run_id`).
        Workers compare it between heartbeats: a broker that restarted between two of them may have
        left their consumer on a dead connection. Raises when the backend is unreachable."""

    @abstractmethod
    def close(self) -> None: ...

    # --- transitions --------------------------------------------------------------------------

    def submit(self, record: JobRecord) -> tuple[JobRecord, bool]:
        """Create the job unless the tenant already has a live one with the same key.

        Jobs and their reuse are per tenant: another tenant's identical job is never returned or
        copied, so whether, when and how a submission runs says nothing about other tenants."""
        job, created = self._insert_unless_live(record, _is_live)
        if created:
            self.grant(record.tenant, [record.model_digest])
        return job, created

    def claim(self, job_id: str, lease: Lease, max_attempts: int) -> JobRecord | None:
        """Start a run if the job is waiting (or its previous run's lease lapsed); None otherwise."""

        def change(r: JobRecord) -> JobRecord | None:
            now = time.time()
            if r.status == "cancelling" and (r.lease is None or r.lease.expires_at < now):
                return _finished(r, "cancelled", now)
            expired = r.status == "running" and (r.lease is None or r.lease.expires_at < now)
            if not (r.status == "queued" or expired):
                return None
            if r.attempt >= max_attempts:
                return _finished(r, "failed", now, error=worker_crashed(r.attempt))
            return r.model_copy(
                update={
                    "status": "running",
                    "attempt": r.attempt + 1,
                    "lease": lease,
                    "started_at": r.started_at or now,
                    "updated_at": now,
                    "stage": None,
                    "progress_done": None,
                    "progress_total": None,
                }
            )

        job = self._update(job_id, change)
        if job is None or job.status != "running" or job.lease != lease:
            return None
        return job

    def report_progress(
        self,
        job_id: str,
        owner: str,
        lease_seconds: float,
        stage: str | None = None,
        done: int | None = None,
        total: int | None = None,
    ) -> JobRecord | None:
        """Renew the lease (and record progress when given). None means the lease is no longer ours."""

        def change(r: JobRecord) -> JobRecord | None:
            if r.lease is None or r.lease.owner != owner or r.status not in ("running", "cancelling"):
                return None
            now = time.time()
            update: dict[str, object] = {
                "lease": r.lease.model_copy(update={"expires_at": now + lease_seconds}),
                "updated_at": now,
            }
            if stage is not None:
                update.update(stage=stage, progress_done=done, progress_total=total)
            return r.model_copy(update=update)

        return self._update(job_id, change)

    def finish(
        self,
        job_id: str,
        owner: str,
        status: str,
        *,
        error: dict | None = None,
        artifacts: dict[str, Artifact] | None = None,
        kernel_files: list[Artifact] | None = None,
    ) -> JobRecord | None:
        """End a run that still holds its lease. A run that lost its lease changes nothing.
        `artifacts` by name (`model`, `bundle`, `report`, `kernels`); `kernel_files`, the blobs the
        kernel manifest names. A succeeded job's tenant may download all of them."""

        def change(r: JobRecord) -> JobRecord | None:
            if r.lease is None or r.lease.owner != owner or r.status not in ("running", "cancelling"):
                return None
            final = "cancelled" if r.status == "cancelling" and status != "succeeded" else status
            # A failed or cancelled job keeps the stage it stopped in; a succeeded one has none left.
            done = (
                {"stage": None, "progress_done": None, "progress_total": None} if final == "succeeded" else {}
            )
            if final == "succeeded" and kernel_files:
                done["kernel_files"] = list(kernel_files)
            return _finished(
                r, final, time.time(), error=error if final == "failed" else None, **_arts(artifacts), **done
            )

        job = self._update(job_id, change)
        if job is not None and job.status == "succeeded":
            self.grant(job.tenant, job.artifact_digests())
        return job

    def fail(self, job_id: str, error: dict) -> JobRecord | None:
        """Fail a job that is not running (e.g. its message could not be published)."""

        def change(r: JobRecord) -> JobRecord | None:
            if r.status != "queued":
                return None
            return _finished(r, "failed", time.time(), error=error)

        return self._update(job_id, change)

    def request_cancel(self, job_id: str) -> JobRecord | None:
        """A queued job is cancelled at once; a running one is asked to stop (`cancelling`)."""

        def change(r: JobRecord) -> JobRecord | None:
            now = time.time()
            if r.status == "queued":
                return _finished(r, "cancelled", now)
            if r.status == "running":
                return r.model_copy(update={"status": "cancelling", "updated_at": now})
            return None

        self._update(job_id, change)
        return self.get(job_id)

    def sweep(self, max_attempts: int, stale_after: float | None = None) -> list[JobRecord]:
        """Handle runs whose lease lapsed: requeue them (returned: the caller republishes),
        fail them as `worker_crashed` after `max_attempts` runs, or finish a pending cancel.

        With `stale_after`, jobs queued untouched for that long are returned too (and touched):
        their message may have been lost by a worker that died between taking it and claiming the
        job, which a broker without redelivery (the embedded one) would never repair. A duplicate
        message is harmless — `claim` runs a job once."""
        requeued: list[JobRecord] = []
        if stale_after is not None:
            for job_id in self.ids_by_status("queued"):

                def touch(r: JobRecord) -> JobRecord | None:
                    now = time.time()
                    if r.status != "queued" or r.updated_at > now - stale_after:
                        return None
                    return r.model_copy(update={"updated_at": now})

                job = self._update(job_id, touch)
                if job is not None:
                    requeued.append(job)
        for status in ("running", "cancelling"):
            for job_id in self.ids_by_status(status):

                def change(r: JobRecord) -> JobRecord | None:
                    now = time.time()
                    if r.status not in ("running", "cancelling") or (r.lease and r.lease.expires_at >= now):
                        return None
                    if r.status == "cancelling":
                        return _finished(r, "cancelled", now)
                    if r.attempt >= max_attempts:
                        return _finished(r, "failed", now, error=worker_crashed(r.attempt))
                    return r.model_copy(
                        update={"status": "queued", "lease": None, "updated_at": now, "stage": None}
                    )

                job = self._update(job_id, change)
                if job is not None and job.status == "queued":
                    requeued.append(job)
        return requeued

    def observe(
        self, name: str, value: float, buckets: tuple[float, ...] = STAGE_BUCKETS, **labels: str
    ) -> None:
        """Add one observation to a stored histogram (cumulative buckets, `_sum` and `_count`)."""
        amounts = {counter_key(f"{name}_bucket", le=_fmt(b), **labels): 1.0 for b in buckets if value <= b}
        amounts[counter_key(f"{name}_bucket", le="+Inf", **labels)] = 1.0
        amounts[counter_key(f"{name}_sum", **labels)] = value
        amounts[counter_key(f"{name}_count", **labels)] = 1.0
        self.incr(amounts)


def _fmt(bound: float) -> str:
    return repr(float(bound))


def _arts(artifacts: dict[str, Artifact] | None) -> dict[str, Artifact]:
    return {f"{name}_artifact": art for name, art in (artifacts or {}).items()}


def _finished(r: JobRecord, status: str, now: float, error: dict | None = None, **extra: object) -> JobRecord:
    return r.model_copy(
        update={
            "status": status,
            "finished_at": now,
            "updated_at": now,
            "lease": None,
            "error": error,
            **extra,
        }
    )


def worker_crashed(attempts: int) -> dict:
    return {
        "code": "worker_crashed",
        "status": 500,
        "title": "The worker running this job died",
        "detail": f"the process running this job died {attempts} time(s) (killed, out of memory, or over "
        "the hard time limit); the job is not retried again",
        "attempts": attempts,
    }


__all__ = ["STATUSES", "JobStore"]
