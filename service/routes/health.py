"""Probes and metrics: `/healthz` (process up), `/readyz` (store, broker, a worker), `/metrics`."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST

import graph_autofusion as gaf

from ..deps import State
from ..metrics import render
from ..problems import ProblemError, problem_responses
from ..schemas import Health, Readiness

router = APIRouter(tags=["operations"])


@router.get("/healthz", response_model=Health, summary="Liveness")
def healthz() -> Health:
    return Health(status="ok", version=gaf.__version__)


@router.get(
    "/readyz",
    response_model=Readiness,
    summary="Readiness: store, broker and a live worker",
    responses=problem_responses(503),
)
def readyz(state: State) -> Readiness:
    store_ok = state.store.ping()
    broker_ok = state.queue.ping()
    workers = len(state.store.workers()) if store_ok else 0
    if not (store_ok and broker_ok and workers):
        missing = [
            name for name, ok in (("store", store_ok), ("broker", broker_ok), ("worker", workers)) if not ok
        ]
        raise ProblemError(
            "not_ready",
            503,
            f"not ready: no reachable {', '.join(missing)}",
            store=store_ok,
            broker=broker_ok,
            workers=workers,
        )
    return Readiness(status="ready", store=store_ok, broker=broker_ok, workers=workers)


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=PlainTextResponse,
    responses={
        200: {
            "description": "Prometheus text format.",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
        **problem_responses(503),
    },
)
def metrics(state: State) -> PlainTextResponse:
    return PlainTextResponse(render(state.store), media_type=CONTENT_TYPE_LATEST)
