"""The jobs of the API: submission (checks, the model into the blob store, the job, the message)
and the lookups the routes share. Routes parse HTTP and call these; nothing here knows FastAPI.

Tenancy lives here: a tenant's job ids, artifacts, model digests and results are its own. Another
tenant's job answers like a missing one, and an identical submission by another tenant runs as a
job of its own (only the compiled-kernel cache, keyed by kernel source, is shared), so neither the
answer, its status, its attempt count nor its timing tells whether someone else submitted it.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import pydantic

import graph_autofusion as gaf
from autofusion_core.blobs import is_digest
from autofusion_core.store import Artifact, JobRecord, JobStore
from autofusion_core.store.records import new_job_id
from autofusion_core.targets import TARGETS

from .problems import ProblemError
from .state import ServiceState
from .uploads import Submission

_TARGET_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")


def _jsonable(value: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(value, default=str))


def job_key(model_digest: str, canonical_config: str, target: str) -> str:
    """The identity of a job: same model bytes, config, target and engine version → same results."""
    parts = (model_digest, canonical_config, target, gaf.__version__)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def parse_config(raw: str | None) -> tuple[dict[str, Any], gaf.FusionConfig]:
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


def check_model(data: bytes, config: gaf.FusionConfig) -> None:
    """The engine's own load guard (parse, size, opsets, cycles, checker) and its activation
    limit on the inputs' bound shapes, run before queueing so that a malformed or oversized model
    is refused synchronously with the engine's code. (The peak over every intermediate needs
    canonicalization; the worker checks it and fails the job with the same code.)"""
    from graph_autofusion.limits import check_input_bytes
    from graph_autofusion.loader import load_model

    try:
        check_input_bytes(load_model(data, config), config)
    except gaf.FusionError as exc:
        # The engine's own code (`model_too_large`, `unsupported_control_flow`, …) and sentence; a
        # refusal of the submitted model is always a 4xx, whatever status the engine suggests.
        status = exc.status if 400 <= exc.status < 500 else 422
        raise ProblemError(exc.code, status, exc.message, **_jsonable(exc.details)) from None
    except MemoryError:
        raise ProblemError(
            "model_too_large", 422, "the model needs more memory to load than the service allows"
        ) from None


def create_job(state: ServiceState, tenant: str, submission: Submission) -> tuple[JobRecord, bool]:
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
    config_data, fusion_config = parse_config(fields.get("config"))
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
                headers={"Retry-After": str(state.settings.retry_after)},
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
        # The load guard runs unless *this* tenant stored the model before: skipping it because
        # another tenant did would answer faster, and so tell that someone else has this model.
        if not state.store.owns(tenant, digest) or not state.blobs.exists(digest):
            check_model(staged.read(), config)
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


def is_job_id(job_id: str) -> bool:
    return job_id.isalnum() and len(job_id) <= 64


def load_job(store: JobStore, tenant: str, job_id: str) -> JobRecord:
    """The tenant's job, or 404 — for another tenant's job exactly as for a missing one."""
    job = store.get(job_id) if is_job_id(job_id) else None
    if job is None or job.tenant != tenant:
        raise ProblemError("not_found", 404, f"no job {job_id!r}")
    return job


def ready_artifact(job: JobRecord, artifact: Artifact | None) -> Artifact:
    if job.status != "succeeded" or artifact is None:
        raise ProblemError(
            "job_not_ready",
            409,
            f"job {job.id} is {job.status}; results exist once it succeeded",
            job_status=job.status,
        )
    return artifact
