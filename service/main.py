"""The FastAPI application: wiring only (state, error handlers, the upload limit, routers).

Run it with `autofusion serve`, or `uvicorn --factory autofusion_service.main:create_app`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

import graph_autofusion as gaf
from autofusion_core.blobs import BlobStore
from autofusion_core.files import private_dir
from autofusion_core.queue import JobQueue
from autofusion_core.settings import Settings
from autofusion_core.store import JobStore, open_store

from .auth import load_keyring
from .limits import UploadLimitMiddleware
from .openapi import install_openapi
from .problems import install_problem_handlers
from .routes import routers
from .state import ServiceState

DESCRIPTION = """Operator fusion for ONNX models as a service.

Submit a model to `POST /fuse`, poll `GET /jobs/{id}`, then fetch `/report`, `/model` and `/bundle`.
Every request but the probes needs `Authorization: Bearer <api key>`; every error is an RFC 9457
problem (`application/problem+json`) with a stable `code`."""


def create_app(
    settings: Settings | None = None, *, store: JobStore | None = None, queue: JobQueue | None = None
) -> FastAPI:
    settings = settings or Settings()
    private_dir(settings.data_dir)
    state = ServiceState(
        settings=settings,
        store=store or open_store(settings),
        blobs=BlobStore(settings.blob_dir),
        queue=queue or JobQueue(settings),
        keyring=load_keyring(settings),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        state.close()

    app = FastAPI(
        title="graph-autofusion", version=gaf.__version__, description=DESCRIPTION, lifespan=lifespan
    )
    app.state.autofusion = state
    logging.getLogger("autofusion_service").setLevel(settings.log_level.upper())
    install_problem_handlers(app)
    app.add_middleware(UploadLimitMiddleware, max_bytes=settings.max_upload_bytes)
    for router in routers:
        app.include_router(router)
    install_openapi(app)
    return app
