"""The HTTP representations (response models) of the API, and the mapping from job records to them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field

from autofusion_core.store.records import JobRecord, JobStatus

from .problems import Problem, problem_body


def iso(ts: float | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, tz=UTC)


class Progress(BaseModel):
    done: int
    total: int


class ModelInfo(BaseModel):
    digest: str = Field(description="sha256 of the submitted model bytes.")
    size: int
    filename: str


class ArtifactInfo(BaseModel):
    digest: str
    size: int


class Artifacts(BaseModel):
    model: ArtifactInfo | None = None
    bundle: ArtifactInfo | None = None
    kernels: ArtifactInfo | None = Field(
        None,
        description="Triton targets: the kernel manifest (JSON: launch metadata of every kernel; each "
        "kernel file, source or cubin, named by the digest it is served under at `/artifacts/{digest}`).",
    )


class Links(BaseModel):
    self: str
    report: str
    model: str
    bundle: str
    cancel: str


class Job(BaseModel):
    """A fusion job as its tenant sees it."""

    id: str
    status: JobStatus
    stage: str | None = Field(
        description="Current or last pipeline stage (`loading`, `canonicalizing`, `planning`, `exporting`, "
        "`compiling`, `verifying`, `packaging`); `waiting_for_worker` while queued for a target no live "
        "worker serves."
    )
    progress: Progress | None
    target: str
    config: dict[str, Any] = Field(description="The submitted config, echoed back.")
    model: ModelInfo
    attempt: int = Field(description="How many times a worker started this job.")
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime
    error: Problem | None
    links: Links
    artifacts: Artifacts


class JobList(BaseModel):
    items: list[Job]
    next_cursor: str | None


class TargetInfo(BaseModel):
    name: str
    workers: int
    last_seen: datetime
    description: str = Field("", description="What a job for this target does.")
    compiles: bool = Field(
        False, description="Whether its workers compile and verify kernels (else plan and export only)."
    )
    backend: str | None = Field(None, description="The kernel backend: `c` or `triton`; null: plan only.")
    toolchain: str = Field("", description="What a worker host of this target needs installed.")
    device: str = Field("", description="Where its kernels run (checked when a worker starts).")
    modes: dict[str, int] = Field(
        default_factory=dict,
        description="Live workers by where they run the kernels: `device`, or `interpret` (Triton's CPU "
        "interpreter, `autofusion worker --interpret`: for CI, not production).",
    )


class TargetList(BaseModel):
    targets: list[TargetInfo]


class PatternInfo(BaseModel):
    name: str
    description: str


class PatternList(BaseModel):
    patterns: list[PatternInfo]


class Health(BaseModel):
    status: str
    version: str


class Readiness(BaseModel):
    status: str
    store: bool
    broker: bool
    workers: int


def job_view(record: JobRecord, *, waiting: bool = False) -> Job:
    base = f"/jobs/{record.id}"
    progress = None
    if record.progress_total is not None and record.progress_done is not None:
        progress = Progress(done=record.progress_done, total=record.progress_total)
    error = None
    if record.error is not None:
        extras = {k: v for k, v in record.error.items() if k not in ("code", "status", "detail", "title")}
        error = Problem.model_validate(
            problem_body(
                str(record.error.get("code", "job_failed")),
                int(record.error.get("status", 422)),
                str(record.error.get("detail", "")),
                title=record.error.get("title"),
                instance=base,
                **extras,
            )
        )
    stage = "waiting_for_worker" if waiting and record.status == "queued" else record.stage

    def art(a: Any) -> ArtifactInfo | None:
        return None if a is None else ArtifactInfo(digest=a.digest, size=a.size)

    return Job(
        id=record.id,
        status=record.status,
        stage=stage,
        progress=progress,
        target=record.target,
        config=record.config,
        model=ModelInfo(digest=record.model_digest, size=record.model_size, filename=record.model_filename),
        attempt=record.attempt,
        created_at=iso(record.created_at),
        started_at=iso(record.started_at),
        finished_at=iso(record.finished_at),
        updated_at=iso(record.updated_at),
        error=error,
        links=Links(
            self=base,
            report=f"{base}/report",
            model=f"{base}/model",
            bundle=f"{base}/bundle",
            cancel=f"{base}/cancel",
        ),
        artifacts=Artifacts(
            model=art(record.model_artifact),
            bundle=art(record.bundle_artifact),
            kernels=art(record.kernels_artifact),
        ),
    )
