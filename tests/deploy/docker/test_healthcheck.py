"""deploy/docker/healthcheck.py against the real app and a real (SQLite) job store."""

from __future__ import annotations

import importlib.util
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests" / "service"))

from harness import ThreadedServer, fast_settings, free_port  # noqa: E402

from autofusion_core.settings import Settings  # noqa: E402
from autofusion_core.store import WorkerInfo, open_store  # noqa: E402
from autofusion_service.main import create_app  # noqa: E402


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "healthcheck", REPO / "deploy" / "docker" / "healthcheck.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


healthcheck = _load()


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedServer]:
    """The app with no worker: alive (/healthz 200) but not ready (/readyz 503)."""
    server = ThreadedServer(create_app(fast_settings(tmp_path_factory.mktemp("api"))))
    yield server
    server.stop()


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in list(Settings.model_fields):
        monkeypatch.delenv(f"AUTOFUSION_{name.upper()}", raising=False)
    monkeypatch.setenv("AUTOFUSION_DATA_DIR", str(tmp_path))
    return tmp_path


def _beat(data_dir: Path, hostname: str, ttl: float = 30.0) -> None:
    store = open_store(Settings(data_dir=data_dir))
    worker = WorkerInfo(
        id=f"cpu@{hostname}-1", hostname=hostname, pid=1, targets=["cpu"], last_seen=time.time()
    )
    store.heartbeat(worker, ttl=ttl)
    store.close()


def test_http_check_follows_the_status_code(api: ThreadedServer) -> None:
    assert healthcheck.check_http("/healthz", api.port)[0] is True
    ok, why = healthcheck.check_http("/readyz", api.port)
    assert ok is False and "503" in why
    assert healthcheck.main(["http", "/healthz", "--port", str(api.port)]) == 0
    assert healthcheck.main(["http", "/readyz", "--port", str(api.port)]) == 1


def test_http_check_fails_when_nothing_listens() -> None:
    assert healthcheck.check_http("/healthz", free_port())[0] is False


def test_worker_check_wants_a_heartbeat_from_this_host(data_dir: Path) -> None:
    ok, why = healthcheck.check_worker(allow_store_down=False)
    assert ok is False and "no live heartbeat" in why
    _beat(data_dir, "some-other-host")
    assert healthcheck.check_worker(allow_store_down=False)[0] is False
    _beat(data_dir, socket.gethostname())
    ok, why = healthcheck.check_worker(allow_store_down=False)
    assert ok is True and "cpu" in why
    assert healthcheck.main(["worker"]) == 0


def test_worker_check_ignores_an_expired_heartbeat(data_dir: Path) -> None:
    _beat(data_dir, socket.gethostname(), ttl=-1.0)
    assert healthcheck.check_worker(allow_store_down=False)[0] is False


def test_store_outage_fails_readiness_but_not_liveness(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTOFUSION_REDIS_URL", f"redis://127.0.0.1:{free_port()}/0")  # nothing listens
    ok, why = healthcheck.check_worker(allow_store_down=False)
    assert ok is False and "unreachable" in why
    assert healthcheck.check_worker(allow_store_down=True)[0] is True
    assert healthcheck.main(["worker"]) == 1
    assert healthcheck.main(["worker", "--allow-store-down"]) == 0
