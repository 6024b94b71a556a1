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


async def require_tenant(
    state: State, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> str:
    tenant = state.keyring.tenant_for(credentials.credentials) if credentials else None
    if tenant is None:
        detail = "invalid API key" if credentials else "missing 'Authorization: Bearer <api key>' header"
        raise ProblemError("unauthorized", 401, detail, headers={"WWW-Authenticate": "Bearer"})
    return tenant


Tenant = Annotated[str, Depends(require_tenant)]
