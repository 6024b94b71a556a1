import pytest
from graph_autofusion_client import (
    AuthenticationError,
    AutofusionError,
    InvalidConfigError,
    InvalidModelError,
    InvalidRequestError,
    JobCancelledError,
    JobFailedError,
    JobNotReadyError,
    JobState,
    NotFoundError,
    PayloadTooLargeError,
    Problem,
    ServiceUnavailableError,
    UnexpectedResponseError,
    UnknownTargetError,
)
from graph_autofusion_client._exceptions import error_for_problem

from ._fakes import job_json


@pytest.mark.parametrize(
    ("code", "status", "cls"),
    [
        ("unauthorized", 401, AuthenticationError),
        ("not_found", 404, NotFoundError),
        ("invalid_model", 422, InvalidModelError),
        ("not_onnx", 422, InvalidModelError),
        ("graph_cycle", 422, InvalidModelError),
        ("unbound_dimension", 422, InvalidModelError),
        ("invalid_config", 422, InvalidConfigError),
        ("payload_too_large", 413, PayloadTooLargeError),
        ("unknown_target", 422, UnknownTargetError),
        ("job_not_ready", 409, JobNotReadyError),
        ("validation_error", 422, InvalidRequestError),
        ("http_503", 503, ServiceUnavailableError),
        ("internal_error", 500, UnexpectedResponseError),
    ],
)
def test_problem_maps_to_typed_error(code: str, status: int, cls: type[AutofusionError]) -> None:
    problem = Problem(type=f"/problems/{code}", title="T", status=status, detail="d", code=code, node="n1")
    error = error_for_problem(problem, status)
    assert type(error) is cls
    assert (error.code, error.status, error.detail, error.title) == (code, status, "d", "T")
    assert error.extra == {"node": "n1"}
    assert error.to_dict()["node"] == "n1"


def test_engine_reason_code_is_kept() -> None:
    error = error_for_problem(Problem(code="graph_cycle", status=422, detail="cycle at n3"), 422)
    assert isinstance(error, InvalidModelError)
    assert error.reason == "graph_cycle"
    assert str(error) == "[graph_cycle] cycle at n3"


def test_job_failed_error_carries_the_jobs_problem() -> None:
    state = JobState.model_validate(
        job_json(status="failed", error={"code": "compilation_failed", "title": "x", "detail": "cc said no"})
    )
    error = JobFailedError(state)
    assert error.job is state
    assert error.code == "compilation_failed"
    assert "cc said no" in str(error)
    cancelled = JobCancelledError(JobState.model_validate(job_json(status="cancelled")))
    assert isinstance(cancelled, JobFailedError)
    assert cancelled.code == "job_cancelled"
