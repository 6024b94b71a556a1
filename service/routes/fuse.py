"""`POST /fuse`: parse the submission as it streams in, then hand it to `jobs.create_job`.

Everything that can be rejected synchronously is (see `jobs`): the target, the config (the engine's
own pydantic model), the upload size and the engine's load guard. Deeper model problems surface when
the engine runs, as the failed job's problem object.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from ..deps import State, Tenant
from ..jobs import create_job
from ..problems import problem_responses
from ..schemas import Job, job_view
from ..uploads import REQUEST_BODY, read_submission

router = APIRouter(tags=["jobs"])


@router.post(
    "/fuse",
    status_code=202,
    response_model=Job,
    summary="Submit a model for fusion",
    description="Multipart form: `model` (the ONNX file) or `model_digest` (the sha256 of a model "
    "this tenant uploaded before, so that a resubmission sends no model bytes), `config`, `target`.",
    responses={
        200: {"model": Job, "description": "The same submission already exists: its job."},
        202: {
            "description": "Accepted: the new job (already succeeded when identical results existed).",
            "headers": {"Location": {"description": "`/jobs/{id}`", "schema": {"type": "string"}}},
        },
        **problem_responses(401, 413, 422, 503),
    },
    openapi_extra={"requestBody": REQUEST_BODY},
)
async def submit(request: Request, response: Response, state: State, tenant: Tenant) -> Job:
    # Async so that the body streams straight into the blob store (see uploads.py); the blocking
    # rest runs in the thread pool.
    submission = await read_submission(request, state.blobs, state.settings.max_upload_bytes)
    try:
        job, created = await run_in_threadpool(create_job, state, tenant, submission)
    finally:
        submission.discard()
    response.status_code = 202 if created else 200
    response.headers["Location"] = f"/jobs/{job.id}"
    return job_view(job, waiting=job.target not in state.served_targets())
