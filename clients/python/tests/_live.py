"""A real service process on loopback for the live tests (started by the fixture in conftest.py)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

API_KEYS = {"tenant-a": "key-a", "tenant-b": "key-b"}
READY_TIMEOUT = 90.0
UPLOAD_LIMIT_MB = 4  # above the zoo MLP (about 2 MiB), so the 413 test stays cheap


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class LiveService:
    """One running service process and how to reach it."""

    port: int
    data_dir: Path
    log_path: Path
    env_overrides: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def key(self) -> str:
        return API_KEYS["tenant-a"]

    def start(self) -> None:
        env = {
            **os.environ,
            "AUTOFUSION_API_KEYS": ",".join(f"{t}:{k}" for t, k in API_KEYS.items()),
            "AUTOFUSION_MAX_UPLOAD_MB": str(UPLOAD_LIMIT_MB),
            "PYTHONUNBUFFERED": "1",
            **self.env_overrides,
        }
        env.pop("AUTOFUSION_REDIS_URL", None)  # embedded mode
        if _in_checkout():
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        command = [
            sys.executable, "-m", "autofusion_service", "serve",
            "--host", "127.0.0.1", "--port", str(self.port), "--data-dir", str(self.data_dir),
        ]  # fmt: skip
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"service exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"service not ready after {timeout}s:\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM the process group we created (API and worker), then SIGKILL whatever lingers.

        The group is ours alone (``start_new_session``), so nothing else can be hit; killing it
        whole keeps a worker that is slow to shut down from outliving the test session.
        """
        if self.process is None:
            return
        group = self.process.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=15)
        deadline = time.monotonic() + 3
        while _group_alive(group) and time.monotonic() < deadline:
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)
        self.process = None

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""


# In a checkout of the whole project the service sits three levels up; it may not be installed (yet).
REPO_ROOT = Path(__file__).resolve().parents[3]


def _in_checkout() -> bool:
    return (REPO_ROOT / "service" / "__main__.py").is_file()


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def service_available() -> bool:
    return _in_checkout() or importlib.util.find_spec("autofusion_service") is not None


def new_service(tmp_path_factory: pytest.TempPathFactory, name: str, **env: str) -> LiveService:
    root = tmp_path_factory.mktemp(name)
    return LiveService(free_port(), root / "data", root / "service.log", env_overrides=env)
