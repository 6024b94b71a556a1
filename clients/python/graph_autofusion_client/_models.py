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
    kernels: ArtifactRef | None = None  # Triton targets: the kernel manifest (JSON)


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


class BeforeAfter(_Resource):
    """A quantity without fusion (``before``) and with it (``after``)."""

    before: float | int | None = None
    after: float | int | None = None

    @property
    def ratio(self) -> float | None:
        """``before / after`` (e.g. the estimated speedup for latency), when both are known."""
        if not self.before or not self.after:
            return None
        return self.before / self.after


class OperatorCounts(_Resource):
    original: int | None = None
    canonical: int | None = Field(default=None, description="After canonicalization (folding, DCE).")


class Objective(_Resource):
    name: str | None = None
    value: float | None = None


class Estimates(_Resource):
    """What the cost model predicts fusion buys on the hardware ``profile``."""

    profile: str | None = None
    bytes_moved: BeforeAfter = Field(default_factory=BeforeAfter)
    peak_memory_bytes: BeforeAfter = Field(default_factory=BeforeAfter)
    latency_us: BeforeAfter = Field(default_factory=BeforeAfter)
    objective: Objective | None = None

    @property
    def speedup(self) -> float | None:
        return self.latency_us.ratio


class FusedGroup(_Resource):
    """One fused kernel: which pattern formed it and which original nodes it holds."""

    name: str | None = None
    pattern: str | None = None
    template: str | None = None
    members: list[str] = Field(default_factory=list)
    op_types: list[str] = Field(default_factory=list)
    inputs: list[str] = Field(default_factory=list)
    outputs: list[str] = Field(default_factory=list)
    bytes: int | None = None
    bytes_saved: int | None = None
    flops: int | None = None
    estimated_us: float | None = None


class RefusedCandidate(_Resource):
    """A fusion the planner considered and declined, with its stable reason code (``NF00x``)."""

    code: str
    reason: str | None = Field(default=None, description="The code's title, e.g. 'would create a cycle'.")
    detail: str | None = None
    source: str | None = Field(default=None, description="'pattern:<name>' or 'strategy:<name>'.")
    groups: list[list[str]] = Field(default_factory=list, description="Node names of each group involved.")


class PatternStats(_Resource):
    matched: int = 0
    applied: int = 0
    refused: int = 0


class Report(_Resource):
    """Statistics and decisions of a finished job (``GET /jobs/{id}/report``).

    The engine's report is typed where a pipeline is likely to read it (counts, groups, refusals,
    estimates); every other section (``canonicalize``, ``compile``, ``verification``, …) is kept as
    plain JSON in ``model_extra``, so a newer engine never breaks an older client.
    """

    operators: OperatorCounts = Field(default_factory=OperatorCounts)
    kernels: BeforeAfter = Field(default_factory=BeforeAfter)
    fusions: int | None = None
    groups: list[FusedGroup] = Field(default_factory=list)
    refused: list[RefusedCandidate] = Field(default_factory=list)
    refused_by_code: dict[str, int] = Field(default_factory=dict)
    estimates: Estimates = Field(default_factory=Estimates)
    strategy: str | None = None
    templates: dict[str, int] = Field(default_factory=dict)
    patterns: dict[str, PatternStats] = Field(default_factory=dict)
    timings_ms: dict[str, float] = Field(default_factory=dict)

    def refusals(self) -> dict[str, int]:
        """How many candidates each reason code refused — answers "why was this not fused"."""
        if self.refused_by_code:
            return dict(self.refused_by_code)
        counts: dict[str, int] = {}
        for candidate in self.refused:
            counts[candidate.code] = counts.get(candidate.code, 0) + 1
        return counts
