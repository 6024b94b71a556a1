"""What every request handler shares: settings, stores, the job queue and the key ring."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from autofusion_core.blobs import BlobStore
from autofusion_core.queue import JobQueue
from autofusion_core.settings import Settings
from autofusion_core.store import JobStore, WorkerInfo

from .auth import KeyRing
from .status_views import StatusViews


@dataclass
class ServiceState:
    settings: Settings
    store: JobStore
    blobs: BlobStore
    queue: JobQueue
    keyring: KeyRing
    status_views: StatusViews = field(default_factory=StatusViews)
    _workers: tuple[float, list[WorkerInfo], set[str]] = (0.0, [], set())
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _heartbeats(self, max_age: float) -> tuple[list[WorkerInfo], set[str]]:
        with self._lock:
            fetched_at, workers, served = self._workers
            if time.monotonic() - fetched_at > max_age:
                workers = self.store.workers()
                served = {t for w in workers for t in w.targets}
                self._workers = (time.monotonic(), workers, served)
            return workers, served

    def live_workers(self, max_age: float = 1.0) -> list[WorkerInfo]:
        """Heartbeats, cached for a second: status polls ask this on every queued job."""
        return self._heartbeats(max_age)[0]

    def served_targets(self, max_age: float = 1.0) -> set[str]:
        """Targets live workers serve (same cache; do not modify the returned set)."""
        return self._heartbeats(max_age)[1]

    def close(self) -> None:
        self.queue.close()
        self.store.close()
