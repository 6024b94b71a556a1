"""The HTTP contract without the I/O: which request each operation sends, how an answer is read.

`Client` and `AsyncClient` both describe each operation as a `Call` built here and hand its response
back to the call's ``parse``; the only code they do not share is ``send``/``sleep``/``write``. That
keeps the two clients' behaviour identical by construction rather than by discipline.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Generic, TypeVar
from urllib.parse import quote

import httpx
from pydantic import TypeAdapter, ValidationError

from ._config import ConfigLike, config_to_dict
from ._exceptions import (
    AutofusionError,
    IntegrityError,
    ServiceUnavailableError,
    UnexpectedResponseError,
    WaitTimeoutError,
    error_for_problem,
)
from ._inputs import ModelLike, model_upload
from ._models import JobPage, JobState, PatternInfo, Problem, Report, Target
from ._retry import PollSchedule, RetryPolicy, parse_retry_after

T = TypeVar("T")

DEFAULT_TIMEOUT = 30.0
DOWNLOAD_CHUNK = 1 << 20


@dataclass
class Call(Generic[T]):
    """One operation: the request to send (rebuilt for every attempt) and how to read the answer."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: dict[str, Any] | None = None
    data: dict[str, Any] | None = None
    files: Callable[[], dict[str, Any]] | None = None

    def build(self, http: httpx.Client | httpx.AsyncClient) -> tuple[httpx.Request, list[IO[bytes]]]:
        """The request for one attempt, plus the file objects to close once it is sent."""
        files = self.files() if self.files is not None else None
        opened = [part[1] for part in files.values()] if files else []
        request = http.build_request(self.method, self.path, params=self.params, data=self.data, files=files)
        return request, opened


# -- reading answers ---------------------------------------------------------------------------------


def problem_from_response(response: httpx.Response) -> Problem:
    """The problem object of an error answer, tolerating proxies that answer with HTML or plain text."""
    body: Any = None
    with contextlib.suppress(ValueError):
        body = response.json()
    if isinstance(body, dict):
        fields = dict(body)
        if isinstance(fields.get("detail"), list):  # a framework's raw validation error
            fields = {"code": "validation_error", "errors": fields.pop("detail"), **fields}
        fields.setdefault("status", response.status_code)
        fields.setdefault("title", response.reason_phrase)
        try:
            return Problem.model_validate(fields)
        except ValidationError:
            pass
    text = response.text[:500] if response.content else None
    return Problem(title=response.reason_phrase, status=response.status_code, detail=text)


def raise_for_problem(response: httpx.Response) -> None:
    """Turn an error answer into the matching typed error; success answers pass through."""
    if response.is_success:
        return
    raise error_for_problem(problem_from_response(response), response.status_code)


def _parse_as(adapter: TypeAdapter[T], response: httpx.Response) -> T:
    raise_for_problem(response)
    try:
        return adapter.validate_json(response.content)
    except ValidationError as exc:
        raise UnexpectedResponseError(
            f"{response.request.method} {response.request.url.path} answered {response.status_code} "
            f"with a body the client cannot read: {exc.errors(include_url=False)[:3]}",
            problem=Problem(title="unexpected response", status=response.status_code),
        ) from exc


def parser(model: Any) -> Callable[[httpx.Response], Any]:
    adapter: TypeAdapter[Any] = TypeAdapter(model)
    return lambda response: _parse_as(adapter, response)


_job = parser(JobState)
_page = parser(JobPage)
_report = parser(Report)
_targets_body = parser(dict[str, list[Target]])
_patterns_body = parser(list[PatternInfo] | dict[str, list[PatternInfo]])


@dataclass(frozen=True)
class Snapshot:
    """A polled job and how long the service asked us to wait before asking again."""

    state: JobState
    retry_after: float | None


def _snapshot(response: httpx.Response) -> Snapshot:
    return Snapshot(_job(response), parse_retry_after(response.headers.get("Retry-After")))


def _targets(response: httpx.Response) -> list[Target]:
    return _targets_body(response).get("targets", [])


def _patterns(response: httpx.Response) -> list[PatternInfo]:
    body = _patterns_body(response)
    return body.get("patterns", []) if isinstance(body, dict) else body


def _ok(response: httpx.Response) -> bool:
    return response.is_success


# -- the operations ----------------------------------------------------------------------------------


def _job_path(job_id: str, suffix: str = "") -> str:
    if not job_id:
        raise ValueError("job id must not be empty")
    return f"/jobs/{quote(job_id, safe='')}{suffix}"


#: Models at least this large are first submitted by digest alone (`submit_calls`); below it an
#: upload costs about what the extra round trip would.
DIGEST_FIRST_MIN_BYTES = 1 << 20
#: Answers to a digest-only submission after which the model is uploaded instead: the service does
#: not hold that model for this tenant (or predates `model_digest` and asks for the file).
UPLOAD_NEEDED_CODES = frozenset({"unknown_model_digest", "validation_error"})


def _submit_fields(config: ConfigLike | None, target: str) -> dict[str, Any]:
    data: dict[str, Any] = {"target": target}
    config_dict = config_to_dict(config)
    if config_dict is not None:
        data["config"] = json.dumps(config_dict, sort_keys=True)
    return data


def submit_call(
    model: ModelLike, config: ConfigLike | None, target: str, filename: str | None
) -> Call[JobState]:
    upload = model_upload(model, filename)
    return Call("POST", "/fuse", _job, data=_submit_fields(config, target), files=upload.multipart)


def submit_calls(
    model: ModelLike,
    config: ConfigLike | None,
    target: str,
    filename: str | None,
    digest_first_min_bytes: int | None = DIGEST_FIRST_MIN_BYTES,
) -> tuple[Call[JobState] | None, Call[JobState]]:
    """``(by_digest, upload)``: a submission naming the model by its sha256 only, to try first (None
    for models under ``digest_first_min_bytes``, or with it None), and the full upload.

    A pipeline resubmits the same model over and over; the service keeps every model a tenant
    uploaded, so naming it by digest skips sending (and the service parsing) the whole file. Both
    requests are idempotent, like every ``POST /fuse``: retrying either is safe."""
    upload = model_upload(model, filename)
    data = _submit_fields(config, target)
    by_digest = None
    if digest_first_min_bytes is not None:
        size, digest = upload.measure()
        if size >= digest_first_min_bytes:
            fields = {**data, "model_digest": digest, "model_filename": upload.filename}
            by_digest = Call("POST", "/fuse", _job, data=fields)
    return by_digest, Call("POST", "/fuse", _job, data=data, files=upload.multipart)


def upload_needed(error: AutofusionError) -> bool:
    """Whether a refused digest-only submission should be followed by the upload."""
    return error.status == 422 and error.code in UPLOAD_NEEDED_CODES


def get_job_call(job_id: str) -> Call[Snapshot]:
    return Call("GET", _job_path(job_id), _snapshot)


def list_jobs_call(cursor: str | None, limit: int | None) -> Call[JobPage]:
    params: dict[str, Any] = {}
    if cursor:
        params["cursor"] = cursor
    if limit is not None:
        params["limit"] = limit
    return Call("GET", "/jobs", _page, params=params)


def cancel_call(job_id: str) -> Call[JobState]:
    return Call("POST", _job_path(job_id, "/cancel"), _job)


def report_call(job_id: str) -> Call[Report]:
    return Call("GET", _job_path(job_id, "/report"), _report)


def targets_call() -> Call[list[Target]]:
    return Call("GET", "/targets", _targets)


def patterns_call() -> Call[list[PatternInfo]]:
    return Call("GET", "/patterns", _patterns)


def probe_call(path: str) -> Call[bool]:
    return Call("GET", path, _ok)


def download_call(job_id: str, what: str) -> Call[None]:
    return Call("GET", _job_path(job_id, f"/{what}"), lambda response: None)


def artifact_call(digest: str) -> Call[None]:
    return Call("GET", f"/artifacts/{quote(digest, safe='')}", lambda response: None)


# -- retries -----------------------------------------------------------------------------------------


def retry_delay(
    policy: RetryPolicy, attempt: int, *, response: httpx.Response | None = None, exc: Exception | None = None
) -> float | None:
    """Seconds to wait before the next attempt, or ``None`` to stop and use what we have."""
    if exc is not None:
        return policy.delay(attempt) if policy.should_retry(attempt, exc=exc) else None
    assert response is not None
    if not policy.should_retry(attempt, status=response.status_code):
        return None
    return policy.delay(attempt, parse_retry_after(response.headers.get("Retry-After")))


def unreachable(base_url: httpx.URL, exc: Exception, attempts: int) -> ServiceUnavailableError:
    return ServiceUnavailableError(
        f"cannot reach the service at {base_url} after {attempts} attempt(s): {exc or type(exc).__name__}",
        problem=Problem(title="service unreachable", code="service_unavailable"),
    )


# -- waiting -----------------------------------------------------------------------------------------


def _progress_key(state: JobState) -> tuple[Any, ...]:
    done, total = (state.progress.done, state.progress.total) if state.progress else (None, None)
    return (state.status, state.stage, done, total)


@dataclass
class WaitTracker:
    """The decisions of ``wait()``: did the job move, is it done, how long to sleep, is time up."""

    job_id: str
    timeout: float | None
    schedule: PollSchedule = field(default_factory=PollSchedule)
    #: Seconds ``wait()`` keeps polling through a service that answers "unavailable" (its Redis
    #: restarting, say) after the client's own retries ran out; the job runs on meanwhile.
    outage_patience: float = 300.0
    _deadline: float | None = None
    _last: tuple[Any, ...] | None = None
    _outage_since: float | None = None

    def __post_init__(self) -> None:
        if self.timeout is not None:
            self._deadline = time.monotonic() + self.timeout

    def observe(self, snapshot: Snapshot) -> tuple[bool, float | None]:
        """``(moved, delay)``: whether to report progress, and the sleep before the next poll
        (``None`` once the job is terminal). Raises `WaitTimeoutError` when the deadline passed."""
        self._outage_since = None
        key = _progress_key(snapshot.state)
        moved = key != self._last
        self._last = key
        if snapshot.state.is_terminal:
            return moved, None
        delay = self.schedule.next_delay(snapshot.retry_after, moved=moved)
        if self._deadline is not None:
            remaining = self._deadline - time.monotonic()
            if remaining <= 0:
                raise WaitTimeoutError(snapshot.state, self.timeout or 0.0)
            delay = min(delay, remaining)
        return moved, delay

    def unavailable(self, error: ServiceUnavailableError) -> float:
        """The sleep before polling again after the service answered "unavailable"; re-raises
        `error` once the outage outlasted ``outage_patience`` or the wait's own deadline."""
        now = time.monotonic()
        if self._outage_since is None:
            self._outage_since = now
        if now - self._outage_since > self.outage_patience:
            raise error
        if self._deadline is not None and now >= self._deadline:
            raise error
        delay = self.schedule.next_delay(None, moved=False)
        return delay if self._deadline is None else min(delay, self._deadline - now)


# -- downloads ---------------------------------------------------------------------------------------


def etag_digest(response: httpx.Response) -> str | None:
    """The sha256 hex the service put in ``ETag`` (quotes and a weak prefix stripped)."""
    etag = response.headers.get("ETag")
    if not etag:
        return None
    etag = etag.strip()
    if etag.startswith("W/"):
        etag = etag[2:]
    return etag.strip('"').lower() or None


@dataclass
class DigestSink:
    """Streams a download into a temporary file beside ``path`` while hashing it.

    The file only appears at ``path`` once its sha256 matches both the ``ETag`` and the digest the job
    reported; a truncated or corrupted transfer never leaves a plausible-looking model behind.
    """

    path: Path
    expected: str | None = None
    _file: IO[bytes] | None = None
    _hash: Any = field(default_factory=hashlib.sha256)
    size: int = 0

    def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".part", dir=self.path.parent)
        self._tmp = Path(tmp)
        self._file = os.fdopen(fd, "wb")
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, chunk: bytes) -> None:
        assert self._file is not None
        self._file.write(chunk)
        self._hash.update(chunk)
        self.size += len(chunk)

    def finish(self, response: httpx.Response) -> Path:
        assert self._file is not None
        self._file.close()
        digest = self._hash.hexdigest()
        for source, want in (("ETag", etag_digest(response)), ("job artifact", self.expected)):
            if want is not None and want.lower() != digest:
                self.abort()
                raise IntegrityError(
                    f"download of {response.request.url.path} has sha256 {digest}, "
                    f"but the {source} says {want}",
                    problem=Problem(title="digest mismatch", code="digest_mismatch", digest=digest),
                )
        os.replace(self._tmp, self.path)
        return self.path

    def abort(self) -> None:
        if self._file is not None and not self._file.closed:
            self._file.close()
        with contextlib.suppress(FileNotFoundError, AttributeError):
            self._tmp.unlink()


def check_download_response(response: httpx.Response) -> None:
    """A streamed error answer must be read before it can be turned into an error."""
    if not response.is_success:
        response.read()
        raise_for_problem(response)
