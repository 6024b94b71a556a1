"""Worker heartbeats, broker-outage recovery and the lease sweep, run by a thread in each worker's
main process.

The heartbeat tells the API which targets live workers serve (`GET /targets`, `/readyz`, the
`waiting_for_worker` stage) — but only while the worker's task consumer is live (`consumer.py`),
so a worker that cannot fetch jobs is never counted as ready.

Each round also checks the store's instance id (Redis' `run_id`). When the store was unreachable,
or its instance changed (Redis restarted, perhaps between two rounds), the thread makes the
consumer reconnect: Celery's own detection misses some of these, and a consumer left on a dead
connection never fetches again. After such an outage the sweep holds off for one lease period, so
that runs which could not renew their lease while Redis was away renew it before they are judged
dead.

The sweep finds runs whose lease lapsed — their process died or hung — and requeues them
(republishing the job id) or fails them after `max_attempts`. Every worker sweeps; the store's atomic
transitions make concurrent sweeps harmless.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

from autofusion_core.errors import is_unavailable
from autofusion_core.queue import JobQueue
from autofusion_core.settings import Settings
from autofusion_core.store import JobStore, WorkerInfo

from .consumer import ConsumerWatch

log = logging.getLogger("autofusion_worker")


class Heartbeat(threading.Thread):
    def __init__(
        self,
        settings: Settings,
        store: JobStore,
        queue: JobQueue,
        worker_id: str,
        targets: list[str],
        concurrency: int,
        watch: ConsumerWatch | None = None,
        modes: dict[str, str] | None = None,
    ) -> None:
        super().__init__(name="autofusion-heartbeat", daemon=True)
        self.settings, self.store, self.queue, self.watch = settings, store, queue, watch
        self.info = WorkerInfo(
            id=worker_id,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            targets=targets,
            concurrency=concurrency,
            modes=modes or {},
            last_seen=time.time(),
        )
        self._stop_event = threading.Event()
        self._instance: str | None = None
        self._outage = False
        self._sweep_after = 0.0
        self._beating = False

    @property
    def consumer_live(self) -> bool:
        return self.watch is None or self.watch.live

    def beat(self) -> None:
        if not self.consumer_live:
            if self._beating:  # withdraw at once rather than letting the heartbeat expire
                self.store.remove_worker(self.info.id)
                self._beating = False
            return
        self.info.last_seen = time.time()
        self.store.heartbeat(self.info, ttl=3 * self.settings.heartbeat_interval)
        self._beating = True

    def check_broker(self) -> None:
        """Reconnect the consumer if the store/broker was away or restarted since the last round."""
        instance = self.store.instance_id()  # raises while unreachable
        restarted = self._instance is not None and instance != self._instance
        self._instance = instance
        if restarted or self._outage:
            self._outage = False
            self._sweep_after = time.monotonic() + self.settings.lease_seconds
            if self.watch is not None:
                self.watch.reconnect("the broker was unreachable or restarted")

    def sweep(self) -> int:
        if time.monotonic() < self._sweep_after:
            return 0
        requeued = self.store.sweep(self.settings.max_attempts, stale_after=self.settings.visibility_timeout)
        for job in requeued:
            log.warning(
                "job %s: republished (lease expired after attempt %d, or queued too long)",
                job.id,
                job.attempt,
            )
            self.queue.publish(job.id, job.target)
        return len(requeued)

    def run(self) -> None:
        next_beat = next_sweep = 0.0
        while not self._stop_event.is_set():
            now = time.monotonic()
            try:
                self.check_broker()
                if now >= next_beat or (self.consumer_live != self._beating):
                    self.beat()
                    next_beat = now + self.settings.heartbeat_interval
                if now >= next_sweep:
                    self.sweep()
                    next_sweep = now + self.settings.sweep_interval
            except Exception as exc:  # the store or broker is away: reconnect once it is back
                if is_unavailable(exc):
                    if not self._outage:
                        log.warning("the job store/broker is unreachable (%s); waiting for it", exc)
                    self._outage = True
                else:
                    log.warning("heartbeat/sweep failed", exc_info=True)
            self._stop_event.wait(min(self.settings.heartbeat_interval, self.settings.sweep_interval, 1.0))
        self._withdraw()

    def drain(self) -> None:
        """The worker is shutting down: stop offering it as live at once (`/readyz`, `/targets`)
        while its running job finishes. Safe to call from a signal handler: it only sets an event;
        the thread itself withdraws the heartbeat."""
        self._stop_event.set()

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=5)
        self._withdraw()

    def _withdraw(self) -> None:
        try:
            self.store.remove_worker(self.info.id)
        except Exception:
            log.warning("could not remove the heartbeat of %s", self.info.id, exc_info=True)
