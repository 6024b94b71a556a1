"""`GET /artifacts/{digest}`: any blob the caller's jobs produced or the caller uploaded."""

from __future__ import annotations

from fastapi import APIRouter, Response

from autofusion_core.blobs import is_digest
from autofusion_core.store import Artifact

from ..deps import State, Tenant
from ..problems import ProblemError, problem_responses
from .jobs import _DOWNLOAD_HEADERS, blob_response

router = APIRouter(tags=["artifacts"])


@router.get(
    "/artifacts/{digest}",
    summary="A stored artifact by its sha256",
    responses={
        200: {
            "description": "The artifact's bytes.",
            "headers": _DOWNLOAD_HEADERS,
            "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        },
        **problem_responses(401, 404, 503),
    },
    response_class=Response,
)
def get_artifact(digest: str, state: State, tenant: Tenant) -> Response:
    if not is_digest(digest) or not state.store.owns(tenant, digest) or not state.blobs.exists(digest):
        raise ProblemError("not_found", 404, f"no artifact {digest!r}")
    artifact = Artifact(digest=digest, size=state.blobs.size(digest))
    return blob_response(state.blobs, artifact, "application/octet-stream")
