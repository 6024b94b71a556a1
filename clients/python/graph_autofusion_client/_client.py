"""`Client` and `AsyncClient`: the same operations, blocking or as coroutines.

Every operation is a `Call` from `_protocol` (request building, answer parsing, retry and wait
decisions); the classes here own only the I/O: sending with bounded retries, sleeping, streaming a
download to disk. Adding an endpoint means one function in `_protocol` and one thin method in each
class, kept in the same order so the two read side by side.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import httpx

from . import _protocol as proto
from ._config import ConfigLike
from ._exceptions import AutofusionError, ServiceUnavailableError
from ._inputs import ModelLike
from ._job import AsyncJob, AsyncProgressCallback, Job, ProgressCallback
from ._models import JobState, PatternInfo, Report, Target
from ._retry import RetryPolicy
from ._version import __version__

T = TypeVar("T")
JobRef = str | Job | AsyncJob | JobState

ENV_URL = "AUTOFUSION_URL"
ENV_API_KEY = "AUTOFUSION_API_KEY"


class _BaseClient:
    """Settings shared by both clients: where the service is, who we are, how patient to be."""

    def __init__(
        self,
        base_url: str | None,
        api_key: str | None,
        timeout: float | httpx.Timeout,
        retry: RetryPolicy | None,
        headers: Mapping[str, str] | None,
        digest_first_min_bytes: int | None = proto.DIGEST_FIRST_MIN_BYTES,
    ) -> None:
        self.digest_first_min_bytes = digest_first_min_bytes
        url = base_url or os.environ.get(ENV_URL)
        if not url:
            raise ValueError(f"no service URL: pass base_url or set {ENV_URL}")
        self.base_url = httpx.URL(url.rstrip("/") + "/")
        self.api_key = api_key if api_key is not None else os.environ.get(ENV_API_KEY)
        self.timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
        self.retry = retry if retry is not None else RetryPolicy()
        self._headers = {"User-Agent": f"graph-autofusion-client/{__version__}", **(headers or {})}
        if self.api_key:
            self._headers["Authorization"] = f"Bearer {self.api_key}"

    def _http_kwargs(self) -> dict[str, Any]:
        return {"base_url": self.base_url, "headers": self._headers, "timeout": self.timeout}

    @staticmethod
    def _job_id(job: JobRef) -> str:
        return job if isinstance(job, str) else job.id

    @staticmethod
    def _expected(job: JobRef, what: str) -> str | None:
        """The digest the job reported for an artifact, when the caller gave us the job itself."""
        state = job.state if isinstance(job, Job | AsyncJob) else job if isinstance(job, JobState) else None
        ref = getattr(state.artifacts, what, None) if state is not None else None
        return ref.digest if ref is not None else None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.base_url}>"


class Client(_BaseClient):
    """Blocking client. ``base_url``/``api_key`` default to ``$AUTOFUSION_URL``/``$AUTOFUSION_API_KEY``.

    ``digest_first_min_bytes``: models at least this large are submitted by sha256 first and only
    uploaded when the service does not hold them for this tenant (see `submit`); None always uploads.

    Use it as a context manager (or call `close`) to release its connection pool.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = proto.DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        headers: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
        digest_first_min_bytes: int | None = proto.DIGEST_FIRST_MIN_BYTES,
    ) -> None:
        super().__init__(base_url, api_key, timeout, retry, headers, digest_first_min_bytes)
        self._http = httpx.Client(transport=transport, **self._http_kwargs())

    # -- I/O -----------------------------------------------------------------------------------------

    def _send(self, call: proto.Call[Any], *, stream: bool = False) -> httpx.Response:
        attempt = 0
        while True:
            request, opened = call.build(self._http)
            try:
                response = self._http.send(request, stream=stream)
            except httpx.TransportError as exc:
                delay = proto.retry_delay(self.retry, attempt, exc=exc)
                if delay is None:
                    raise proto.unreachable(self.base_url, exc, attempt + 1) from exc
            else:
                delay = proto.retry_delay(self.retry, attempt, response=response)
                if delay is None:
                    return response
                response.close()
            finally:
                for handle in opened:
                    handle.close()
            time.sleep(delay)
            attempt += 1

    def _request(self, call: proto.Call[T]) -> T:
        return call.parse(self._send(call))

    def _download(self, call: proto.Call[None], path: str | os.PathLike[str], expected: str | None) -> Path:
        sink = proto.DigestSink(Path(path), expected)
        attempt = 0
        while True:
            try:
                response = self._send(call, stream=True)
                try:
                    proto.check_download_response(response)
                    sink.open()
                    for chunk in response.iter_bytes(proto.DOWNLOAD_CHUNK):
                        sink.write(chunk)
                    return sink.finish(response)
                finally:
                    response.close()
            except httpx.TransportError as exc:  # the connection broke mid-body
                sink.abort()
                delay = proto.retry_delay(self.retry, attempt, exc=exc)
                if delay is None:
                    raise proto.unreachable(self.base_url, exc, attempt + 1) from exc
                time.sleep(delay)
                attempt += 1
            except BaseException:
                sink.abort()
                raise

    # -- operations ----------------------------------------------------------------------------------

    def submit(
        self,
        model: ModelLike,
        *,
        config: ConfigLike | None = None,
        target: str = "cpu",
        filename: str | None = None,
    ) -> Job:
        """Submit a model for fusion; a repeated identical submission returns the same job.

        A model of at least ``digest_first_min_bytes`` is first named by its sha256 alone; only if
        the service does not hold it for this tenant is the file uploaded."""
        by_digest, upload = proto.submit_calls(model, config, target, filename, self.digest_first_min_bytes)
        if by_digest is not None:
            try:
                return Job(self, self._request(by_digest))
            except AutofusionError as exc:
                if not proto.upload_needed(exc):
                    raise
        return Job(self, self._request(upload))

    def get_job(self, job_id: str) -> Job:
        """Reattach to a job by id (e.g. one submitted by an earlier pipeline step)."""
        return Job(self, self._request(proto.get_job_call(job_id)).state)

    def list_jobs(self, *, page_size: int | None = None) -> Iterator[Job]:
        """Every job of this tenant, newest first, fetching pages lazily."""
        cursor: str | None = None
        while True:
            page = self._request(proto.list_jobs_call(cursor, page_size))
            for state in page.items:
                yield Job(self, state)
            if not page.next_cursor or not page.items:
                return
            cursor = page.next_cursor

    def wait(
        self, job: JobRef, *, timeout: float | None = None, on_progress: ProgressCallback | None = None
    ) -> Job:
        """Poll until the job is terminal (see `Job.wait`); updates a given `Job` handle in place."""
        handle = job if isinstance(job, Job) else Job(self, job) if isinstance(job, JobState) else None
        tracker = proto.WaitTracker(self._job_id(job), timeout)
        while True:
            try:
                snapshot = self._request(proto.get_job_call(tracker.job_id))
            except ServiceUnavailableError as exc:
                time.sleep(tracker.unavailable(exc))
                continue
            if handle is None:
                handle = Job(self, snapshot.state)
            handle.state = snapshot.state
            moved, delay = tracker.observe(snapshot)
            if moved and on_progress is not None:
                on_progress(handle)
            if delay is None:
                return handle
            time.sleep(delay)

    def cancel(self, job: JobRef) -> Job:
        """Ask the service to stop a job; returns its state (``cancelling`` or already terminal)."""
        return Job(self, self._request(proto.cancel_call(self._job_id(job))))

    def report(self, job: JobRef) -> Report:
        """Statistics and decisions of a succeeded job (`JobNotReadyError` before that)."""
        return self._request(proto.report_call(self._job_id(job)))

    def download_model(self, job: JobRef, path: str | os.PathLike[str]) -> Path:
        """Stream the fused ONNX model to ``path``, verifying its sha256; returns the path."""
        call = proto.download_call(self._job_id(job), "model")
        return self._download(call, path, self._expected(job, "model"))

    def download_bundle(self, job: JobRef, path: str | os.PathLike[str]) -> Path:
        """Stream the bundle (fused model, kernels, manifest; tar.gz) to ``path``, verified."""
        call = proto.download_call(self._job_id(job), "bundle")
        return self._download(call, path, self._expected(job, "bundle"))

    def download_artifact(self, digest: str, path: str | os.PathLike[str]) -> Path:
        """Stream a content-addressed artifact to ``path``; its sha256 must equal ``digest``."""
        return self._download(proto.artifact_call(digest), path, digest)

    def targets(self) -> list[Target]:
        return self._request(proto.targets_call())

    def patterns(self) -> list[PatternInfo]:
        return self._request(proto.patterns_call())

    def healthy(self) -> bool:
        """``/healthz`` answered 2xx (the API process is up)."""
        return self._request(proto.probe_call("/healthz"))

    def ready(self) -> bool:
        """``/readyz`` answered 2xx (the API can take jobs)."""
        return self._request(proto.probe_call("/readyz"))

    def fuse(
        self,
        model: ModelLike,
        out: str | os.PathLike[str],
        *,
        bundle: str | os.PathLike[str] | None = None,
        config: ConfigLike | None = None,
        target: str = "cpu",
        timeout: float | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> Job:
        """Submit, wait, and download the fused model to ``out`` (and the bundle to ``bundle``).

        Raises `JobFailedError` if the job fails or is cancelled, `WaitTimeoutError` after ``timeout``.
        """
        job = self.submit(model, config=config, target=target)
        job.wait(timeout=timeout, on_progress=on_progress)
        job.raise_for_status()
        job.download_model(out)
        if bundle is not None:
            job.download_bundle(bundle)
        return job

    # -- lifecycle -----------------------------------------------------------------------------------

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncClient(_BaseClient):
    """The `Client` operations as coroutines (``list_jobs`` is an async iterator)."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = proto.DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        digest_first_min_bytes: int | None = proto.DIGEST_FIRST_MIN_BYTES,
    ) -> None:
        super().__init__(base_url, api_key, timeout, retry, headers, digest_first_min_bytes)
        self._http = httpx.AsyncClient(transport=transport, **self._http_kwargs())

    # -- I/O -----------------------------------------------------------------------------------------

    async def _send(self, call: proto.Call[Any], *, stream: bool = False) -> httpx.Response:
        attempt = 0
        while True:
            request, opened = call.build(self._http)
            try:
                response = await self._http.send(request, stream=stream)
            except httpx.TransportError as exc:
                delay = proto.retry_delay(self.retry, attempt, exc=exc)
                if delay is None:
                    raise proto.unreachable(self.base_url, exc, attempt + 1) from exc
            else:
                delay = proto.retry_delay(self.retry, attempt, response=response)
                if delay is None:
                    return response
                await response.aclose()
            finally:
                for handle in opened:
                    handle.close()
            await asyncio.sleep(delay)
            attempt += 1

    async def _request(self, call: proto.Call[T]) -> T:
        return call.parse(await self._send(call))

    async def _download(
        self, call: proto.Call[None], path: str | os.PathLike[str], expected: str | None
    ) -> Path:
        sink = proto.DigestSink(Path(path), expected)
        attempt = 0
        while True:
            try:
                response = await self._send(call, stream=True)
                try:
                    if not response.is_success:
                        await response.aread()
                    proto.check_download_response(response)
                    sink.open()
                    async for chunk in response.aiter_bytes(proto.DOWNLOAD_CHUNK):
                        sink.write(chunk)
                    return sink.finish(response)
                finally:
                    await response.aclose()
            except httpx.TransportError as exc:
                sink.abort()
                delay = proto.retry_delay(self.retry, attempt, exc=exc)
                if delay is None:
                    raise proto.unreachable(self.base_url, exc, attempt + 1) from exc
                await asyncio.sleep(delay)
                attempt += 1
            except BaseException:
                sink.abort()
                raise

    # -- operations ----------------------------------------------------------------------------------

    async def submit(
        self,
        model: ModelLike,
        *,
        config: ConfigLike | None = None,
        target: str = "cpu",
        filename: str | None = None,
    ) -> AsyncJob:
        # hashing a large model takes a while: not on the event loop
        by_digest, upload = await asyncio.to_thread(
            proto.submit_calls, model, config, target, filename, self.digest_first_min_bytes
        )
        if by_digest is not None:
            try:
                return AsyncJob(self, await self._request(by_digest))
            except AutofusionError as exc:
                if not proto.upload_needed(exc):
                    raise
        return AsyncJob(self, await self._request(upload))

    async def get_job(self, job_id: str) -> AsyncJob:
        return AsyncJob(self, (await self._request(proto.get_job_call(job_id))).state)

    async def list_jobs(self, *, page_size: int | None = None) -> AsyncIterator[AsyncJob]:
        cursor: str | None = None
        while True:
            page = await self._request(proto.list_jobs_call(cursor, page_size))
            for state in page.items:
                yield AsyncJob(self, state)
            if not page.next_cursor or not page.items:
                return
            cursor = page.next_cursor

    async def wait(
        self, job: JobRef, *, timeout: float | None = None, on_progress: AsyncProgressCallback | None = None
    ) -> AsyncJob:
        handle = (
            job if isinstance(job, AsyncJob) else AsyncJob(self, job) if isinstance(job, JobState) else None
        )
        tracker = proto.WaitTracker(self._job_id(job), timeout)
        while True:
            try:
                snapshot = await self._request(proto.get_job_call(tracker.job_id))
            except ServiceUnavailableError as exc:
                await asyncio.sleep(tracker.unavailable(exc))
                continue
            if handle is None:
                handle = AsyncJob(self, snapshot.state)
            handle.state = snapshot.state
            moved, delay = tracker.observe(snapshot)
            if moved and on_progress is not None:
                result = on_progress(handle)
                if inspect.isawaitable(result):
                    await result
            if delay is None:
                return handle
            await asyncio.sleep(delay)

    async def cancel(self, job: JobRef) -> AsyncJob:
        return AsyncJob(self, await self._request(proto.cancel_call(self._job_id(job))))

    async def report(self, job: JobRef) -> Report:
        return await self._request(proto.report_call(self._job_id(job)))

    async def download_model(self, job: JobRef, path: str | os.PathLike[str]) -> Path:
        call = proto.download_call(self._job_id(job), "model")
        return await self._download(call, path, self._expected(job, "model"))

    async def download_bundle(self, job: JobRef, path: str | os.PathLike[str]) -> Path:
        call = proto.download_call(self._job_id(job), "bundle")
        return await self._download(call, path, self._expected(job, "bundle"))

    async def download_artifact(self, digest: str, path: str | os.PathLike[str]) -> Path:
        return await self._download(proto.artifact_call(digest), path, digest)

    async def targets(self) -> list[Target]:
        return await self._request(proto.targets_call())

    async def patterns(self) -> list[PatternInfo]:
        return await self._request(proto.patterns_call())

    async def healthy(self) -> bool:
        return await self._request(proto.probe_call("/healthz"))

    async def ready(self) -> bool:
        return await self._request(proto.probe_call("/readyz"))

    async def fuse(
        self,
        model: ModelLike,
        out: str | os.PathLike[str],
        *,
        bundle: str | os.PathLike[str] | None = None,
        config: ConfigLike | None = None,
        target: str = "cpu",
        timeout: float | None = None,
        on_progress: AsyncProgressCallback | None = None,
    ) -> AsyncJob:
        job = await self.submit(model, config=config, target=target)
        await job.wait(timeout=timeout, on_progress=on_progress)
        job.raise_for_status()
        await job.download_model(out)
        if bundle is not None:
            await job.download_bundle(bundle)
        return job

    # -- lifecycle -----------------------------------------------------------------------------------

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
