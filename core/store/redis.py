"""Redis job store for the distributed mode.

A job is one JSON string; small sets and indexes beside it answer the API's questions (a tenant's
jobs in id order, jobs by status, queued jobs per target, a tenant's job of a key). Every change
is an optimistic WATCH/MULTI transaction on the job key, so concurrent workers, sweeps and API
processes never lose an update. With Redis' append-only file on, all of it survives a restart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import RedisError, WatchError
from redis.retry import Retry

from .base import JobStore
from .records import STATUSES, JobRecord, WorkerInfo


class RedisJobStore(JobStore):
    def __init__(self, url: str, prefix: str = "af") -> None:
        self.url = url
        self.prefix = prefix
        # Bounded timeouts and few, quick retries: while Redis is away a request should be answered
        # (503, `Retry-After`) within a second or two, not hang or back off for many seconds.
        self.r = redis.Redis.from_url(
            url,
            decode_responses=True,
            health_check_interval=30,
            socket_connect_timeout=2,
            socket_timeout=10,
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 2),
        )

    def _k(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    def _write(self, pipe: redis.client.Pipeline, old: JobRecord | None, new: JobRecord) -> None:
        pipe.set(self._k("job", new.id), new.model_dump_json())
        if old is None or old.status != new.status:
            if old is not None:
                pipe.srem(self._k("status", old.status), new.id)
                if old.status == "queued":
                    pipe.srem(self._k("queued", old.target), new.id)
            pipe.sadd(self._k("status", new.status), new.id)
            if new.status == "queued":
                pipe.sadd(self._k("queued", new.target), new.id)
                pipe.sadd(self._k("targets"), new.target)

    def _insert_unless_live(
        self, record: JobRecord, is_live: Callable[[JobRecord], bool]
    ) -> tuple[JobRecord, bool]:
        key_index = self._k("key", record.tenant, record.job_key)
        with self.r.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(key_index)
                    existing_id = pipe.get(key_index)
                    existing = self.get(existing_id) if existing_id else None
                    if existing is not None and is_live(existing):
                        pipe.unwatch()
                        return existing, False
                    pipe.multi()
                    self._write(pipe, None, record)
                    pipe.set(key_index, record.id)
                    pipe.zadd(self._k("tenant", record.tenant), {record.id: 0})
                    pipe.execute()
                    return record, True
                except WatchError:
                    continue

    def _update(self, job_id: str, change: Callable[[JobRecord], JobRecord | None]) -> JobRecord | None:
        key = self._k("job", job_id)
        with self.r.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(key)
                    raw = pipe.get(key)
                    if raw is None:
                        pipe.unwatch()
                        return None
                    current = JobRecord.model_validate_json(raw)
                    new = change(current.model_copy(deep=True))
                    if new is None:
                        pipe.unwatch()
                        return None
                    pipe.multi()
                    self._write(pipe, current, new)
                    pipe.execute()
                    return new
                except WatchError:
                    continue

    def get(self, job_id: str) -> JobRecord | None:
        raw = self.get_raw(job_id)
        return JobRecord.model_validate_json(raw) if raw else None

    def get_raw(self, job_id: str) -> str | None:
        return self.r.get(self._k("job", job_id))

    def list_jobs(self, tenant: str, cursor: str | None, limit: int) -> tuple[list[JobRecord], str | None]:
        upper = f"({cursor}" if cursor else "+"
        ids = self.r.zrevrangebylex(self._k("tenant", tenant), upper, "-", start=0, num=limit + 1)
        raws = self.r.mget([self._k("job", i) for i in ids[:limit]]) if ids else []
        jobs = [JobRecord.model_validate_json(raw) for raw in raws if raw]
        return jobs, (ids[limit - 1] if len(ids) > limit else None)

    def ids_by_status(self, status: str) -> list[str]:
        return sorted(self.r.smembers(self._k("status", status)))

    def count_by_status(self) -> dict[str, int]:
        with self.r.pipeline(transaction=False) as pipe:
            for status in STATUSES:
                pipe.scard(self._k("status", status))
            counts = pipe.execute()
        return {s: n for s, n in zip(STATUSES, counts, strict=True) if n}

    def queued_by_target(self) -> dict[str, int]:
        targets = sorted(self.r.smembers(self._k("targets")))
        with self.r.pipeline(transaction=False) as pipe:
            for target in targets:
                pipe.scard(self._k("queued", target))
            counts = pipe.execute()
        return dict(zip(targets, counts, strict=True))

    def heartbeat(self, worker: WorkerInfo, ttl: float) -> None:
        with self.r.pipeline() as pipe:
            pipe.set(self._k("worker", worker.id), worker.model_dump_json(), px=int(ttl * 1000))
            pipe.sadd(self._k("workers"), worker.id)
            pipe.execute()

    def remove_worker(self, worker_id: str) -> None:
        with self.r.pipeline() as pipe:
            pipe.delete(self._k("worker", worker_id))
            pipe.srem(self._k("workers"), worker_id)
            pipe.execute()

    def workers(self) -> list[WorkerInfo]:
        ids = sorted(self.r.smembers(self._k("workers")))
        if not ids:
            return []
        raws = self.r.mget([self._k("worker", i) for i in ids])
        gone = [i for i, raw in zip(ids, raws, strict=True) if raw is None]
        if gone:
            self.r.srem(self._k("workers"), *gone)
        return [WorkerInfo.model_validate_json(raw) for raw in raws if raw]

    def incr(self, amounts: dict[str, float]) -> None:
        with self.r.pipeline(transaction=False) as pipe:
            for name, amount in amounts.items():
                pipe.hincrbyfloat(self._k("counters"), name, amount)
            pipe.execute()

    def counters(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.r.hgetall(self._k("counters")).items()}

    def grant(self, tenant: str, digests: Iterable[str]) -> None:
        values = list(digests)
        if values:
            self.r.sadd(self._k("owns", tenant), *values)

    def owns(self, tenant: str, digest: str) -> bool:
        return bool(self.r.sismember(self._k("owns", tenant), digest))

    def ping(self) -> bool:
        try:
            return bool(self.r.ping())
        except RedisError:
            return False

    def instance_id(self) -> str:
        return str(self.r.info("server")["run_id"])

    def close(self) -> None:
        self.r.close()

    def __repr__(self) -> str:
        return f"RedisJobStore(prefix={self.prefix!r})"
