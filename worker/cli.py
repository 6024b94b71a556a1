"""`autofusion worker --targets cpu`: start a Celery worker serving the queues of some targets."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from typing import Any

from autofusion_core.settings import Settings


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register `worker` on the `autofusion` command line (calls `args.func(args)` → exit code)."""
    p = subparsers.add_parser("worker", help="run a fusion worker (needs AUTOFUSION_REDIS_URL or --data-dir)")
    p.add_argument("--targets", default="cpu", help="comma-separated targets to serve (default: cpu)")
    p.add_argument("--concurrency", type=int, default=None, help="job processes (default: settings, 1)")
    p.add_argument("--data-dir", default=None, help="data dir (blobs; embedded store and broker)")
    p.add_argument("--log-level", default=None, help="log level (default: AUTOFUSION_LOG_LEVEL)")
    p.add_argument(
        "--interpret",
        action="store_true",
        help="cuda/ascend910: run the Triton kernels in Triton's CPU interpreter, no device needed "
        "(AUTOFUSION_TRITON_INTERPRET=1; for CI and hosts without the accelerator)",
    )
    p.set_defaults(func=worker_command)


def worker_command(args: argparse.Namespace) -> int:
    # Child processes read Settings() from the environment, so overrides go there.
    if args.data_dir:
        os.environ["AUTOFUSION_DATA_DIR"] = str(args.data_dir)
    if args.log_level:
        os.environ["AUTOFUSION_LOG_LEVEL"] = args.log_level
    if args.concurrency:
        os.environ["AUTOFUSION_WORKER_CONCURRENCY"] = str(args.concurrency)
    if args.interpret:
        os.environ["AUTOFUSION_TRITON_INTERPRET"] = "1"
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    return run_worker(Settings(), targets)


def apply_engine_environment(settings: Settings) -> None:
    """Put the engine's settings (ISA, compiler, kernel cache, BLAS threads, Triton's interpreter)
    into this process's environment, where the engine reads them; the job processes inherit it.
    Triton's own binary cache goes beside the engine's kernel cache (shared by the workers of a
    volume, keyed by content like it) unless TRITON_CACHE_DIR is set already."""
    os.environ.update(settings.engine_environment())
    os.environ.setdefault("TRITON_CACHE_DIR", str((settings.kernel_cache_dir / "triton-binaries").resolve()))


def check_toolchains(settings: Settings, targets: list[str]) -> dict[str, dict[str, str]] | None:
    """The start-up check of every target's toolchain and device (`toolchain.py`); None, after a
    one-line message on stderr, when one is missing."""
    from .toolchain import ToolchainMissing, check_targets, interpret_requested

    try:
        return check_targets(targets, interpret=interpret_requested(settings.triton_interpret))
    except ToolchainMissing as exc:
        print(f"autofusion worker: {exc}", file=sys.stderr)
        return None


def stop_consuming(consumers: list[Any]) -> None:
    """Cancel the task consumer of a worker that was told to stop.

    Celery's warm shutdown lets the running job finish but only leaves its event loop after that;
    with a polling transport (kombu's file-system broker of embedded mode) the loop meanwhile keeps
    fetching, so the next message would be taken — and started — as soon as the running job is
    acknowledged, only to be killed when `autofusion serve` stops the worker. Cancelling the consumer
    ends fetching at once; kombu hands a message that arrives for a cancelled consumer back to the
    queue. (The Redis transport's event loop checks for shutdown before each fetch, so Celery's own
    handling suffices there.)"""
    for consumer in consumers:
        task_consumer = getattr(consumer, "task_consumer", None)
        if task_consumer is None:
            continue
        try:
            task_consumer.cancel()
        except Exception:  # the connection may be gone already; then nothing is being fetched
            logging.getLogger("autofusion_worker").warning("could not cancel the consumer", exc_info=True)


def run_worker(settings: Settings, targets: list[str]) -> int:
    from celery.signals import worker_ready, worker_shutdown, worker_shutting_down

    from autofusion_core.files import private_dir, private_umask
    from autofusion_core.queue import JobQueue, queue_name
    from autofusion_core.store import open_store
    from autofusion_core.targets import TARGETS

    from .app import make_celery
    from .consumer import watch_consumer
    from .heartbeat import Heartbeat
    from .toolchain import EXIT_TOOLCHAIN

    unknown = [t for t in targets if t not in TARGETS]
    if unknown or not targets:
        print(f"autofusion worker: unknown target(s) {unknown}; known: {sorted(TARGETS)}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    private_umask()
    private_dir(settings.data_dir)
    apply_engine_environment(settings)
    found = check_toolchains(settings, targets)
    if found is None:
        return EXIT_TOOLCHAIN
    for target, parts in found.items():
        if parts:
            logging.getLogger("autofusion_worker").info(
                "target %s: %s", target, ", ".join(f"{k} {v}" for k, v in parts.items())
            )
    app = make_celery(settings, targets)
    name = f"{'+'.join(targets)}@{socket.gethostname()}-{os.getpid()}"
    heartbeat = Heartbeat(
        settings,
        open_store(settings),
        JobQueue(settings, app),
        name,
        targets,
        settings.worker_concurrency,
        watch=watch_consumer(app),
        modes={t: found[t].get("mode", "device") for t in targets},
    )
    consumers: list[Any] = []

    def on_ready(sender: Any = None, **_: Any) -> None:
        consumers.append(sender)  # Celery's Consumer: its task consumer is cancelled on shutdown
        heartbeat.start()

    def on_shutting_down(**_: Any) -> None:
        # Runs in the SIGTERM/SIGINT handler of the main process, before the warm shutdown.
        heartbeat.drain()
        if settings.embedded:
            stop_consuming(consumers)

    worker_ready.connect(on_ready, weak=False)
    worker_shutting_down.connect(on_shutting_down, weak=False)
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
