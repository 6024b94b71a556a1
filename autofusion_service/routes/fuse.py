"""`POST /fuse`: validate a submission, store the model, and create (or find) its job.

Everything that can be rejected synchronously is: the target, the config (the engine's own pydantic
model), the upload size and whether the bytes parse as ONNX at all. Deeper model problems surface
when the engine runs, as the failed job's problem object.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Annotated, Any

import pydantic
from fastapi import APIRouter, File, Form, Response, UploadFile

import graph_autofusion as gaf
from autofusion_worker.targets import TARGETS

from ..deps import State, Tenant
from ..problems import ProblemError, problem_responses
from ..schemas import Job, job_view
from ..store import JobRecord
from ..store.records import new_job_id

router = APIRouter(tags=["jobs"])
_TARGET_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
_CHUNK = 1 << 20


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


def _hash_upload(upload: UploadFile, limit: int) -> tuple[str, int]:
    hasher, size = hashlib.sha256(), 0
    upload.file.seek(0)
    for chunk in iter(lambda: upload.file.read(_CHUNK), b""):
        hasher.update(chunk)
        size += len(chunk)
        if size > limit:
            raise ProblemError(
                "payload_too_large", 413, f"the model exceeds the limit of {limit} bytes", limit_bytes=limit
            )
    upload.file.seek(0)
    return hasher.hexdigest(), size


@router.post(
    "/fuse",
    status_code=202,
    response_model=Job,
    summary="Submit a model for fusion",
    responses={
        200: {"model": Job, "description": "The same submission already exists: its job."},
        202: {
            "description": "Accepted: the new job (already succeeded when identical results existed).",
            "headers": {"Location": {"description": "`/jobs/{id}`", "schema": {"type": "string"}}},
        },
        **problem_responses(401, 413, 422, 503),
    },
)
def submit(
    response: Response,
    state: State,
    tenant: Tenant,
    model: Annotated[UploadFile, File(description="The ONNX model file.")],
    config: Annotated[str | None, Form(description="The engine's FusionConfig as a JSON object.")] = None,
    target: Annotated[str, Form(description="Target to compile for, e.g. `cpu`.")] = "cpu",
) -> Job:
    served = state.served_targets()
    if not _TARGET_NAME.match(target) or (target not in TARGETS and target not in served):
        raise ProblemError(
            "unknown_target",
            422,
            f"unknown target {target!r}; live workers serve {sorted(served) or 'no target'}",
            served=sorted(served),
            known=sorted(TARGETS),
        )
    config_data, fusion_config = _parse_config(config)
    digest, size = _hash_upload(model, state.settings.max_upload_bytes)
    if not state.blobs.exists(digest):
        _check_model(model.file.read(), fusion_config)
        model.file.seek(0)
        state.blobs.put_file(model.file)
    record = JobRecord(
        id=new_job_id(),
        tenant=tenant,
        job_key=job_key(digest, fusion_config.canonical_json(), target),
        target=target,
        config=config_data,
        model_digest=digest,
        model_size=size,
        model_filename=(model.filename or "model.onnx")[:255],
        engine_version=gaf.__version__,
    )
    done = state.store.find_succeeded(record.job_key)
    if done is not None:
        job, created = state.store.submit_copy(record, done)
    else:
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
    response.status_code = 202 if created else 200
    response.headers["Location"] = f"/jobs/{job.id}"
    return job_view(job, waiting=job.target not in served)
