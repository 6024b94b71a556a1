"""SQLite job store for the embedded mode: one file in the data dir, shared by the API and its worker.

Each transition runs in a `BEGIN IMMEDIATE` transaction (one writer at a time, WAL so readers never
block), which is all the atomicity the shared transition code in `base.py` needs. Connections are
per thread and per process because SQLite handles must not cross a fork or a thread.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ..files import private_dir, private_file
from .base import JobStore
from .records import JobRecord, WorkerInfo

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, job_key TEXT NOT NULL,
    status TEXT NOT NULL, target TEXT NOT NULL, data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS jobs_by_tenant ON jobs (tenant, id);
CREATE INDEX IF NOT EXISTS jobs_by_status ON jobs (status, target);
CREATE INDEX IF NOT EXISTS jobs_by_key ON jobs (job_key, status);
CREATE TABLE IF NOT EXISTS job_keys (
    tenant TEXT NOT NULL, job_key TEXT NOT NULL, job_id TEXT NOT NULL, PRIMARY KEY (tenant, job_key));
CREATE TABLE IF NOT EXISTS workers (id TEXT PRIMARY KEY, data TEXT NOT NULL, expires_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value REAL NOT NULL);
CREATE TABLE IF NOT EXISTS owners (tenant TEXT NOT NULL, digest TEXT NOT NULL, PRIMARY KEY (tenant, digest));
"""


# How long a connection waits for another's lock before "database is locked".
BUSY_TIMEOUT_S = 30.0


def _enter_wal(conn: sqlite3.Connection) -> None:
    """Switch the database to WAL, waiting out a writer that holds it. SQLite answers the switch
    with "database is locked" at once, without its busy timeout, while another connection holds
    a write lock: in embedded mode the API process and its worker open a fresh store together,
    and the one that lost that race exited at start-up (seen in CI as a live-service fixture
    that never came up)."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


class SqliteJobStore(JobStore):
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        private_dir(self.path.parent)
        private_file(self.path)  # SQLite gives its -wal and -shm files the database file's mode
        self._local = threading.local()
        self._conn().executescript(_SCHEMA)

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None or self._local.pid != os.getpid():
            conn = sqlite3.connect(
                self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
            )
            _enter_wal(conn)
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn, self._local.pid = conn, os.getpid()
        return conn

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    @staticmethod
    def _write(db: sqlite3.Connection, r: JobRecord) -> None:
        db.execute(
            "INSERT OR REPLACE INTO jobs (id, tenant, job_key, status, target, data) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (r.id, r.tenant, r.job_key, r.status, r.target, r.model_dump_json()),
        )

    @staticmethod
    def _read(db: sqlite3.Connection, job_id: str) -> JobRecord | None:
        row = db.execute("SELECT data FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return JobRecord.model_validate_json(row[0]) if row else None

    def _insert_unless_live(
        self, record: JobRecord, is_live: Callable[[JobRecord], bool]
    ) -> tuple[JobRecord, bool]:
        with self._tx() as db:
            row = db.execute(
                "SELECT job_id FROM job_keys WHERE tenant = ? AND job_key = ?",
                (record.tenant, record.job_key),
            ).fetchone()
            existing = self._read(db, row[0]) if row else None
            if existing is not None and is_live(existing):
                return existing, False
            self._write(db, record)
            db.execute(
                "INSERT OR REPLACE INTO job_keys (tenant, job_key, job_id) VALUES (?, ?, ?)",
                (record.tenant, record.job_key, record.id),
            )
            return record, True

    def _update(self, job_id: str, change: Callable[[JobRecord], JobRecord | None]) -> JobRecord | None:
        with self._tx() as db:
            current = self._read(db, job_id)
            if current is None:
                return None
            new = change(current.model_copy(deep=True))
            if new is not None:
                self._write(db, new)
            return new

    def get(self, job_id: str) -> JobRecord | None:
        return self._read(self._conn(), job_id)

    def get_raw(self, job_id: str) -> str | None:
        row = self._conn().execute("SELECT data FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return row[0] if row else None

    def list_jobs(self, tenant: str, cursor: str | None, limit: int) -> tuple[list[JobRecord], str | None]:
        rows = (
            self._conn()
            .execute(
                "SELECT data FROM jobs WHERE tenant = ? AND id < ? ORDER BY id DESC LIMIT ?",
                (tenant, cursor or "~", limit + 1),
            )
            .fetchall()
        )
        jobs = [JobRecord.model_validate_json(r[0]) for r in rows[:limit]]
        return jobs, (jobs[-1].id if len(rows) > limit else None)

    def ids_by_status(self, status: str) -> list[str]:
        return [r[0] for r in self._conn().execute("SELECT id FROM jobs WHERE status = ?", (status,))]

    def count_by_status(self) -> dict[str, int]:
        return dict(self._conn().execute("SELECT status, COUNT(*) FROM jobs GROUP BY status").fetchall())

    def queued_by_target(self) -> dict[str, int]:
        rows = self._conn().execute(
            "SELECT target, COUNT(*) FROM jobs WHERE status = 'queued' GROUP BY target"
        )
        return dict(rows.fetchall())

    def heartbeat(self, worker: WorkerInfo, ttl: float) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO workers (id, data, expires_at) VALUES (?, ?, ?)",
                (worker.id, worker.model_dump_json(), time.time() + ttl),
            )

    def remove_worker(self, worker_id: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM workers WHERE id = ?", (worker_id,))

    def workers(self) -> list[WorkerInfo]:
        rows = self._conn().execute("SELECT data FROM workers WHERE expires_at >= ?", (time.time(),))
        return [WorkerInfo.model_validate_json(r[0]) for r in rows.fetchall()]

    def incr(self, amounts: dict[str, float]) -> None:
        with self._tx() as db:
            db.executemany(
                "INSERT INTO counters (name, value) VALUES (?, ?) "
                "ON CONFLICT (name) DO UPDATE SET value = value + excluded.value",
                list(amounts.items()),
            )

    def counters(self) -> dict[str, float]:
        return dict(self._conn().execute("SELECT name, value FROM counters").fetchall())

    def grant(self, tenant: str, digests: Iterable[str]) -> None:
        with self._tx() as db:
            db.executemany(
                "INSERT OR IGNORE INTO owners (tenant, digest) VALUES (?, ?)", [(tenant, d) for d in digests]
            )

    def owns(self, tenant: str, digest: str) -> bool:
        row = (
            self._conn()
            .execute("SELECT 1 FROM owners WHERE tenant = ? AND digest = ?", (tenant, digest))
            .fetchone()
        )
        return row is not None

    def ping(self) -> bool:
        try:
            self._conn().execute("SELECT 1").fetchone()
        except sqlite3.Error:
            return False
        return True

    def instance_id(self) -> str:
        return f"sqlite:{self.path.stat().st_ino}"

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid == os.getpid():
            conn.close()
        self._local.conn = None

    def __repr__(self) -> str:
        return f"SqliteJobStore({str(self.path)!r})"
