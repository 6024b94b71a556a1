"""The pipeline on the real engine, without Celery: claim → fuse → compile → verify → package."""

from __future__ import annotations

import io
import json
import tarfile
import time

import onnx
import pytest
from harness import fast_settings, tiny_model

import graph_autofusion as gaf
from autofusion_core.blobs import BlobStore
from autofusion_core.store import JobRecord, Lease
from autofusion_core.store.records import new_job_id
from autofusion_core.store.sqlite import SqliteJobStore
from autofusion_core.targets import TARGETS, Target
from autofusion_worker.bundle import build_bundle
from autofusion_worker.pipeline import JobContext, problem_for, run_job


@pytest.fixture
def ctx(tmp_path) -> JobContext:
    settings = fast_settings(tmp_path)
    return JobContext(settings, SqliteJobStore(tmp_path / "jobs.sqlite3"), BlobStore(settings.blob_dir))


def queued(ctx: JobContext, model: bytes, target: str = "cpu", config: dict | None = None) -> JobRecord:
    digest, size = ctx.blobs.put(model)
    record = JobRecord(
        id=new_job_id(),
        tenant="t",
        job_key=f"{digest}{target}{config}",
        target=target,
        config=config or {},
        model_digest=digest,
        model_size=size,
        model_filename="m.onnx",
        engine_version=gaf.__version__,
    )
    return ctx.store.submit(record)[0]


def members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_cpu_job_compiles_verifies_and_stores_a_loadable_bundle(ctx: JobContext, tmp_path) -> None:
    job = queued(ctx, tiny_model(seed=1))
    done = run_job(job.id, ctx)
    assert done is not None and done.status == "succeeded", done and done.error
    assert done.attempt == 1 and done.stage is None and done.progress_total is None
    fused = onnx.load_model_from_string(ctx.blobs.read(done.model_artifact.digest))
    assert any(n.domain == "ai.graph_autofusion" for n in fused.graph.node)
    report = json.loads(ctx.blobs.read(done.report_artifact.digest))
    assert report["verification"]["passed"] is True
    files = members(ctx.blobs.read(done.bundle_artifact.digest))
    assert {"model.onnx", "manifest.json", "report.json"} <= set(files)
    assert any(name.startswith("kernels/") for name in files)
    bundle = tmp_path / "b.tar.gz"
    bundle.write_bytes(ctx.blobs.read(done.bundle_artifact.digest))
    assert gaf.load(bundle) is not None
    counters = ctx.store.counters()
    assert any(k.startswith("autofusion_stage_duration_seconds_count|stage=compiling") for k in counters)
    assert sum(v for k, v in counters.items() if k.startswith("autofusion_kernel_cache_")) >= 1


def test_uncompiled_target_bundle_has_manifest(ctx: JobContext, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every shipped target compiles; a target registered for its cost model alone (as deploy.md's
    # "a new target name" allows) plans and exports, and its bundle lists each file's sha256.
    plan_only = Target("plan-only", "plans with the Ascend cost model only", "ascend910", False)
    monkeypatch.setitem(TARGETS, plan_only.name, plan_only)
    done = run_job(queued(ctx, tiny_model(seed=2), target=plan_only.name).id, ctx)
    assert done.status == "succeeded", done.error
    files = members(ctx.blobs.read(done.bundle_artifact.digest))
    assert set(files) == {"model.onnx", "report.json", "manifest.json"}
    manifest = json.loads(files["manifest.json"])
    import hashlib

    for name, entry in manifest["files"].items():
        assert entry == {"sha256": hashlib.sha256(files[name]).hexdigest(), "size": len(files[name])}


class ProgressLog(SqliteJobStore):
    """The real SQLite store, keeping a list of the progress each write carried."""

    def __init__(self, path) -> None:
        super().__init__(path)
        self.writes: list[tuple[str | None, int | None, int | None]] = []

    def report_progress(self, job_id, owner, lease_seconds, stage=None, done=None, total=None):
        if stage is not None:
            self.writes.append((stage, done, total))
        return super().report_progress(job_id, owner, lease_seconds, stage, done, total)


def test_compiling_reports_done_and_total(tmp_path) -> None:
    settings = fast_settings(tmp_path)
    store = ProgressLog(tmp_path / "jobs.sqlite3")
    ctx = JobContext(settings, store, BlobStore(settings.blob_dir))
    done = run_job(queued(ctx, tiny_model(width=29, seed=5)).id, ctx)  # a width no other test compiles
    assert done is not None and done.status == "succeeded"
    compiling = [(d, t) for stage, d, t in store.writes if stage == "compiling" and t is not None]
    # Shown from the start of compilation (before the kernels are built), not only at its end.
    assert compiling and compiling[0][0] < compiling[0][1], store.writes
    assert compiling[-1][0] == compiling[-1][1] >= 1, store.writes


def test_engine_error_becomes_the_jobs_problem(ctx: JobContext) -> None:
    model = onnx.load_model_from_string(tiny_model(seed=3))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    done = run_job(queued(ctx, model.SerializeToString()).id, ctx)
    assert done.status == "failed"
    assert done.error["code"] == "unbound_dimension" and done.error["status"] == 422 and done.error["detail"]


def test_a_claimed_job_is_not_run_twice(ctx: JobContext) -> None:
    job = queued(ctx, tiny_model(seed=4))
    lease = Lease(owner="other", hostname="h", pid=1, expires_at=time.time() + 60)
    assert ctx.store.claim(job.id, lease, 2) is not None
    assert run_job(job.id, ctx) is None
    assert ctx.store.get(job.id).lease.owner == "other"


def test_bundles_are_reproducible(tmp_path) -> None:
    (tmp_path / "a.txt").write_text("x")
    assert build_bundle(tmp_path) == build_bundle(tmp_path)


@pytest.mark.parametrize(
    ("error", "code", "status"),
    [
        (gaf.FusionError("refused", code="unsupported_control_flow"), "unsupported_control_flow", 422),
        (MemoryError(), "out_of_memory", 422),
        (KeyError("outer_scope_value"), "engine_error", 500),
    ],
)
def test_every_job_failure_has_a_stable_code(error: BaseException, code: str, status: int) -> None:
    """Engine refusals keep their own code; a model that does not fit and an engine bug fail the job
    cleanly with codes of their own — never the API's `internal_error`."""
    problem = problem_for(error)
    assert (problem["code"], problem["status"]) == (code, status) and problem["detail"]


def test_large_bundles_are_stored_not_deflated(tmp_path) -> None:
    """Weights do not deflate (~7 %) but cost most of a big job's packaging time: a bundle over the
    threshold is stored inside its gzip container, and still reads back as the same files."""
    from autofusion_worker.bundle import STORE_ABOVE

    (tmp_path / "model.onnx").write_bytes(bytes(STORE_ABOVE + 1))  # zeros: deflate would shrink them
    (tmp_path / "report.json").write_text("{}")
    data = build_bundle(tmp_path)
    assert len(data) > STORE_ABOVE
    assert members(data)["model.onnx"] == bytes(STORE_ABOVE + 1) and "manifest.json" in members(data)
    small = tmp_path / "small"
    small.mkdir()
    (small / "model.onnx").write_bytes(bytes(1 << 20))
    assert len(build_bundle(small)) < 1 << 16
