"""Health checks for the container images, run by Docker's HEALTHCHECK and Kubernetes exec probes.

    python healthcheck.py http [PATH] [--port N]     GET http://127.0.0.1:N/PATH answers 200
    python healthcheck.py worker [--allow-store-down] a live heartbeat from a worker on this host

Exit status 0 means healthy, 1 unhealthy, 2 a usage error.

Why Python: the slim images carry no curl or wget. Why a worker is checked through the job store: it
has no HTTP port and runs with Celery's remote control off (`celery inspect ping` cannot answer),
while its heartbeat is exactly what the API uses to decide that a target is served, so a container
whose heartbeat lapsed is one the service already treats as gone. `--allow-store-down` is for
liveness probes: a Redis outage is not the worker's fault, and restarting every worker during one
would only add load when Redis comes back.
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import urllib.error
import urllib.request

TIMEOUT_S = 3.0


def check_http(path: str, port: int) -> tuple[bool, str]:
    """Is `path` on the local API answering 200?"""
    url = f"http://127.0.0.1:{port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            return response.status == 200, f"{url}: {response.status}"
    except urllib.error.HTTPError as exc:
        return False, f"{url}: {exc.code}"
    except OSError as exc:
        return False, f"{url}: {exc}"


def check_worker(allow_store_down: bool, hostname: str | None = None) -> tuple[bool, str]:
    """Has a worker process on this host (container) a live heartbeat in the job store?"""
    from autofusion_core.settings import Settings
    from autofusion_core.store import WorkerInfo, open_store

    hostname = hostname or socket.gethostname()
    store = open_store(Settings())
    found: list[list[WorkerInfo]] = []

    def read() -> None:
        if store.ping():
            found.append(store.workers())

    # A black-holed Redis would block the client for the OS's TCP timeout; the probe must answer.
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(TIMEOUT_S)
    if not found:
        return allow_store_down, "job store unreachable"
    store.close()
    workers = found[0]
    mine = [w for w in workers if w.hostname == hostname]
    if not mine:
        return False, f"no live heartbeat from host {hostname!r} ({len(workers)} other worker(s) live)"
    targets = sorted({t for w in mine for t in w.targets})
    return True, f"{len(mine)} worker(s) on {hostname!r} serving {targets}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="healthcheck.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="kind", required=True)
    http = sub.add_parser("http", help="the API answers 200 on PATH")
    http.add_argument("path", nargs="?", default="/healthz")
    http.add_argument("--port", type=int, default=8000)
    worker = sub.add_parser("worker", help="a worker on this host has a live heartbeat")
    worker.add_argument("--allow-store-down", action="store_true")
    args = parser.parse_args(argv)
    if args.kind == "http":
        if not args.path.startswith("/"):
            parser.error(f"PATH must start with '/', got {args.path!r}")
        ok, why = check_http(args.path, args.port)
    else:
        ok, why = check_worker(args.allow_store_down)
    print(("healthy: " if ok else "unhealthy: ") + why)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
