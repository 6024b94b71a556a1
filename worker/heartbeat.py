"""Worker heartbeats and the lease sweep, run by a thread in each worker's main process.

The heartbeat tells the API which targets live workers serve (`GET /targets`, `/readyz`, the
`waiting_for_worker` stage). The sweep finds runs whose lease lapsed — their process died or hung —
and requeues them (republishing the job id) or fails them after `max_attempts`. Every worker sweeps;
the store's atomic transitions make concurrent sweeps harmless.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

from autofusion_core.queue import JobQueue
from autofusion_core.settings import Settings
from autofusion_core.store import JobStore, WorkerInfo

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
    ) -> None:
        super().__init__(name="autofusion-heartbeat", daemon=True)
        self.settings, self.store, self.queue = settings, store, queue
        self.info = WorkerInfo(
            id=worker_id,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            targets=targets,
            concurrency=concurrency,
            last_seen=time.time(),
        )
        self._stop_event = threading.Event()

    def beat(self) -> None:
        self.info.last_seen = time.time()
        self.store.heartbeat(self.info, ttl=3 * self.settings.heartbeat_interval)

    def sweep(self) -> int:
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
                if now >= next_beat:
                    self.beat()
                    next_beat = now + self.settings.heartbeat_interval
                if now >= next_sweep:
                    self.sweep()
                    next_sweep = now + self.settings.sweep_interval
            except Exception:  # the store or broker is briefly away: keep beating once it is back
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
