"""The job store contract, run against both backends (SQLite and a private redis-server)."""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from autofusion_core.store import Artifact, JobRecord, JobStore, Lease, WorkerInfo
from autofusion_core.store.base import parse_counter_key
from autofusion_core.store.records import new_job_id
from autofusion_core.store.redis import RedisJobStore
from autofusion_core.store.sqlite import SqliteJobStore


@pytest.fixture(params=["sqlite", "redis"])
def store(request: pytest.FixtureRequest, tmp_path) -> Iterator[JobStore]:
    if request.param == "sqlite":
        s: JobStore = SqliteJobStore(tmp_path / "jobs.sqlite3")
    else:
        server = request.getfixturevalue("redis_server")
        s = RedisJobStore(server.url(0), prefix=f"t{uuid.uuid4().hex[:12]}")  # a namespace per test
    yield s
    s.close()


def record(tenant: str = "alice", key: str = "k1", target: str = "cpu") -> JobRecord:
    return JobRecord(
        id=new_job_id(),
        tenant=tenant,
        job_key=key,
        target=target,
        config={"max_rounds": 3},
        model_digest="a" * 64,
        model_size=10,
        model_filename="m.onnx",
        engine_version="0",
    )


def lease(owner: str = "w1", seconds: float = 30) -> Lease:
    return Lease(owner=owner, hostname="h", pid=1, expires_at=time.time() + seconds)


def test_submit_is_idempotent_per_tenant_and_key(store: JobStore) -> None:
    first, created = store.submit(record())
    again, created_again = store.submit(record())
    other_tenant, created_other = store.submit(record(tenant="bob"))
    assert created and not created_again and created_other
    assert again.id == first.id
    assert other_tenant.id != first.id
    assert store.get(first.id) == first
    assert store.owns("alice", "a" * 64) and not store.owns("carol", "a" * 64)


def test_cancelled_job_is_replaced_on_resubmission(store: JobStore) -> None:
    first, _ = store.submit(record())
    assert store.request_cancel(first.id).status == "cancelled"
    second, created = store.submit(record())
    assert created and second.id != first.id


def test_list_is_newest_first_with_cursor(store: JobStore) -> None:
    ids = []
    for i in range(5):
        ids.append(store.submit(record(key=f"k{i}"))[0].id)
        time.sleep(0.002)
    store.submit(record(tenant="bob", key="other"))
    page, cursor = store.list_jobs("alice", None, 2)
    assert [j.id for j in page] == ids[::-1][:2] and cursor == ids[3]
    page2, cursor2 = store.list_jobs("alice", cursor, 2)
    page3, cursor3 = store.list_jobs("alice", cursor2, 2)
    assert [j.id for j in page2 + page3] == ids[::-1][2:]
    assert cursor3 is None


def test_claim_progress_finish(store: JobStore) -> None:
    job, _ = store.submit(record())
    mine = lease("w1")
    claimed = store.claim(job.id, mine, max_attempts=2)
    assert claimed is not None and claimed.status == "running" and claimed.attempt == 1
    assert store.claim(job.id, lease("w2"), max_attempts=2) is None  # a live lease is not stolen
    progressed = store.report_progress(job.id, "w1", 30, "compiling", 3, 7)
    assert (progressed.stage, progressed.progress_done, progressed.progress_total) == ("compiling", 3, 7)
    assert store.report_progress(job.id, "w2", 30, "planning") is None  # not the owner
    art = Artifact(digest="b" * 64, size=5)
    done = store.finish(job.id, "w1", "succeeded", artifacts={"model": art, "bundle": art, "report": art})
    assert done.status == "succeeded" and done.finished_at and done.lease is None
    assert store.owns("alice", "b" * 64)
    assert store.finish(job.id, "w1", "failed") is None  # finished jobs stay finished
    assert store.count_by_status() == {"succeeded": 1}


def test_results_are_reused_per_tenant_only(store: JobStore) -> None:
    job, _ = store.submit(record())
    store.claim(job.id, lease("w1"), 2)
    art = Artifact(digest="c" * 64, size=1)
    store.finish(job.id, "w1", "succeeded", artifacts={"model": art, "bundle": art, "report": art})
    again, created = store.submit(record())
    assert not created and again.id == job.id and again.status == "succeeded"
    theirs, created = store.submit(record(tenant="bob"))
    assert created and theirs.id != job.id and theirs.status == "queued" and theirs.attempt == 0
    assert not store.owns("bob", "c" * 64)


def test_sweep_requeues_then_fails_as_worker_crashed(store: JobStore) -> None:
    job, _ = store.submit(record())
    assert store.claim(job.id, lease("w1", seconds=-1), 2).attempt == 1
    assert store.queued_by_target().get("cpu", 0) == 0
    requeued = store.sweep(max_attempts=2)
    assert [j.id for j in requeued] == [job.id] and store.get(job.id).status == "queued"
    assert store.queued_by_target() == {"cpu": 1}
    assert store.finish(job.id, "w1", "succeeded") is None  # the swept run's results do not count
    assert store.claim(job.id, lease("w2", seconds=-1), 2).attempt == 2
    assert store.sweep(max_attempts=2) == []
    failed = store.get(job.id)
    assert failed.status == "failed" and failed.error["code"] == "worker_crashed" and failed.attempt == 2


def test_cancel_running_then_finish_as_cancelled(store: JobStore) -> None:
    job, _ = store.submit(record())
    store.claim(job.id, lease("w1"), 2)
    assert store.request_cancel(job.id).status == "cancelling"
    assert store.report_progress(job.id, "w1", 30).status == "cancelling"
    assert store.finish(job.id, "w1", "failed", error={"code": "x"}).status == "cancelled"


def test_failing_unpublished_job_allows_resubmission(store: JobStore) -> None:
    job, _ = store.submit(record())
    store.fail(job.id, {"code": "broker_unavailable", "status": 503, "detail": "down"})
    again, created = store.submit(record())
    assert created and again.id != job.id


def test_heartbeats_expire(store: JobStore) -> None:
    info = WorkerInfo(id="w1", hostname="h", pid=1, targets=["cpu"], last_seen=time.time())
    store.heartbeat(info, ttl=0.3)
    assert [w.id for w in store.workers()] == ["w1"]
    time.sleep(0.4)
    assert store.workers() == []
    store.heartbeat(info, ttl=10)
    store.remove_worker("w1")
    assert store.workers() == []


def test_histogram_counters(store: JobStore) -> None:
    store.observe("m", 0.3, buckets=(0.1, 1.0), stage="planning")
    store.observe("m", 0.05, buckets=(0.1, 1.0), stage="planning")
    counters = store.counters()
    assert counters["m_bucket|le=0.1|stage=planning"] == 1
    assert counters["m_bucket|le=1.0|stage=planning"] == 2
    assert counters["m_bucket|le=+Inf|stage=planning"] == 2
    assert counters["m_count|stage=planning"] == 2
    assert counters["m_sum|stage=planning"] == pytest.approx(0.35)
    assert parse_counter_key("m_bucket|le=0.1|stage=planning") == (
        "m_bucket",
        {"le": "0.1", "stage": "planning"},
    )


def test_ping(store: JobStore) -> None:
    assert store.ping()


def test_sweep_republishes_jobs_queued_too_long(store: JobStore) -> None:
    job, _ = store.submit(record())
    assert store.sweep(max_attempts=2, stale_after=60) == []
    time.sleep(0.05)
    stale = store.sweep(max_attempts=2, stale_after=0.01)
    assert [j.id for j in stale] == [job.id] and stale[0].status == "queued"
    assert store.sweep(max_attempts=2, stale_after=60) == []  # touched: not again until stale again


def test_a_fresh_sqlite_store_opens_while_another_connection_writes_it(tmp_path) -> None:
    """The API process and its embedded worker open a fresh store together; SQLite refuses the
    switch to WAL at once (no busy timeout) while the other holds a write lock: the store must
    wait it out, not fail at start-up."""
    path = tmp_path / "jobs.sqlite3"
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("CREATE TABLE IF NOT EXISTS early (i INTEGER)")
    release = threading.Timer(0.3, lambda: writer.execute("COMMIT"))
    release.start()
    started = time.monotonic()
    s = SqliteJobStore(path)
    try:
        assert time.monotonic() - started >= 0.25  # it waited for the writer
        r = record()
        stored, created = s.submit(r)
        assert created and stored.id == r.id
        assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        release.join()
        s.close()
        writer.close()
