"""Handles on a service job: its last known state plus the client that can act on it.

A pipeline keeps only ``job.id`` between steps and reattaches with ``client.get_job(id)``; the handle
itself is cheap and holds no connection. `Job` and `AsyncJob` expose the same state properties
(from `_JobView`) and the same methods, the async ones being coroutines.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._exceptions import JobCancelledError, JobFailedError
from ._models import Artifacts, JobState, JobStatus, Links, ModelInfo, Problem, Progress, Report

if TYPE_CHECKING:
    from ._client import AsyncClient, Client

ProgressCallback = Callable[["Job"], object]
AsyncProgressCallback = Callable[["AsyncJob"], object | Awaitable[object]]


class _JobView:
    """Read-only access to the last state fetched from the service."""

    def __init__(self, state: JobState) -> None:
        self.state = state

    @property
    def id(self) -> str:
        return self.state.id

    @property
    def status(self) -> JobStatus:
        return self.state.status

    @property
    def stage(self) -> str | None:
        return self.state.stage

    @property
    def progress(self) -> Progress | None:
        return self.state.progress

    @property
    def target(self) -> str:
        return self.state.target

    @property
    def config(self) -> dict[str, Any]:
        return self.state.config

    @property
    def model(self) -> ModelInfo | None:
        return self.state.model

    @property
    def attempt(self) -> int:
        return self.state.attempt

    @property
    def created_at(self) -> datetime | None:
        return self.state.created_at

    @property
    def started_at(self) -> datetime | None:
        return self.state.started_at

    @property
    def finished_at(self) -> datetime | None:
        return self.state.finished_at

    @property
    def updated_at(self) -> datetime | None:
        return self.state.updated_at

    @property
    def error(self) -> Problem | None:
        return self.state.error

    @property
    def links(self) -> Links:
        return self.state.links

    @property
    def artifacts(self) -> Artifacts:
        return self.state.artifacts

    @property
    def is_terminal(self) -> bool:
        return self.state.is_terminal

    def raise_for_status(self) -> None:
        """Raise `JobFailedError` (or `JobCancelledError`) unless the job succeeded or is still going."""
        if self.state.status is JobStatus.FAILED:
            raise JobFailedError(self.state)
        if self.state.status is JobStatus.CANCELLED:
            raise JobCancelledError(self.state)

    def to_dict(self) -> dict[str, Any]:
        return self.state.model_dump(mode="json", by_alias=True)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.state == self.state  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        stage = f" stage={self.stage!r}" if self.stage else ""
        return f"<{type(self).__name__} {self.id} {self.status.value}{stage}>"


class Job(_JobView):
    """A job bound to a `Client`; every method talks to the service synchronously."""

    def __init__(self, client: Client, state: JobState) -> None:
        super().__init__(state)
        self._client = client

    def refresh(self) -> Job:
        """Fetch the current state (in place) and return self."""
        self.state = self._client.get_job(self.id).state
        return self

    def wait(self, timeout: float | None = None, on_progress: ProgressCallback | None = None) -> Job:
        """Poll until the job is terminal; ``on_progress(job)`` runs whenever status/stage/progress moved.

        Returns the job in whatever terminal state it reached (call `raise_for_status` to turn failure
        into an exception); raises `WaitTimeoutError` after ``timeout`` seconds.
        """
        self._client.wait(self, timeout=timeout, on_progress=on_progress)
        return self

    def cancel(self) -> Job:
        self.state = self._client.cancel(self.id).state
        return self

    def report(self) -> Report:
        return self._client.report(self.id)

    def download_model(self, path: str | os.PathLike[str]) -> Path:
        return self._client.download_model(self, path)

    def download_bundle(self, path: str | os.PathLike[str]) -> Path:
        return self._client.download_bundle(self, path)


class AsyncJob(_JobView):
    """A job bound to an `AsyncClient`; the same methods as `Job`, as coroutines."""

    def __init__(self, client: AsyncClient, state: JobState) -> None:
        super().__init__(state)
        self._client = client

    async def refresh(self) -> AsyncJob:
        self.state = (await self._client.get_job(self.id)).state
        return self

    async def wait(
        self, timeout: float | None = None, on_progress: AsyncProgressCallback | None = None
    ) -> AsyncJob:
        await self._client.wait(self, timeout=timeout, on_progress=on_progress)
        return self

    async def cancel(self) -> AsyncJob:
        self.state = (await self._client.cancel(self.id)).state
        return self

    async def report(self) -> Report:
        return await self._client.report(self.id)

    async def download_model(self, path: str | os.PathLike[str]) -> Path:
        return await self._client.download_model(self, path)

    async def download_bundle(self, path: str | os.PathLike[str]) -> Path:
        return await self._client.download_bundle(self, path)
