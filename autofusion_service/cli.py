"""`autofusion serve`: the API, plus — with no Redis configured — a worker on local files.

Embedded mode (no `AUTOFUSION_REDIS_URL`) is the one-command setup: SQLite job store, blob dir and a
file-system Celery broker under `--data-dir`, and one `autofusion worker --targets cpu` child
process running the same task code as a distributed deployment. With a Redis URL it serves the API
only; workers are started separately.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time

from .settings import Settings


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
    p.add_argument("--api-workers", type=int, default=1, help="API processes (uvicorn workers; default 1)")
    p.add_argument("--log-level", default=None, help="log level (default: AUTOFUSION_LOG_LEVEL)")
    p.set_defaults(func=serve_command)


def serve_command(args: argparse.Namespace) -> int:
    if args.data_dir:
        os.environ["AUTOFUSION_DATA_DIR"] = str(args.data_dir)
    if args.log_level:
        os.environ["AUTOFUSION_LOG_LEVEL"] = args.log_level
    settings = Settings()
    return serve(
        settings,
        args.host,
        args.port,
        targets=args.targets,
        worker=not args.no_worker,
        api_workers=args.api_workers,
    )


def serve(
    settings: Settings,
    host: str,
    port: int,
    *,
    targets: str = "cpu",
    worker: bool = True,
    api_workers: int = 1,
) -> int:
    import uvicorn

    from .auth import DEFAULT_TENANT, KEY_FILE, ensure_key
    from .main import create_app

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    key = ensure_key(settings)
    if key is not None:
        print(
            f"Created an API key for tenant '{DEFAULT_TENANT}' (shown only now; its hash is in "
            f"{settings.data_dir / KEY_FILE}):\n  {key}",
            flush=True,
        )
    supervisor: WorkerSupervisor | None = None
    if settings.embedded and worker:
        env = {**os.environ, "AUTOFUSION_DATA_DIR": str(settings.data_dir.resolve())}
        supervisor = WorkerSupervisor([sys.executable, "-m", "autofusion_worker", "--targets", targets], env)
        supervisor.start()
    mode = "embedded (SQLite + file broker, one local worker)" if settings.embedded else "API only (Redis)"
    print(f"autofusion serve: {mode}; data dir {settings.data_dir.resolve()}", flush=True)
    try:
        if api_workers > 1:  # separate processes build the app from the same environment
            os.environ["AUTOFUSION_DATA_DIR"] = str(settings.data_dir.resolve())
            uvicorn.run(
                "autofusion_service.main:create_app",
                factory=True,
                host=host,
                port=port,
                workers=api_workers,
                log_level=settings.log_level.lower(),
            )
        else:
            uvicorn.run(create_app(settings), host=host, port=port, log_level=settings.log_level.lower())
    finally:
        if supervisor is not None:
            supervisor.stop()
    return 0


def _die_with_parent() -> None:
    """Linux: the embedded worker gets SIGTERM when `serve` dies, even by SIGKILL (no orphans)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


class WorkerSupervisor(threading.Thread):
    """Keeps the embedded worker process running: a worker that dies (a model crashed it, it was
    killed) is restarted, and the job it held is picked up again through the lease sweep."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        super().__init__(name="autofusion-worker-supervisor", daemon=True)
        self.args, self.env = args, env
        self.child: subprocess.Popen | None = None
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.is_set():
            self.child = subprocess.Popen(self.args, env=self.env, preexec_fn=_die_with_parent)
            started = time.monotonic()
            self.child.wait()
            if self._stopping.is_set():
                return
            # wait before restarting: during shutdown the worker exits first (same process group),
            # and a crash loop should not spin
            if self._stopping.wait(max(1.0, 2.0 - (time.monotonic() - started))):
                return
            print(f"autofusion serve: worker exited ({self.child.returncode}); restarting", flush=True)

    def stop(self) -> None:
        """Warm shutdown (a running job finishes or hands its message back), then kill."""
        self._stopping.set()
        child = self.child
        if child is None or child.poll() is not None:
            return
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(timeout=15)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
