"""The job record as the job store keeps it: everything the API shows plus the worker's lease.

Times are POSIX seconds here (cheap to compare in lease checks); the HTTP schemas turn them into
ISO 8601. The record is plain pydantic so both store backends serialize it the same way.
"""

from __future__ import annotations

import os
import secrets
import time
from typing import Any, Literal

from pydantic import BaseModel, Field

JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelling", "cancelled"]
STATUSES: tuple[str, ...] = ("queued", "running", "succeeded", "failed", "cancelling", "cancelled")
TERMINAL: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})


def new_job_id() -> str:
    """A time-ordered id (ms timestamp, then randomness), so ids sort by creation in both stores."""
    return f"{int(time.time() * 1000):012x}{secrets.token_hex(8)}"


class Artifact(BaseModel):
    digest: str
    size: int


class WorkerInfo(BaseModel):
    """A worker's heartbeat: who it is and which targets it serves."""

    id: str
    hostname: str
    pid: int
    targets: list[str]
    concurrency: int = 1
    #: per target, where its kernels run: `device`, or `interpret` (Triton's CPU interpreter)
    modes: dict[str, str] = Field(default_factory=dict)
    last_seen: float


class Lease(BaseModel):
    """Which process runs a job, and until when that claim holds without renewal."""

    owner: str
    hostname: str
    pid: int
    expires_at: float

    @staticmethod
    def for_this_process(owner: str, seconds: float) -> Lease:
        return Lease(
            owner=owner, hostname=os.uname().nodename, pid=os.getpid(), expires_at=time.time() + seconds
        )


class JobRecord(BaseModel):
    id: str
    tenant: str
    job_key: str
    status: JobStatus = "queued"
    stage: str | None = None
    progress_done: int | None = None
    progress_total: int | None = None
    target: str
    config: dict[str, Any]
    model_digest: str
    model_size: int
    model_filename: str
    engine_version: str
    attempt: int = 0
    created_at: float = Field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    updated_at: float = Field(default_factory=time.time)
    error: dict[str, Any] | None = None
    model_artifact: Artifact | None = None
    bundle_artifact: Artifact | None = None
    report_artifact: Artifact | None = None
    #: Triton targets: the kernel manifest (launch metadata; each kernel file named by its digest)
    kernels_artifact: Artifact | None = None
    #: the kernel files that manifest names (sources, cubins), each a blob of its own
    kernel_files: list[Artifact] = Field(default_factory=list)
    lease: Lease | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def artifact_digests(self) -> list[str]:
        found = (self.model_artifact, self.bundle_artifact, self.report_artifact, self.kernels_artifact)
        return [a.digest for a in (*found, *self.kernel_files) if a is not None]
