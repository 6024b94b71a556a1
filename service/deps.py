"""Request dependencies as `Annotated` aliases: `State` (shared handles) and `Tenant` (the caller)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from .problems import ProblemError
from .state import ServiceState

_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer <key>`.")


async def get_state(request: Request) -> ServiceState:
    return request.app.state.autofusion


State = Annotated[ServiceState, Depends(get_state)]


def _tenant_for(state: ServiceState, key: str | None) -> str:
    tenant = state.keyring.tenant_for(key) if key else None
    if tenant is None:
        detail = "invalid API key" if key else "missing 'Authorization: Bearer <api key>' header"
        raise ProblemError("unauthorized", 401, detail, headers={"WWW-Authenticate": "Bearer"})
    return tenant


async def require_tenant(
    state: State, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> str:
    return _tenant_for(state, credentials.credentials if credentials else None)


#: OpenAPI `security` of a route that authenticates with `tenant_of` instead of the `Tenant` dependency.
BEARER_SECURITY: list[dict[str, list[str]]] = [{"HTTPBearer": []}]


def tenant_of(request: Request) -> tuple[ServiceState, str]:
    """The shared state and the caller's tenant, read straight from the request.

    The same check as the `Tenant` dependency, for the status route that every client polls: FastAPI
    resolving the nested `State`/`HTTPBearer`/`Tenant` dependencies costs about half of that
    request's time, so that route declares `BEARER_SECURITY` in its OpenAPI entry and calls this."""
    state: ServiceState = request.app.state.autofusion
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    return state, _tenant_for(state, key.strip() if scheme.lower() == "bearer" else None)


Tenant = Annotated[str, Depends(require_tenant)]
