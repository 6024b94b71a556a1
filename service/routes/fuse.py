"""`POST /fuse`: validate a submission, store the model, and create (or find) its job.

Everything that can be rejected synchronously is: the target, the config (the engine's own pydantic
model), the upload size and whether the bytes parse as ONNX at all. Deeper model problems surface
when the engine runs, as the failed job's problem object.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import pydantic
from autofusion_core.blobs import is_digest
from autofusion_core.store import JobRecord
from autofusion_core.store.records import new_job_id
from autofusion_core.targets import TARGETS
from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

import graph_autofusion as gaf

from ..deps import State, Tenant
from ..problems import ProblemError, problem_responses
from ..schemas import Job, job_view
from ..state import ServiceState
from ..uploads import REQUEST_BODY, Submission, read_submission

router = APIRouter(tags=["jobs"])
_TARGET_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")


def job_key(model_digest: str, canonical_config: str, target: str) -> str:
    """The identity of a job: same model bytes, config, target and engine version → same results."""
    parts = (model_digest, canonical_config, target, gaf.__version__)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _parse_config(raw: str | None) -> tuple[dict[str, Any], gaf.FusionConfig]:
    if raw is None or not raw.strip():
        data: Any = {}
    else:
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ProblemError("invalid_config", 422, f"config is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ProblemError("invalid_config", 422, "config must be a JSON object")
    try:
        config = gaf.FusionConfig.model_validate(data)
    except pydantic.ValidationError as exc:
        errors = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
        detail = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in errors)
        raise ProblemError("invalid_config", 422, detail, errors=errors) from None
    return data, config


def _check_model(data: bytes, config: gaf.FusionConfig) -> None:
    """The engine's own load guard (parse, size, opsets, cycles, checker), run before queueing so
    that a malformed model is refused synchronously with the engine's code."""
    from graph_autofusion.loader import load_model

    try:
        load_model(data, config)
    except gaf.FusionError as exc:
        raise ProblemError(exc.code, exc.status, exc.message) from None


def _create_job(state: ServiceState, tenant: str, submission: Submission) -> tuple[JobRecord, bool]:
    """Everything after the body is in: checks, the model into the blob store, the job. Blocking
    (the engine's load guard, the store, the broker), so it runs in the thread pool."""
    fields = submission.fields
    target = fields.get("target") or "cpu"
    served = state.served_targets()
    if not _TARGET_NAME.match(target) or (target not in TARGETS and target not in served):
        raise ProblemError(
            "unknown_target",
            422,
            f"unknown target {target!r}; live workers serve {sorted(served) or 'no target'}",
            served=sorted(served),
            known=sorted(TARGETS),
        )
    config_data, fusion_config = _parse_config(fields.get("config"))
    digest, size, filename = _model_for(state, tenant, submission, fusion_config)
    record = JobRecord(
        id=new_job_id(),
        tenant=tenant,
        job_key=job_key(digest, fusion_config.canonical_json(), target),
        target=target,
        config=config_data,
        model_digest=digest,
        model_size=size,
        model_filename=filename[:255],
        engine_version=gaf.__version__,
    )
    done = state.store.find_succeeded(record.job_key)
    if done is not None:
        return state.store.submit_copy(record, done)
    job, created = state.store.submit(record)
    if created:
        try:
            state.queue.publish(job.id, job.target)
        except Exception as exc:
            state.store.fail(
                job.id,
                {"code": "broker_unavailable", "status": 503, "detail": "the job queue is unavailable"},
            )
            raise ProblemError(
                "broker_unavailable",
                503,
                f"the job queue is unavailable ({type(exc).__name__}); retry later",
            ) from None
    return job, created


def _model_for(
    state: ServiceState, tenant: str, submission: Submission, config: gaf.FusionConfig
) -> tuple[str, int, str]:
    """(digest, size, filename) of the submitted model: the uploaded part, stored (after the
    engine's load guard) unless an identical blob is there already, or a `model_digest` naming a
    blob this tenant uploaded before. Whether another tenant has it is never revealed."""
    claimed = submission.fields.get("model_digest")
    staged = submission.model
    if staged is not None:
        digest = staged.digest
        if claimed and claimed != digest:
            raise ProblemError(
                "validation_error",
                422,
                "model_digest does not match the sha256 of the uploaded model",
                title="Invalid request",
                errors=[
                    {
                        "loc": ["body", "model_digest"],
                        "msg": "does not match the model",
                        "type": "value_error",
                    }
                ],
            )
        if not state.blobs.exists(digest):
            _check_model(staged.read(), config)
            staged.commit()
        return digest, staged.size, submission.model_filename or "model.onnx"
    if not claimed:
        raise ProblemError(
            "validation_error",
            422,
            "body.model: Field required (or give model_digest)",
            title="Invalid request",
            errors=[{"loc": ["body", "model"], "msg": "Field required", "type": "missing"}],
        )
    if not (is_digest(claimed) and state.store.owns(tenant, claimed) and state.blobs.exists(claimed)):
        raise ProblemError(
            "unknown_model_digest",
            422,
            "no model with this sha256 was uploaded by this tenant; submit the model file instead",
            model_digest=claimed if is_digest(claimed) else None,
        )
    filename = submission.fields.get("model_filename") or "model.onnx"
    return claimed, state.blobs.size(claimed), filename


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
        job, created = await run_in_threadpool(_create_job, state, tenant, submission)
    finally:
        submission.discard()
    response.status_code = 202 if created else 200
    response.headers["Location"] = f"/jobs/{job.id}"
    return job_view(job, waiting=job.target not in state.served_targets())
