"""`autofusion serve`: the API, plus — with no Redis configured — a worker on local files.

Embedded mode (no `AUTOFUSION_REDIS_URL`) is the one-command setup: SQLite job store, blob dir and a
file-system Celery broker under `--data-dir`, and one `autofusion worker --targets cpu` child
process running the same task code as a distributed deployment. With a Redis URL it serves the API
only; workers are started separately.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Any

from autofusion_core.settings import Settings

if TYPE_CHECKING:
    import uvicorn


#: Seconds the API waits for requests in flight after SIGTERM before closing their connections.
DEFAULT_DRAIN_TIMEOUT = 30
#: Seconds `serve` waits for its embedded worker's warm shutdown (its running job) before killing it.
DEFAULT_WORKER_DRAIN_TIMEOUT = 60


def default_api_workers() -> int:
    """One API process per two usable cores (at least one, at most four): status polls are cheap, so
    a few processes saturate a host long before the workers' compilations stop competing with them."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(4, cores // 2))


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register `serve` on the `autofusion` command line (calls `args.func(args)` → exit code)."""
    p = subparsers.add_parser("serve", help="run the fusion service (embedded worker unless Redis is set)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    p.add_argument(
        "--data-dir", default=None, help="data dir (default: AUTOFUSION_DATA_DIR or ./.autofusion)"
    )
    p.add_argument("--targets", default="cpu", help="targets of the embedded worker (default: cpu)")
    p.add_argument("--no-worker", action="store_true", help="embedded mode: do not start a worker")
    p.add_argument(
        "--interpret",
        action="store_true",
        help="embedded worker: run cuda/ascend910 kernels in Triton's CPU interpreter "
        "(AUTOFUSION_TRITON_INTERPRET=1)",
    )
    p.add_argument(
        "--api-workers",
        type=int,
        default=None,
        help="API processes (uvicorn workers; default: 1 in embedded mode, else one per two cores, ≤ 4)",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=DEFAULT_DRAIN_TIMEOUT,
        help="seconds the API lets requests in flight finish after SIGTERM/SIGINT "
        f"(uvicorn's graceful-shutdown timeout; default {DEFAULT_DRAIN_TIMEOUT})",
    )
    p.add_argument(
        "--worker-drain-timeout",
        type=float,
        default=DEFAULT_WORKER_DRAIN_TIMEOUT,
        help="embedded mode: seconds the worker may take to finish its running job on shutdown before "
        f"it is killed (default {DEFAULT_WORKER_DRAIN_TIMEOUT})",
    )
    p.add_argument("--log-level", default=None, help="log level (default: AUTOFUSION_LOG_LEVEL)")
    p.set_defaults(func=serve_command)


def serve_command(args: argparse.Namespace) -> int:
    if args.data_dir:
        os.environ["AUTOFUSION_DATA_DIR"] = str(args.data_dir)
    if args.log_level:
        os.environ["AUTOFUSION_LOG_LEVEL"] = args.log_level
    if args.interpret:
        os.environ["AUTOFUSION_TRITON_INTERPRET"] = "1"  # the embedded worker inherits it
    settings = Settings()
    return serve(
        settings,
        args.host,
        args.port,
        targets=args.targets,
        worker=not args.no_worker,
        api_workers=args.api_workers,
        drain_timeout=args.drain_timeout,
        worker_drain_timeout=args.worker_drain_timeout,
    )


def uvicorn_config(
    settings: Settings, host: str, port: int, *, api_workers: int = 1, drain_timeout: float | None = None
) -> uvicorn.Config:
    """The server configuration: uvloop and httptools (the fast event loop and HTTP parser), the
    drain timeout, and with several processes the app built by each from the same environment."""
    import uvicorn

    options: dict[str, Any] = {
        "host": host,
        "port": port,
        "loop": "uvloop",
        "http": "httptools",
        "log_level": settings.log_level.lower(),
        "timeout_graceful_shutdown": None if drain_timeout is None else max(0, round(drain_timeout)),
    }
    if api_workers > 1:
        os.environ["AUTOFUSION_DATA_DIR"] = str(settings.data_dir.resolve())
        return uvicorn.Config(
            "autofusion_service.main:create_app", factory=True, workers=api_workers, **options
        )
    from .main import create_app

    return uvicorn.Config(create_app(settings), **options)


def _server(config: uvicorn.Config, on_exit_signal: Callable[[], None]) -> uvicorn.Server:
    """uvicorn's server, telling `serve` the moment a shutdown signal arrives, so that the embedded
    worker drains while the API does (not only after it)."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            super().handle_exit(sig, frame)
            on_exit_signal()

    return Server(config)


@dataclass
class _Shutdown:
    """Shutdown signals `serve` saw outside uvicorn's own handling, and the server to tell."""

    received: list[int] = field(default_factory=list)
    server: uvicorn.Server | None = None

    def handle(self, sig: int, frame: FrameType | None) -> None:
        self.received.append(sig)
        if self.server is not None:
            self.server.handle_exit(sig, frame)  # idempotent once it is shutting down


@contextlib.contextmanager
def _signals_end_serving() -> Iterator[_Shutdown]:
    """Handle SIGTERM/SIGINT outside uvicorn's own handling too.

    uvicorn installs its handlers while it serves and, once it has drained, restores the previous
    ones and raises the signal again, "to trigger the expected behaviour". With the default handlers
    that kills `serve` before it has stopped its worker. Here the previous handler records the signal
    (and passes it to the server, for one that arrives before uvicorn's handlers are in place), so
    `serve` stops its worker and exits normally."""
    shutdown = _Shutdown()
    handled = (signal.SIGTERM, signal.SIGINT)
    previous = {sig: signal.signal(sig, shutdown.handle) for sig in handled}
    try:
        yield shutdown
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def serve(
    settings: Settings,
    host: str,
    port: int,
    *,
    targets: str = "cpu",
    worker: bool = True,
    api_workers: int | None = None,
    drain_timeout: float | None = DEFAULT_DRAIN_TIMEOUT,
    worker_drain_timeout: float = DEFAULT_WORKER_DRAIN_TIMEOUT,
) -> int:
    from uvicorn.supervisors import Multiprocess

    from autofusion_core.files import private_dir, private_umask

    from .auth import DEFAULT_TENANT, KEY_FILE, ensure_key

    if api_workers is None:
        # SQLite and the file broker are meant for one API process; Redis mode scales out.
        api_workers = 1 if settings.embedded else default_api_workers()
    private_umask()
    private_dir(settings.data_dir)
    key = ensure_key(settings)
    if key is not None:
        print(
            f"Created an API key for tenant '{DEFAULT_TENANT}' (shown only now; its hash is in "
            f"{settings.data_dir / KEY_FILE}):\n  {key}",
            flush=True,
        )
    with _signals_end_serving() as shutdown:
        supervisor: WorkerSupervisor | None = None
        if settings.embedded and worker:
            env = {**os.environ, "AUTOFUSION_DATA_DIR": str(settings.data_dir.resolve())}
            supervisor = WorkerSupervisor(
                [sys.executable, "-m", "autofusion_worker", "--targets", targets], env
            )
            supervisor.start()
        mode = (
            "embedded (SQLite + file broker, one local worker)" if settings.embedded else "API only (Redis)"
        )
        print(
            f"autofusion serve: {mode}; {api_workers} API process(es); data dir "
            f"{settings.data_dir.resolve()}",
            flush=True,
        )
        try:
            config = uvicorn_config(
                settings, host, port, api_workers=api_workers, drain_timeout=drain_timeout
            )
            if api_workers > 1:
                if not shutdown.received:
                    Multiprocess(config, sockets=[config.bind_socket()]).run()
            else:
                shutdown.server = _server(config, supervisor.begin_stop if supervisor else lambda: None)
                if shutdown.received:  # a signal before the server existed: start and stop at once
                    shutdown.server.should_exit = True
                shutdown.server.run()
        finally:
            if supervisor is not None:
                supervisor.stop(timeout=worker_drain_timeout)
    return 0


def _die_with_parent() -> None:
    """Linux: the embedded worker gets SIGTERM when `serve` dies, even by SIGKILL (no orphans)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


#: Exit statuses of a worker that cannot start as configured (an unknown target; a target whose
#: toolchain or device is missing): restarting it would only repeat its message every two seconds.
WORKER_CANNOT_START = frozenset({2, 3})


class WorkerSupervisor(threading.Thread):
    """Keeps the embedded worker process running: a worker that dies (a model crashed it, it was
    killed) is restarted, and the job it held is picked up again through the lease sweep. A worker
    that refused to start (`WORKER_CANNOT_START`: it printed why) is not restarted; the API goes on
    serving, and jobs wait (`waiting_for_worker`) until `serve` is restarted as it should be."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        super().__init__(name="autofusion-worker-supervisor", daemon=True)
        self.args, self.env = args, env
        self.child: subprocess.Popen | None = None
        self._stopping = threading.Event()
        self._signalled: set[int] = set()

    def run(self) -> None:
        while not self._stopping.is_set():
            self.child = subprocess.Popen(self.args, env=self.env, preexec_fn=_die_with_parent)
            if self._stopping.is_set():  # stop() came while it started: it may have missed it
                self.begin_stop()
            started = time.monotonic()
            self.child.wait()
            if self._stopping.is_set():
                return
            if self.child.returncode in WORKER_CANNOT_START:
                print(
                    f"autofusion serve: the worker cannot start (exit status {self.child.returncode}, "
                    "its message is above); not restarting it — the API serves, jobs wait",
                    flush=True,
                )
                return
            # wait before restarting: a crash loop should not spin
            if self._stopping.wait(max(1.0, 2.0 - (time.monotonic() - started))):
                return
            print(f"autofusion serve: worker exited ({self.child.returncode}); restarting", flush=True)

    def begin_stop(self) -> None:
        """Start the worker's warm shutdown (it finishes its running job and takes no other) without
        waiting; called from a signal handler, so it only sends a signal."""
        self._stopping.set()
        child = self.child
        if child is not None and child.poll() is None and child.pid not in self._signalled:
            self._signalled.add(child.pid)  # once: Celery treats each SIGTERM as a new request
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = DEFAULT_WORKER_DRAIN_TIMEOUT) -> None:
        """Warm shutdown (the running job finishes), then kill after `timeout` seconds."""
        self.begin_stop()
        self.join(timeout)  # returns when the worker has exited
        child = self.child
        if child is not None and child.poll() is None:
            print(f"autofusion serve: the worker did not stop within {timeout:g} s; killing it", flush=True)
            child.kill()
            child.wait()
        self.join(5)
