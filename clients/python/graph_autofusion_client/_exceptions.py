"""Typed errors of the client.

A pipeline catches the class it can act on; every error keeps the service's problem+json fields
(``type``, ``title``, ``status``, ``detail``, ``code``, ``instance`` and any extension members in
``extra``), so nothing the service said is lost on the way to a log.

    AutofusionError                  base: the problem fields, ``problem`` as a typed object
    ├── ServiceUnavailableError      unreachable, or 502/503/504 after the retries ran out
    ├── AuthenticationError          401/403: missing, unknown or revoked API key
    ├── NotFoundError                404: no such job or artifact (for this tenant)
    ├── InvalidRequestError          the submission was rejected (422/413/400)
    │   ├── InvalidModelError        the model is not usable; ``reason`` is the engine's code
    │   │   └── PayloadTooLargeError over the service's upload limit (413)
    │   ├── InvalidConfigError       a FusionConfig value or pattern is wrong
    │   └── UnknownTargetError       no such compilation target
    ├── JobNotReadyError             409: results asked for before the job succeeded
    ├── JobFailedError               the job ended ``failed``; ``job`` and ``problem`` say why
    │   └── JobCancelledError        the job ended ``cancelled``
    ├── WaitTimeoutError             ``wait()`` gave up; the job keeps running on the service
    ├── IntegrityError               downloaded bytes do not match the digest the service reported
    └── UnexpectedResponseError      any other answer the client cannot interpret
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._models import Problem

if TYPE_CHECKING:
    from ._models import JobState

_PROBLEM_FIELDS = ("type", "title", "status", "detail", "code", "instance")


class AutofusionError(Exception):
    """Base of every client error; carries the problem+json fields the service answered with."""

    default_code = "client_error"

    def __init__(self, message: str | None = None, *, problem: Problem | None = None) -> None:
        self.problem = problem if problem is not None else Problem(title=message or "", code=None)
        text = message or self.problem.detail or self.problem.title or self.default_code
        super().__init__(text)
        self.message = text

    # The problem fields, flattened so that `except AutofusionError as e: e.code` just works.
    @property
    def type(self) -> str:
        return self.problem.type

    @property
    def title(self) -> str:
        return self.problem.title

    @property
    def status(self) -> int | None:
        return self.problem.status

    @property
    def detail(self) -> str | None:
        return self.problem.detail

    @property
    def code(self) -> str:
        return self.problem.code or self.default_code

    @property
    def instance(self) -> str | None:
        return self.problem.instance

    @property
    def extra(self) -> dict[str, Any]:
        """Extension members of the problem object (anything beyond the RFC 9457 fields)."""
        return dict(self.problem.model_extra or {})

    def to_dict(self) -> dict[str, Any]:
        return self.problem.model_dump(mode="json", by_alias=True)

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


class ServiceUnavailableError(AutofusionError):
    default_code = "service_unavailable"


class AuthenticationError(AutofusionError):
    default_code = "unauthorized"


class NotFoundError(AutofusionError):
    default_code = "not_found"


class InvalidRequestError(AutofusionError):
    default_code = "validation_error"


class InvalidModelError(InvalidRequestError):
    """The service could not use the model; ``reason`` is the engine's code (``not_onnx``, …)."""

    default_code = "invalid_model"

    @property
    def reason(self) -> str:
        return self.code


class PayloadTooLargeError(InvalidModelError):
    default_code = "payload_too_large"


class InvalidConfigError(InvalidRequestError):
    default_code = "invalid_config"


class UnknownTargetError(InvalidRequestError):
    default_code = "unknown_target"


class JobNotReadyError(AutofusionError):
    default_code = "job_not_ready"


class JobFailedError(AutofusionError):
    """The job ended without a result; ``job`` is its final state, ``problem`` its error."""

    default_code = "job_failed"

    def __init__(self, job: JobState) -> None:
        self.job = job
        ended = f"job {job.id} ended {job.status.value}"
        problem = job.error or Problem(title=ended, code=self.default_code)
        super().__init__(problem.detail or problem.title or ended, problem=problem)


class JobCancelledError(JobFailedError):
    default_code = "job_cancelled"


class WaitTimeoutError(AutofusionError):
    """``wait()`` ran out of time; the job itself is untouched and can be reattached by id."""

    default_code = "wait_timeout"

    def __init__(self, job: JobState, timeout: float) -> None:
        self.job = job
        super().__init__(
            f"job {job.id} still {job.status.value} after {timeout:g}s",
            problem=Problem(title="wait timed out", code=self.default_code),
        )


class IntegrityError(AutofusionError):
    default_code = "digest_mismatch"


class UnexpectedResponseError(AutofusionError):
    default_code = "unexpected_response"


_BY_CODE: dict[str, type[AutofusionError]] = {
    "unauthorized": AuthenticationError,
    "forbidden": AuthenticationError,
    "not_found": NotFoundError,
    "invalid_config": InvalidConfigError,
    "unknown_target": UnknownTargetError,
    "payload_too_large": PayloadTooLargeError,
    "job_not_ready": JobNotReadyError,
    "validation_error": InvalidRequestError,
    "unknown_model_digest": InvalidRequestError,
    "service_unavailable": ServiceUnavailableError,
}
_BY_STATUS: dict[int, type[AutofusionError]] = {
    401: AuthenticationError,
    403: AuthenticationError,
    404: NotFoundError,
    409: JobNotReadyError,
    413: PayloadTooLargeError,
    502: ServiceUnavailableError,
    503: ServiceUnavailableError,
    504: ServiceUnavailableError,
}


def error_for_problem(problem: Problem, status: int) -> AutofusionError:
    """Pick the error class for an answer: by stable code first, then by HTTP status.

    On 422 any code the client does not list (``not_onnx``, ``graph_cycle``, ``unbound_dimension``, …)
    is one of the engine's finer model codes, so it becomes an `InvalidModelError` keeping that code.
    """
    cls = _BY_CODE.get(problem.code or "")
    if cls is None:
        if status == 422 and problem.code:
            cls = InvalidModelError
        elif status in (400, 422):
            cls = InvalidRequestError
        else:
            cls = _BY_STATUS.get(status, UnexpectedResponseError)
    return cls(problem=problem)
