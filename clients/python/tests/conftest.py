"""Fixtures that run the client against a real service on loopback.

`live_service` starts ``python -m autofusion_service serve`` (the embedded mode: API and a worker on
local files) in a subprocess on a free port, once per session, and waits for ``/readyz``. The tests
that need it are skipped only where the service package is not installed at all, i.e. when this
client is tested on its own.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ._live import LiveService, new_service, service_available


@pytest.fixture(scope="session")
def live_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveService]:
    if not service_available():
        pytest.skip("autofusion_service is not installed (client-only environment)")
    service = new_service(tmp_path_factory, "service")
    service.start()
    try:
        service.wait_ready()
        yield service
    finally:
        service.stop()
