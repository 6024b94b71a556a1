"""The service's resources as typed, read-only values.

Every model accepts fields it does not know (``extra="allow"``): a newer service may add fields and an
older client must keep working, so unknown keys are kept (reachable through ``model_extra``) rather
than rejected. Known fields are typed so that a pipeline gets attribute access and editor completion.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Resource(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)


class JobStatus(StrEnum):
    """Lifecycle of a job; ``succeeded``, ``failed`` and ``cancelled`` are terminal."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})


class Problem(_Resource):
    """An RFC 9457 problem object, as the service reports errors (also inside a failed job)."""

    type: str = "about:blank"
    title: str = ""
    status: int | None = None
    detail: str | None = None
    code: str | None = None
    instance: str | None = None


class Progress(_Resource):
    """How far the current stage is, e.g. kernels compiled out of kernels to compile."""

    done: int = 0
    total: int = 0

    @property
    def fraction(self) -> float | None:
        return self.done / self.total if self.total > 0 else None


class ModelInfo(_Resource):
    """The submitted model as the service stored it."""

    digest: str
    size: int
    filename: str | None = None


class ArtifactRef(_Resource):
    """A content-addressed result: its sha256 and size in bytes."""

    digest: str
    size: int


class Artifacts(_Resource):
    model: ArtifactRef | None = None
    bundle: ArtifactRef | None = None


class Links(_Resource):
    """Service-relative URLs of the job's sub-resources."""

    self_: str | None = Field(default=None, alias="self")
    report: str | None = None
    model: str | None = None
    bundle: str | None = None
    cancel: str | None = None


class JobState(_Resource):
    """A snapshot of a fusion job as ``GET /jobs/{id}`` returns it."""

    id: str
    status: JobStatus
    stage: str | None = None
    progress: Progress | None = None
    target: str = "cpu"
    config: dict[str, Any] = Field(default_factory=dict)
    model: ModelInfo | None = None
    attempt: int = 0
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    updated_at: datetime | None = None
    error: Problem | None = None
    links: Links = Field(default_factory=Links)
    artifacts: Artifacts = Field(default_factory=Artifacts)

    @property
    def is_terminal(self) -> bool:
        return self.status.is_terminal


class JobPage(_Resource):
    """One page of ``GET /jobs``; ``next_cursor`` is ``None`` on the last page."""

    items: list[JobState] = Field(default_factory=list)
    next_cursor: str | None = None


class Target(_Resource):
    """A compilation target and the workers currently serving it."""

    name: str
    workers: int = 0
    last_seen: datetime | None = None


class PatternInfo(_Resource):
    """A built-in fusion pattern the service can apply (and a config can disable)."""

    name: str
    description: str = ""


class FusedGroup(_Resource):
    """One fused kernel: which pattern formed it and which original nodes it holds."""

    name: str | None = None
    pattern: str | None = None
    template: str | None = None
    members: list[str] = Field(default_factory=list)


class RefusedCandidate(_Resource):
    """A fusion the planner considered and declined, with its stable reason code (``NF00x``)."""

    code: str | None = None
    reason: str | None = None
    producer: str | None = None
    consumer: str | None = None


class Report(_Resource):
    """Statistics and decisions of a finished job (``GET /jobs/{id}/report``).

    Counts may be plain integers or per-kind breakdowns depending on the engine version, so they are
    typed loosely; ``groups`` and ``refused`` are lists of typed entries; everything else the engine
    adds is kept in ``model_extra``.
    """

    operators: Any = None
    kernels: Any = None
    fusions: Any = None
    groups: list[FusedGroup] | int = Field(default_factory=list)
    refused: list[RefusedCandidate] | int = Field(default_factory=list)
    estimates: dict[str, Any] | Any = Field(default_factory=dict)

    def refused_by_code(self) -> dict[str, int]:
        """How many candidates each reason code refused — answers "why was this not fused"."""
        counts: dict[str, int] = {}
        for candidate in self.refused if isinstance(self.refused, list) else []:
            key = candidate.code or "unknown"
            counts[key] = counts.get(key, 0) + 1
        return counts
