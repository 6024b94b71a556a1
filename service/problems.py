"""RFC 9457 problem details: the one shape every error of the API takes.

Routes raise `ProblemError(code, status, detail, **extras)`; the handlers here also turn FastAPI's
own validation errors and Starlette's HTTP errors into problems, and a last-resort handler answers
`internal_error` without leaking a traceback. A job store or broker that cannot be reached (Redis
down or restarting) is `503 broker_unavailable` with `Retry-After` on every route, never a 500.
`problem_responses()` documents them in OpenAPI.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from autofusion_core.errors import UNAVAILABLE_ERRORS

PROBLEM_MEDIA_TYPE = "application/problem+json"
log = logging.getLogger("autofusion_service")


class Problem(BaseModel):
    """An RFC 9457 problem object with a stable machine-readable `code`."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(description="`/problems/<code>`.", examples=["/problems/not_found"])
    title: str
    status: int
    detail: str
    code: str = Field(description="Stable error code clients can branch on.")
    instance: str | None = Field(default=None, description="The request path the problem is about.")


def problem_body(
    code: str,
    status: int,
    detail: str,
    *,
    title: str | None = None,
    instance: str | None = None,
    **extras: Any,
) -> dict[str, Any]:
    body = {
        "type": f"/problems/{code}",
        "title": title or _title(status),
        "status": status,
        "detail": detail,
        "code": code,
        "instance": instance,
    }
    body.update({k: v for k, v in extras.items() if k not in body})
    return body


def _title(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


class ProblemError(Exception):
    """Raise from a route to answer with a problem."""

    def __init__(
        self,
        code: str,
        status: int,
        detail: str,
        *,
        title: str | None = None,
        headers: dict[str, str] | None = None,
        **extras: Any,
    ) -> None:
        super().__init__(detail)
        self.code, self.status, self.detail, self.title = code, status, detail, title
        self.headers = headers or {}
        self.extras = extras


def problem_response(request: Request | None, body: dict[str, Any], headers: dict[str, str] | None = None):
    if request is not None and body.get("instance") is None:
        body["instance"] = request.url.path
    return JSONResponse(body, status_code=body["status"], media_type=PROBLEM_MEDIA_TYPE, headers=headers)


_STARLETTE_CODES = {
    404: "not_found",
    405: "method_not_allowed",
    401: "unauthorized",
    413: "payload_too_large",
}


def install_problem_handlers(app: FastAPI) -> None:
    @app.exception_handler(ProblemError)
    async def _problem(request: Request, exc: ProblemError):
        body = problem_body(exc.code, exc.status, exc.detail, title=exc.title, **exc.extras)
        return problem_response(request, body, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        errors = [
            {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
            for e in exc.errors()
        ]
        detail = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors) or "invalid request"
        body = problem_body("validation_error", 422, detail, title="Invalid request", errors=errors)
        return problem_response(request, body)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        code = _STARLETTE_CODES.get(exc.status_code, f"http_{exc.status_code}")
        detail = exc.detail if isinstance(exc.detail, str) else _title(exc.status_code)
        if exc.status_code == 404:
            detail = f"no resource at {request.url.path}"
        return problem_response(request, problem_body(code, exc.status_code, detail), dict(exc.headers or {}))

    async def _unavailable(request: Request, exc: Exception):
        # Redis (job store and broker) is away: a client should come back shortly, not give up.
        log.warning("%s %s: store/broker unavailable: %s", request.method, request.url.path, exc)
        retry_after = getattr(getattr(request.app.state, "autofusion", None), "settings", None)
        seconds = str(max(1, getattr(retry_after, "retry_after", 1)))
        body = problem_body(
            "broker_unavailable",
            503,
            "the job store or queue is unavailable; retry after the `Retry-After` delay",
            title="Service Unavailable",
        )
        return problem_response(request, body, {"Retry-After": seconds})

    for unavailable in UNAVAILABLE_ERRORS:
        app.add_exception_handler(unavailable, _unavailable)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        body = problem_body("internal_error", 500, "an internal error occurred; it has been logged")
        return problem_response(request, body)


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` entries for problems (media type fixed up in `openapi.py`)."""
    described = {
        400: "Malformed request.",
        401: "Missing or invalid API key (`unauthorized`).",
        404: "No such resource for this tenant (`not_found`).",
        409: "The job has not succeeded yet (`job_not_ready`).",
        413: "Upload over the configured limit (`payload_too_large`).",
        422: "Invalid input: `validation_error`, `invalid_config`, `invalid_model` and finer model codes, "
        "`unknown_target`, `unknown_model_digest`.",
        503: "The job store or queue is unreachable, e.g. while Redis restarts (`broker_unavailable`, "
        "with `Retry-After`), or the service is not ready (`not_ready`).",
    }
    return {s: {"model": Problem, "description": described.get(s, _title(s))} for s in statuses}
