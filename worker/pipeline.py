"""One fusion job from claim to stored artifacts: the whole worker pipeline in one place.

    claim (lease) ─► fuse (loading … exporting) ─► compile (C for cpu, Triton for cuda/ascend910)
                  ─► verify (against onnxruntime, on the target's device or Triton's interpreter)
                  ─► package (fused.onnx, report.json, manifest.json, kernels/ → tar.gz) ─► store ─► finish

The engine does the work; this module adds what a service needs around it: progress written to the
job store (which also renews the lease and notices cancellation), stage durations for metrics,
engine errors turned into the job's problem object, and results that only count if the lease is
still ours when the run ends (a run that was swept and restarted elsewhere cannot overwrite).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic
from celery.exceptions import SoftTimeLimitExceeded

import graph_autofusion as gaf
from autofusion_core.blobs import BlobStore
from autofusion_core.errors import is_unavailable, until_available
from autofusion_core.settings import Settings
from autofusion_core.store import Artifact, JobRecord, JobStore, Lease
from autofusion_core.targets import get_target

from .bundle import write_bundle
from .kernels import KernelArtifacts, store_kernels

log = logging.getLogger("autofusion_worker")
STAGE_METRIC = "autofusion_stage_duration_seconds"


@dataclass
class JobContext:
    settings: Settings
    store: JobStore
    blobs: BlobStore


class JobCancelled(Exception):
    """Raised from the progress callback when the job's tenant cancelled it."""


class LeaseLost(Exception):
    """Raised when another run owns the job now (this one was swept as dead)."""


class ProgressReporter:
    """The engine's progress callback: writes stage/progress, renews the lease, and stops the run on
    cancellation. A background thread renews the lease while a stage reports nothing."""

    def __init__(self, ctx: JobContext, job_id: str, owner: str) -> None:
        self.ctx, self.job_id, self.owner = ctx, job_id, owner
        self.cancelled = threading.Event()
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._stage: str | None = None
        self._total: int | None = None
        self._stage_started = time.monotonic()
        self._last_write = 0.0
        interval = min(ctx.settings.lease_seconds / 3, 2.0)
        self._thread = threading.Thread(target=self._renew_loop, args=(interval,), daemon=True)

    def __enter__(self) -> ProgressReporter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._close_stage()

    def _renew_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self._write(None, None, None)

    def _write(self, stage: str | None, done: int | None, total: int | None) -> None:
        try:
            job = self.ctx.store.report_progress(
                self.job_id, self.owner, self.ctx.settings.lease_seconds, stage, done, total
            )
        except Exception:  # a store hiccup must not kill the run; the next write retries
            log.warning("job %s: could not write progress", self.job_id, exc_info=True)
            return
        if job is None:
            self.lost.set()
        elif job.status == "cancelling":
            self.cancelled.set()

    def check(self) -> None:
        if self.lost.is_set():
            raise LeaseLost(self.job_id)
        if self.cancelled.is_set():
            raise JobCancelled(self.job_id)

    def _close_stage(self) -> None:
        if self._stage is not None:
            elapsed = time.monotonic() - self._stage_started
            try:
                self.ctx.store.observe(STAGE_METRIC, elapsed, stage=self._stage)
            except Exception:
                log.warning("could not record a stage duration", exc_info=True)

    def __call__(self, stage: str, done: int | None = None, total: int | None = None) -> None:
        self.check()
        now = time.monotonic()
        changed = stage != self._stage
        if changed:
            self._close_stage()
            self._stage, self._stage_started = stage, now
        # A stage change, the first known total (so `progress` shows as soon as the compiler
        # knows how many kernels it builds), the last step, or else at most four writes a second.
        new_total = total is not None and total != self._total
        self._total = total
        if changed or new_total or now - self._last_write > 0.25 or (done is not None and done == total):
            self._last_write = now
            self._write(stage, done, total)
            self.check()
        delay = self.ctx.settings.debug_stage_delay
        if changed and delay:
            deadline = now + delay
            while time.monotonic() < deadline:
                time.sleep(min(0.1, delay))
                self.check()


def run_job(job_id: str, ctx: JobContext) -> JobRecord | None:
    """Claim and run one job. Returns the finished record, or None if this run did not own it."""
    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    lease = Lease.for_this_process(owner, ctx.settings.lease_seconds)
    wait = ctx.settings.store_wait
    job = until_available(lambda: ctx.store.claim(job_id, lease, ctx.settings.max_attempts), wait)
    if job is None:
        log.info("job %s: not claimable (finished, cancelled or owned by a live run); dropped", job_id)
        return None
    log.info("job %s: attempt %d started by %s", job_id, job.attempt, owner)
    with ProgressReporter(ctx, job_id, owner) as reporter:
        try:
            artifacts, kernel_files = _execute(job, ctx, reporter)
            reporter.check()
        except (JobCancelled, LeaseLost) as exc:
            return _stopped(ctx, job_id, owner, exc)
        except Exception as exc:
            if reporter.cancelled.is_set() or reporter.lost.is_set():
                return _stopped(
                    ctx, job_id, owner, JobCancelled() if reporter.cancelled.is_set() else LeaseLost()
                )
            if is_unavailable(exc):
                raise  # the store went away mid-run: the sweep requeues the job once it is back
            error = problem_for(exc)
            return until_available(lambda: ctx.store.finish(job_id, owner, "failed", error=error), wait)
    finished = until_available(
        lambda: ctx.store.finish(job_id, owner, "succeeded", artifacts=artifacts, kernel_files=kernel_files),
        wait,
    )
    log.info("job %s: %s", job_id, finished.status if finished else "lease lost before finishing")
    return finished


def _stopped(ctx: JobContext, job_id: str, owner: str, exc: Exception) -> JobRecord | None:
    if isinstance(exc, LeaseLost):
        log.warning("job %s: lease lost; another run owns it", job_id)
        return None
    return ctx.store.finish(job_id, owner, "cancelled")


def problem_for(exc: BaseException) -> dict[str, Any]:
    """The job's error object: the engine's own code and sentence when it raised a FusionError,
    `out_of_memory` when the model did not fit, `time_limit_exceeded`, and `engine_error` for any
    other failure of the engine (a bug to fix there; the job fails cleanly, it is not retried)."""
    if isinstance(exc, gaf.FusionError):
        details = {k: v for k, v in exc.to_dict().items() if k not in ("code", "message")}
        return {"code": exc.code, "status": exc.status, "detail": exc.message, **_jsonable(details)}
    if isinstance(exc, pydantic.ValidationError):
        errors = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
        return {
            "code": "invalid_config",
            "status": 422,
            "detail": "the job's config is invalid",
            "errors": errors,
        }
    if isinstance(exc, SoftTimeLimitExceeded):
        limit = Settings().soft_time_limit
        return {"code": "time_limit_exceeded", "status": 422, "detail": f"the job ran over {limit} s"}
    if isinstance(exc, MemoryError):
        log.warning("job ran out of memory", exc_info=True)
        return {
            "code": "out_of_memory",
            "status": 422,
            "detail": "fusing this model needs more memory than the worker has (its activations or "
            "weights are too large); submit a smaller model or smaller input shapes",
        }
    log.exception("job failed with an unexpected engine error")
    return {
        "code": "engine_error",
        "status": 500,
        "detail": f"the fusion engine failed on this model ({type(exc).__name__}); the error has been "
        "logged and the job is not retried",
    }


def _jsonable(value: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(value, default=str))


def _execute(
    job: JobRecord, ctx: JobContext, progress: ProgressReporter
) -> tuple[dict[str, Artifact], list[Artifact]]:
    """Fuse, compile for the job's target, verify, package. Returns the artifacts by name and the
    kernel files a Triton target's manifest names (stored as blobs of their own)."""
    model_bytes = ctx.blobs.read(job.model_digest)
    config = gaf.FusionConfig.model_validate(job.config)
    fused = gaf.fuse(model_bytes, config=config, progress=progress)
    target = get_target(job.target)
    backend = target.backend if target is not None and target.compiles else None
    result: Any = None
    if backend is not None:
        ctx.settings.kernel_cache_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        progress("compiling", 0, None)
        if backend == "triton":
            # Rendered kernels are content-addressed under <cache>/triton/; Triton keeps the
            # binaries in TRITON_CACHE_DIR (the worker puts it beside, see cli.py).
            result = fused.compile(target=job.target, cache_dir=ctx.settings.kernel_cache_dir)
        else:
            result = fused.compile(
                cache_dir=ctx.settings.kernel_cache_dir,
                progress=lambda done, total: progress("compiling", done, total),
            )
    report = fused.report()  # after compiling: the compiled model has the last word on host ops
    if result is not None:
        stats = getattr(result, "stats", {}) or {}
        report.setdefault("compile", _jsonable(stats))
        _count_cache(ctx.store, stats.get("cache"))
    kernels = KernelArtifacts()
    with Packager(ctx.blobs, fused, backend) as packager:
        if backend is not None:
            progress("verifying")  # while the packager writes the model and the bundle
            verification = fused.verify(raise_on_failure=True, target=job.target)
            report.setdefault("verification", _jsonable(verification.to_dict()))
        progress("packaging")
        if backend == "triton":
            kernels = store_kernels(ctx.blobs, result)  # after verifying: tuned on the device
            report["kernels_manifest"] = kernels.manifest.digest if kernels.manifest else None
        artifacts = packager.finish(json.dumps(report, sort_keys=True, default=str).encode(), kernels.members)
    if kernels.manifest is not None:
        artifacts["kernels"] = kernels.manifest
    return artifacts, kernels.files


class Packager(threading.Thread):
    """Writes a job's artifacts in the background while verification runs: the bundle, streamed
    into a staged blob, and its model.onnx, moved into the blob store as the fused model (serialized
    once). The report comes last (it holds the verification); it is also the bundle's last member,
    so only it and the blob commits are left for the `packaging` stage. On a large model this hides
    serialization and copying that took a third of the job. Leaving the `with` block without
    `finish()` (verification failed, the job was cancelled) waits for the thread and discards the
    staged bundle.

    `backend` is the target's: `c` writes the CPU runtime's bundle (model.onnx, kernels/, its
    manifest); `triton` writes model.onnx early and the kernel files and their manifest late, with
    the report (they are known only after verification, see kernels.py); None (a target that only
    plans) writes model.onnx and a manifest of every file's sha256 and size."""

    def __init__(self, blobs: BlobStore, fused: Any, backend: str | None) -> None:
        super().__init__(name="autofusion-packager", daemon=True)
        self.blobs, self.fused, self.backend = blobs, fused, backend
        self._late: dict[str, bytes] = {}
        self._report: bytes | None = None
        self._report_ready = threading.Event()
        self._artifacts: dict[str, Artifact] = {}
        self._error: BaseException | None = None

    def __enter__(self) -> Packager:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._report_ready.set()  # unblock the thread; without a report it gives up
        self.join()

    def finish(self, report_data: bytes, members: dict[str, bytes] | None = None) -> dict[str, Artifact]:
        """Hand over the report (and late bundle `members`), wait for the bundle, store the report."""
        self._late = dict(members or {})
        self._report = report_data
        self._report_ready.set()
        self.join()
        if self._error is not None:
            raise self._error
        digest, size = self.blobs.put(report_data)
        return {**self._artifacts, "report": Artifact(digest=digest, size=size)}

    def _late_members(self) -> dict[str, bytes]:
        self._report_ready.wait()
        if self._report is None:
            raise _Abandoned
        return {**self._late, "report.json": self._report}

    def run(self) -> None:
        staged = None
        try:
            # Beside the blob store, so that the bundle's model.onnx becomes the model artifact by a
            # rename: the fused model is serialized and written once, not twice.
            with tempfile.TemporaryDirectory(prefix="bundle-", dir=self.blobs.staging_dir) as tmp:
                bundle_dir = Path(tmp) / "bundle"
                if self.backend == "c":
                    # the runtime's layout: model.onnx (the fused model), kernels/, manifest.json
                    self.fused.save_bundle(bundle_dir)
                else:
                    bundle_dir.mkdir()
                    (bundle_dir / "model.onnx").write_bytes(self.fused.model.SerializeToString())
                staged = self.blobs.stage()
                write_bundle(bundle_dir, staged, write_manifest=self.backend is None, late=self._late_members)
                staged.commit()
                self._artifacts["bundle"] = Artifact(digest=staged.digest, size=staged.size)
                digest, size = self.blobs.adopt(bundle_dir / "model.onnx")
                self._artifacts["model"] = Artifact(digest=digest, size=size)
        except _Abandoned:
            pass
        except BaseException as exc:  # handed to finish(), in the job's own thread
            self._error = exc
        finally:
            if staged is not None:
                staged.discard()


class _Abandoned(Exception):
    """The job ended before its report existed: the bundle is not needed."""


def _count_cache(store: JobStore, cache: Any) -> None:
    """Kernel cache hits/misses of one compilation (`{"hits": n, "misses": m}`), for /metrics."""
    if not isinstance(cache, dict):
        return
    amounts = {
        f"autofusion_kernel_cache_{kind}_total": float(cache[kind])
        for kind in ("hits", "misses")
        if isinstance(cache.get(kind), int | float)
    }
    if amounts:
        try:
            store.incr(amounts)
        except Exception:  # metrics must never fail a job (the store may be briefly away)
            log.warning("could not count kernel cache hits", exc_info=True)
