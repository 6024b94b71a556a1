"""Real processes for service tests: a private redis-server, workers, the API, and tiny models.

Nothing here is mocked: redis-server is the system binary on a free port in a temp dir, workers
are `python -m autofusion_worker` subprocesses, the API is `python -m autofusion_service serve`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
import uvicorn
from onnx import TensorProto, helper, numpy_helper

from autofusion_service import Settings, create_app

REPO = Path(__file__).resolve().parents[2]
REDIS_SERVER = "/usr/bin/redis-server"

#: Short leases and intervals so that failure handling shows within seconds in tests.
FAST_ENV = {
    "AUTOFUSION_LEASE_SECONDS": "3",
    "AUTOFUSION_HEARTBEAT_INTERVAL": "0.5",
    "AUTOFUSION_SWEEP_INTERVAL": "0.5",
    "AUTOFUSION_BROKER_POLL_INTERVAL": "0.05",
    "AUTOFUSION_SOFT_TIME_LIMIT": "60",
    "AUTOFUSION_HARD_TIME_LIMIT": "90",
    "AUTOFUSION_VISIBILITY_TIMEOUT": "120",
    "AUTOFUSION_LOG_LEVEL": "INFO",
    # No accelerator here: workers of cuda/ascend910 run the Triton kernels in Triton's interpreter.
    "AUTOFUSION_TRITON_INTERPRET": "1",
}
KEYS = {"alice": "alice-key-0123456789", "bob": "bob-key-0123456789"}
API_KEYS = ",".join(f"{t}:{k}" for t, k in KEYS.items())


def auth(tenant: str = "alice") -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(
    predicate: Callable[[], Any], timeout: float, interval: float = 0.05, what: str = "condition"
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def tiny_model(width: int = 16, seed: int = 0, depth: int = 2) -> bytes:
    """A small MLP (MatMul → Add → Relu, `depth` times, then Softmax); `seed` changes the weights,
    which changes the model digest, which makes a new job."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    current = "x"
    for i in range(depth):
        w = numpy_helper.from_array(rng.standard_normal((width, width)).astype(np.float32), f"w{i}")
        b = numpy_helper.from_array(rng.standard_normal(width).astype(np.float32), f"b{i}")
        inits += [w, b]
        nodes += [
            helper.make_node("MatMul", [current, f"w{i}"], [f"mm{i}"], name=f"matmul{i}"),
            helper.make_node("Add", [f"mm{i}", f"b{i}"], [f"add{i}"], name=f"add{i}"),
            helper.make_node("Relu", [f"add{i}"], [f"relu{i}"], name=f"relu{i}"),
        ]
        current = f"relu{i}"
    nodes.append(helper.make_node("Softmax", [current], ["y"], name="softmax", axis=-1))
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def subprocess_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOFUSION_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(FAST_ENV)
    env.update(overrides)
    return env


class RedisServer:
    """A private redis-server; `restart()` keeps its data (append-only file on)."""

    def __init__(self, directory: Path) -> None:
        self.dir, self.port = directory, free_port()
        self.proc: subprocess.Popen | None = None
        self.start()

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        args = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir)]
        args += ["--save", "", "--appendonly", "yes", "--appendfsync", "always", "--databases", "32"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis

        client = redis.Redis(port=self.port)

        def up() -> bool:
            try:
                return bool(client.ping())
            except redis.exceptions.ConnectionError:
                return False

        wait_for(up, 10, what="redis-server")
        client.close()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def restart(self) -> None:
        self.stop()
        self.start()

    def kill(self) -> None:
        """SIGKILL: Redis dies without saving; what survives is what the append-only file holds."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


class Proc:
    """A service subprocess in its own process group, with its output in a log file."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.args, self.env, self.log = args, env, log
        self._out = open(log, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, *args],
            env=env,
            cwd=REPO,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole process group (the worker and its pool children): a host dying."""
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self, timeout: float = 15) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.alive():
            self.kill()
        else:
            with contextlib.suppress(ProcessLookupError):  # stray pool children of a stopped worker
                os.killpg(self.proc.pid, signal.SIGKILL)
        self._out.close()

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def start_worker(env: dict[str, str], log: Path, targets: str = "cpu", *extra: str) -> Proc:
    return Proc(["-m", "autofusion_worker", "--targets", targets, *extra], env, log)


def start_api(env: dict[str, str], log: Path, port: int, *extra: str) -> tuple[Proc, str]:
    proc = Proc(["-m", "autofusion_service", "serve", "--port", str(port), *extra], env, log)
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if not proc.alive():
            raise RuntimeError(f"API exited:\n{proc.output()[-3000:]}")
        try:
            return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(healthy, 60, 0.1, what="the API")
    return proc, base


def wait_for_workers(client: httpx.Client, target: str, count: int = 1, timeout: float = 60) -> None:
    def served() -> bool:
        targets = client.get("/targets", headers=auth()).json()["targets"]
        return any(t["name"] == target and t["workers"] >= count for t in targets)

    wait_for(served, timeout, 0.1, what=f"{count} worker(s) serving {target}")


def submit(
    client: httpx.Client,
    model: bytes,
    tenant: str = "alice",
    config: dict | None = None,
    target: str | None = None,
) -> httpx.Response:
    import json

    data: dict[str, str] = {}
    if config is not None:
        data["config"] = json.dumps(config)
    if target is not None:
        data["target"] = target
    return client.post("/fuse", files={"model": ("m.onnx", model)}, data=data, headers=auth(tenant))


def poll(
    client: httpx.Client,
    job_id: str,
    until: Callable[[dict], bool],
    tenant: str = "alice",
    timeout: float = 60,
) -> dict:
    last: dict = {}

    def check() -> bool:
        nonlocal last
        last = client.get(f"/jobs/{job_id}", headers=auth(tenant)).json()
        return until(last)

    try:
        wait_for(check, timeout, 0.05, what=f"job {job_id}")
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}; last state: {last}") from None
    return last


def finished(job: dict) -> bool:
    return job["status"] in ("succeeded", "failed", "cancelled")


class ThreadedServer:
    """The API app served by uvicorn in a thread of the test process (pure-API tests)."""

    def __init__(self, app: Any) -> None:
        self.port = free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_for(lambda: self.server.started, 10, 0.02, what="uvicorn")
        self.base = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


# --- fixtures (imported by the conftest.py of tests/service, tests/worker and tests/core) ---


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


_next_db = itertools.count(1)


@pytest.fixture
def redis_db(redis_server: RedisServer) -> str:
    """A Redis URL on a database of its own (1-28; the integration modules use 29 and 30)."""
    return redis_server.url(next(_next_db) % 28 + 1)


def fast_settings(data_dir: Path, **overrides: object) -> Settings:
    values = {k.removeprefix("AUTOFUSION_").lower(): v for k, v in FAST_ENV.items()}
    values.update(data_dir=data_dir, api_keys=API_KEYS)
    values.update(overrides)
    return Settings(**values)


@pytest.fixture(scope="module")
def embedded_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedServer]:
    """The API app (embedded mode: SQLite store, file broker) served in-process, with no worker:
    jobs stay queued, which is what the pure-API tests want."""
    settings = fast_settings(tmp_path_factory.mktemp("api"), max_upload_mb=0.5)
    server = ThreadedServer(create_app(settings))
    server.settings = settings
    yield server
    server.stop()


def enqueue_tiny_job(
    settings: Settings, store: Any, target: str, key: str, seed: int, tenant: str = "t"
) -> str:
    """Store a tiny model, record a job for it and publish it, bypassing HTTP (for worker-side tests)."""
    import graph_autofusion as gaf
    from autofusion_core.blobs import BlobStore
    from autofusion_core.queue import JobQueue
    from autofusion_core.store import JobRecord
    from autofusion_core.store.records import new_job_id

    digest, size = BlobStore(settings.blob_dir).put(tiny_model(seed=seed))
    job, created = store.submit(
        JobRecord(
            id=new_job_id(),
            tenant=tenant,
            job_key=key,
            target=target,
            config={},
            model_digest=digest,
            model_size=size,
            model_filename="m.onnx",
            engine_version=gaf.__version__,
        )
    )
    assert created
    queue = JobQueue(settings)
    try:
        queue.publish(job.id, target)
    finally:
        queue.close()
    return job.id
