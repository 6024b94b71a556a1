"""`autofusion worker --targets cpu`: start a Celery worker serving the queues of some targets."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys

from autofusion_service.settings import Settings


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register `worker` on the `autofusion` command line (calls `args.func(args)` → exit code)."""
    p = subparsers.add_parser("worker", help="run a fusion worker (needs AUTOFUSION_REDIS_URL or --data-dir)")
    p.add_argument("--targets", default="cpu", help="comma-separated targets to serve (default: cpu)")
    p.add_argument("--concurrency", type=int, default=None, help="job processes (default: settings, 1)")
    p.add_argument("--data-dir", default=None, help="data dir (blobs; embedded store and broker)")
    p.add_argument("--log-level", default=None, help="log level (default: AUTOFUSION_LOG_LEVEL)")
    p.set_defaults(func=worker_command)


def worker_command(args: argparse.Namespace) -> int:
    # Child processes read Settings() from the environment, so overrides go there.
    if args.data_dir:
        os.environ["AUTOFUSION_DATA_DIR"] = str(args.data_dir)
    if args.log_level:
        os.environ["AUTOFUSION_LOG_LEVEL"] = args.log_level
    if args.concurrency:
        os.environ["AUTOFUSION_WORKER_CONCURRENCY"] = str(args.concurrency)
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    return run_worker(Settings(), targets)


def run_worker(settings: Settings, targets: list[str]) -> int:
    from celery.signals import worker_ready, worker_shutdown

    from autofusion_service.store import open_store

    from .app import make_celery, queue_name
    from .heartbeat import Heartbeat
    from .queue import JobQueue
    from .targets import TARGETS

    unknown = [t for t in targets if t not in TARGETS]
    if unknown or not targets:
        print(f"autofusion worker: unknown target(s) {unknown}; known: {sorted(TARGETS)}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    app = make_celery(settings, targets)
    name = f"{'+'.join(targets)}@{socket.gethostname()}-{os.getpid()}"
    heartbeat = Heartbeat(
        settings, open_store(settings), JobQueue(settings, app), name, targets, settings.worker_concurrency
    )
    worker_ready.connect(lambda **_: heartbeat.start(), weak=False)
    worker_shutdown.connect(lambda **_: heartbeat.stop(), weak=False)
    argv = [
        "worker",
        "--queues",
        ",".join(queue_name(t) for t in targets),
        "--concurrency",
        str(settings.worker_concurrency),
        "--loglevel",
        settings.log_level.upper(),
        "--hostname",
        name,
        "--pool",
        "prefork",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    ]
    app.worker_main(argv)
    return 0
