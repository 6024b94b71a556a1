"""`/jobs`: status, listing, cancellation and the results of a tenant's jobs.

Another tenant's job answers exactly like a job that does not exist (404), so ids reveal nothing.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import FileResponse

from autofusion_core.blobs import BlobStore
from autofusion_core.store.records import Artifact

from ..deps import BEARER_SECURITY, State, Tenant, tenant_of
from ..jobs import is_job_id, load_job, ready_artifact
from ..problems import ProblemError, problem_responses
from ..schemas import Job, JobList, job_view

router = APIRouter(tags=["jobs"])

_DOWNLOAD_HEADERS = {
    "ETag": {"description": '`"<sha256 hex>"` of the content.', "schema": {"type": "string"}},
    "Content-Length": {"description": "Size in bytes.", "schema": {"type": "integer"}},
}


def blob_response(
    blobs: BlobStore, artifact: Artifact, media_type: str, filename: str | None = None
) -> FileResponse:
    if not blobs.exists(artifact.digest):
        raise ProblemError("not_found", 404, "the artifact is no longer stored")
    return FileResponse(
        blobs.path(artifact.digest),
        media_type=media_type,
        filename=filename,
        headers={"ETag": f'"{artifact.digest}"', "Content-Length": str(artifact.size)},
    )


@router.get(
    "/jobs",
    response_model=JobList,
    summary="List the caller's jobs, newest first",
    responses=problem_responses(401, 422, 503),
)
def list_jobs(
    state: State,
    tenant: Tenant,
    cursor: Annotated[
        str | None, Query(max_length=64, description="`next_cursor` of the previous page.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> JobList:
    records, next_cursor = state.store.list_jobs(tenant, cursor, limit)
    served = state.served_targets()
    return JobList(
        items=[job_view(r, waiting=r.target not in served) for r in records], next_cursor=next_cursor
    )


@router.get(
    "/jobs/{job_id}",
    response_model=Job,
    summary="A job's status",
    responses={
        200: {
            "description": "The job.",
            "headers": {
                "Retry-After": {
                    "description": "Seconds until the next poll, while not finished.",
                    "schema": {"type": "integer"},
                }
            },
        },
        **problem_responses(401, 404, 503),
    },
    openapi_extra={"security": BEARER_SECURITY},
)
async def get_job(job_id: str, request: Request) -> Response:
    # The hottest route (every client polls it): async, so no thread-pool hop; authentication without
    # the dependency machinery (see `tenant_of`); one store read of the record's JSON (a local Redis
    # GET or SQLite read); the body rendered once per record version.
    state, tenant = tenant_of(request)
    raw = state.store.get_raw(job_id) if is_job_id(job_id) else None
    view = state.status_views.get(raw) if raw else None
    if view is None or view.tenant != tenant:
        raise ProblemError("not_found", 404, f"no job {job_id!r}")
    headers = {} if view.terminal else {"Retry-After": str(state.settings.retry_after)}
    waiting = view.record.status == "queued" and view.waiting(state.served_targets())
    return Response(view.body(waiting), media_type="application/json", headers=headers)


@router.post(
    "/jobs/{job_id}/cancel",
    response_model=Job,
    status_code=202,
    summary="Cancel a queued or running job",
    responses={
        202: {"description": "Cancelled, or asked to stop (`cancelling`); a finished job is unchanged."},
        **problem_responses(401, 404, 503),
    },
)
def cancel_job(job_id: str, state: State, tenant: Tenant) -> Job:
    load_job(state.store, tenant, job_id)
    job = state.store.request_cancel(job_id) or load_job(state.store, tenant, job_id)
    return job_view(job, waiting=job.target not in state.served_targets())


@router.get(
    "/jobs/{job_id}/report",
    summary="The engine's fusion report (statistics and decisions)",
    responses={
        200: {
            "description": "The report.",
            "content": {"application/json": {"schema": {"type": "object", "additionalProperties": True}}},
        },
        **problem_responses(401, 404, 409, 503),
    },
    response_class=Response,
)
def get_report(job_id: str, state: State, tenant: Tenant) -> Response:
    job = load_job(state.store, tenant, job_id)
    artifact = ready_artifact(job, job.report_artifact)
    return blob_response(state.blobs, artifact, "application/json")


@router.get(
    "/jobs/{job_id}/model",
    summary="The fused ONNX model",
    responses={
        200: {
            "description": "The fused model.",
            "headers": _DOWNLOAD_HEADERS,
            "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        },
        **problem_responses(401, 404, 409, 503),
    },
    response_class=Response,
)
def get_model(job_id: str, state: State, tenant: Tenant) -> Response:
    job = load_job(state.store, tenant, job_id)
    artifact = ready_artifact(job, job.model_artifact)
    return blob_response(state.blobs, artifact, "application/octet-stream", f"{job.id}.fused.onnx")


@router.get(
    "/jobs/{job_id}/bundle",
    summary="The bundle: fused model, kernels, report and manifest (tar.gz)",
    responses={
        200: {
            "description": "The bundle.",
            "headers": _DOWNLOAD_HEADERS,
            "content": {"application/gzip": {"schema": {"type": "string", "format": "binary"}}},
        },
        **problem_responses(401, 404, 409, 503),
    },
    response_class=Response,
)
def get_bundle(job_id: str, state: State, tenant: Tenant) -> Response:
    job = load_job(state.store, tenant, job_id)
    artifact = ready_artifact(job, job.bundle_artifact)
    return blob_response(state.blobs, artifact, "application/gzip", f"{job.id}.bundle.tar.gz")
