"""What every request handler shares: settings, stores, the job queue and the key ring."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from autofusion_worker.queue import JobQueue

from .auth import KeyRing
from .blobs import BlobStore
from .settings import Settings
from .store import JobStore, WorkerInfo


@dataclass
class ServiceState:
    settings: Settings
    store: JobStore
    blobs: BlobStore
    queue: JobQueue
    keyring: KeyRing
    _workers: tuple[float, list[WorkerInfo]] = (0.0, [])
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def live_workers(self, max_age: float = 1.0) -> list[WorkerInfo]:
        """Heartbeats, cached for a second: status polls ask this on every queued job."""
        with self._lock:
            fetched_at, workers = self._workers
            if time.monotonic() - fetched_at > max_age:
                workers = self.store.workers()
                self._workers = (time.monotonic(), workers)
            return workers

    def served_targets(self) -> set[str]:
        return {t for w in self.live_workers() for t in w.targets}

    def close(self) -> None:
        self.queue.close()
        self.store.close()
