"""Load benchmark of the fusion service: Redis, the API and worker processes on this machine.

    .venv/bin/python benchmarks/service_load.py --clients 200 --jobs 20 --workers 2

Prints jobs/minute for a burst of distinct submissions, p50/p99 latency of submissions and of
status polls with `--clients` concurrent pollers (target: p99 < 50 ms at 200), and for each of
`--models` (default the zoo's ResNet-50 and BERT-base): submit → done with the time per stage
(upload, queue wait, fuse, compile, verify, package; target: packaging under 10 % of the job), the
cached resubmission by the same tenant through the client SDK (by digest, no upload), and a run by
another tenant (a job of its own: results are per tenant). Everything runs as real processes on
free ports in a temporary directory, which is removed afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from graph_autofusion.hardware import describe_host

REPO = Path(__file__).resolve().parents[1]
REPEATS = 5
KEYS = {"bench": "bench-key-0123456789", "other0": "other0-key-0123456789"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))] * 1000


def wait_until(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {what}")


class Stack:
    """redis-server + API + workers as subprocesses."""

    def __init__(self, workers: int, tmp: Path, api_workers: int | None = None) -> None:
        self.tmp, self.procs = tmp, []
        redis_port, self.port = free_port(), free_port()
        self.redis = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(redis_port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(tmp),
                "--save",
                "",
            ],
            stdout=subprocess.DEVNULL,
        )
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
            "AUTOFUSION_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
            "AUTOFUSION_DATA_DIR": str(tmp / "data"),
            "AUTOFUSION_API_KEYS": ",".join(f"{t}:{k}" for t, k in KEYS.items()),
            "AUTOFUSION_LOG_LEVEL": "WARNING",
            "AUTOFUSION_HEARTBEAT_INTERVAL": "1",
        }
        self.base = f"http://127.0.0.1:{self.port}"
        self._spawn(
            [
                "-m",
                "autofusion_service",
                "serve",
                "--port",
                str(self.port),
                *(["--api-workers", str(api_workers)] if api_workers else []),
            ],
            "api",
        )
        for i in range(workers):
            self._spawn(["-m", "autofusion_worker", "--targets", "cpu"], f"worker-{i}")
        headers = {"Authorization": f"Bearer {KEYS['bench']}"}
        wait_until(lambda: httpx.get(f"{self.base}/healthz").status_code == 200, 60, "the API")
        wait_until(
            lambda: (
                sum(
                    t["workers"] for t in httpx.get(f"{self.base}/targets", headers=headers).json()["targets"]
                )
                >= workers
            ),
            120,
            "the workers",
        )

    def _spawn(self, args: list[str], name: str) -> None:
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - lives as long as the process
        self.procs.append(
            subprocess.Popen(
                [sys.executable, *args],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        self.redis.terminate()
        self.redis.wait()


def small_model(seed: int) -> bytes:
    from graph_autofusion import zoo

    return zoo.build("mlp", in_features=64, hidden=(64, 32), num_classes=10, seed=seed).SerializeToString()


async def submit(client: httpx.AsyncClient, model: bytes, tenant: str = "bench") -> tuple[dict, float]:
    t = time.perf_counter()
    r = await client.post(
        "/fuse", files={"model": ("m.onnx", model)}, headers={"Authorization": f"Bearer {KEYS[tenant]}"}
    )
    r.raise_for_status()
    return r.json(), time.perf_counter() - t


async def wait_done(
    client: httpx.AsyncClient, job_id: str, tenant: str = "bench", timeout: float = 900
) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = (
            await client.get(f"/jobs/{job_id}", headers={"Authorization": f"Bearer {KEYS[tenant]}"})
        ).json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return job
        await asyncio.sleep(0.1)
    raise TimeoutError(job_id)


async def throughput(base: str, jobs: int, concurrency: int) -> tuple[float, list[float], list[str]]:
    models = [small_model(1000 + i) for i in range(jobs)]
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as client:
        start = time.perf_counter()
        submitted = await asyncio.gather(*(submit(client, m) for m in models))
        done = await asyncio.gather(*(wait_done(client, job["id"]) for job, _ in submitted))
        elapsed = time.perf_counter() - start
    failed = [j["id"] for j in done if j["status"] != "succeeded"]
    return jobs / elapsed * 60, [lat for _, lat in submitted], failed


async def pollers(
    base: str, job_ids: list[str], clients: int, seconds: float, interval: float
) -> list[float]:
    """`clients` pollers, each with its own connection, asking for a job's status every `interval`
    seconds (as a client that honours `Retry-After` does; 0 polls back to back), starting at random
    offsets. The first request of each poller (the TCP connect) is not timed."""
    import random

    latencies: list[float] = []
    headers = {"Authorization": f"Bearer {KEYS['bench']}"}
    connected, ready = 0, asyncio.Event()
    window: dict[str, float] = {}

    async def poll(i: int) -> None:
        nonlocal connected
        async with httpx.AsyncClient(base_url=base, timeout=60, headers=headers, verify=False) as client:
            url = f"/jobs/{job_ids[i % len(job_ids)]}"
            (await client.get(url)).raise_for_status()
            connected += 1
            if connected == clients:
                window["stop"] = time.monotonic() + seconds
                ready.set()
            await ready.wait()
            await asyncio.sleep(random.uniform(0, interval))
            while time.monotonic() < window["stop"]:
                t = time.perf_counter()
                r = await client.get(url)
                took = time.perf_counter() - t
                latencies.append(took)
                r.raise_for_status()
                await asyncio.sleep(max(0.0, interval - took))

    await asyncio.gather(*(poll(i) for i in range(clients)))
    return latencies


#: The job's stages as the worker reports them, grouped as the benchmark prints them.
STAGE_GROUPS = {
    "loading": "fuse",
    "canonicalizing": "fuse",
    "planning": "fuse",
    "exporting": "fuse",
    "compiling": "compile",
    "verifying": "verify",
    "packaging": "package",
}


def _ts(value: str | None) -> float | None:
    from datetime import datetime

    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() if value else None


async def timed_run(
    client: httpx.AsyncClient, model: bytes, tenant: str = "bench", interval: float = 0.05
) -> tuple[dict, dict[str, float]]:
    """Submit and follow one job, polling every `interval` s: seconds of upload (the POST), queue
    wait (server timestamps: created → started), fuse, compile, verify and package (from the stage
    transitions the polls saw; package ends at the server's `finished_at`), and the total."""
    headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
    t0 = time.time()
    job, upload = await submit(client, model, tenant)
    seen: list[tuple[float, str]] = []
    while job["status"] not in ("succeeded", "failed", "cancelled"):
        await asyncio.sleep(interval)
        job = (await client.get(f"/jobs/{job['id']}", headers=headers)).json()
        if job["status"] == "running" and job["stage"] and (not seen or seen[-1][1] != job["stage"]):
            seen.append((time.time(), job["stage"]))
    times = dict.fromkeys(("upload", "queue wait", "fuse", "compile", "verify", "package"), 0.0)
    times["upload"] = upload
    created, started, finished = (_ts(job[k]) for k in ("created_at", "started_at", "finished_at"))
    if created and started:
        times["queue wait"] = started - created
    ends = [t for t, _ in seen[1:]] + [finished or time.time()]
    for (begin, stage), end in zip(seen, ends, strict=True):
        group = STAGE_GROUPS.get(stage)
        if group:
            times[group] += end - begin
    times["total"] = time.time() - t0
    return job, times


async def model_runs(base: str, model_name: str, repeats: int) -> dict[str, object]:
    """One zoo model: its first run with the time per stage; `repeats` resubmissions by the same
    tenant through the client SDK (by digest, no upload; the same job, its report fetched); and one
    run by another tenant, who gets a job of its own (results are per tenant; only the compiled-
    kernel cache is shared)."""
    from graph_autofusion_client import AsyncClient

    from graph_autofusion import zoo

    model = zoo.build(model_name).SerializeToString()
    async with httpx.AsyncClient(base_url=base, timeout=1800) as client:
        job, first = await timed_run(client, model)
        if job["status"] != "succeeded":
            raise SystemExit(f"{model_name} job failed: {job['error']}")
        by_digest: list[float] = []
        async with AsyncClient(base, api_key=KEYS["bench"], timeout=120) as sdk:
            for _ in range(repeats):
                t = time.perf_counter()
                again = await sdk.submit(model)
                await again.report()
                by_digest.append(time.perf_counter() - t)
                assert again.id == job["id"], "the resubmission did not find the finished job"
        other_job, other = await timed_run(client, model, tenant="other0")
        assert other_job["id"] != job["id"] and other_job["status"] == "succeeded"
    return {"mb": len(model) / 1e6, "first": first, "by_digest": by_digest, "other": other}


def print_stages(label: str, times: dict[str, float]) -> None:
    total = times["total"]
    parts = "  ".join(f"{name} {times[name]:.1f}" for name in times if name != "total")
    package = times["package"] / total * 100 if total else 0.0
    print(f"  {label}: {total:.1f} s ({parts} s; packaging {package:.1f} % of the job)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=200, help="concurrent status pollers")
    parser.add_argument("--jobs", type=int, default=20, help="distinct small jobs for the throughput run")
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument(
        "--api-workers", type=int, default=None, help="API processes (default: what `serve` picks)"
    )
    parser.add_argument("--poll-seconds", type=float, default=10.0, help="duration of the polling run")
    parser.add_argument("--poll-interval", type=float, default=1.0, help="seconds between one poller's polls")
    parser.add_argument(
        "--models",
        default="resnet50,bert_base",
        help="comma-separated zoo models to run end to end, with stage times ('' skips)",
    )
    parser.add_argument(
        "--repeats", type=int, default=REPEATS, choices=range(1, REPEATS + 1), help="resubmissions each way"
    )
    args = parser.parse_args()
    print(describe_host())  # the API and workers run on this host
    tmp = Path(tempfile.mkdtemp(prefix="autofusion-load-"))
    stack = Stack(args.workers, tmp, args.api_workers)
    try:
        per_minute, submit_lat, failed = asyncio.run(throughput(stack.base, args.jobs, min(args.jobs, 50)))
        print(
            f"throughput      {args.jobs} jobs, {args.workers} workers: {per_minute:.1f} jobs/min"
            + (f" ({len(failed)} failed)" if failed else "")
        )
        print(
            f"submit latency  p50 {pct(submit_lat, 50):.1f} ms  p99 {pct(submit_lat, 99):.1f} ms "
            f"({len(submit_lat)} concurrent submissions)"
        )
        headers = {"Authorization": f"Bearer {KEYS['bench']}"}
        ids = [j["id"] for j in httpx.get(f"{stack.base}/jobs?limit=100", headers=headers).json()["items"]]
        lat = asyncio.run(pollers(stack.base, ids, args.clients, args.poll_seconds, args.poll_interval))
        print(
            f"status latency  p50 {pct(lat, 50):.1f} ms  p99 {pct(lat, 99):.1f} ms  mean "
            f"{statistics.fmean(lat) * 1000:.1f} ms ({args.clients} pollers every {args.poll_interval:g} s, "
            f"{len(lat)} requests, "
            f"{len(lat) / args.poll_seconds:.0f} req/s)"
        )
        for name in filter(None, args.models.split(",")):
            runs = asyncio.run(model_runs(stack.base, name, args.repeats))
            print(f"{name:<15} {runs['mb']:.0f} MB")
            print_stages("submit → done", runs["first"])  # type: ignore[arg-type]
            times = runs["by_digest"]
            print(
                f"  cached resubmission, same tenant, SDK (digest, no upload) + report: median "
                f"{statistics.median(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms "
                f"({len(times)} runs)"
            )
            print_stages("another tenant, own job (shared kernel cache)", runs["other"])  # type: ignore[arg-type]
        print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        stack.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
