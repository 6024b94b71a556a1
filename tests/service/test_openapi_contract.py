"""Schemathesis against /openapi.json: generated requests never get a 500, and every response
matches its documented status code, media type, headers and schema. Bounded to a few examples per
operation so it stays a CI test."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import schemathesis
from harness import KEYS, fast_settings
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from autofusion_service import create_app

_DATA = Path(tempfile.mkdtemp(prefix="autofusion-schemathesis-"))
atexit.register(shutil.rmtree, _DATA, ignore_errors=True)
app = create_app(fast_settings(_DATA, max_upload_mb=0.2))
schema = schemathesis.openapi.from_asgi("/openapi.json", app)
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


@schema.parametrize()
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_api_conforms_to_its_openapi(case: schemathesis.Case) -> None:
    headers = {"Authorization": f"Bearer {KEYS['alice']}"}
    # /readyz answers its documented 503 here: this app has no worker
    checks = CHECKS[1:] if case.operation.path == "/readyz" else CHECKS
    case.call_and_validate(headers=headers, checks=checks)
