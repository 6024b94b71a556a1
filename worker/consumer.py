"""Is this worker's task consumer live, and how to make it reconnect.

Celery's consumer can miss that Redis went away: after a Redis restart while jobs ran, a worker kept
its consumer on the dead connection and never fetched again, while its heartbeat (a separate
thread) went on saying it was live. Two pieces fix that:

- `ConsumerStep`, a bootstep of the consumer, marks the consumer live when its task consumer has
  started on a connection and not live when it stops, so heartbeats (and with them `/readyz` and
  `/targets`) count only workers that are actually fetching.
- `ConsumerWatch.reconnect()` asks the consumer's event loop (thread-safely, through the hub's
  `call_soon`) to raise a connection error; Celery handles it as a lost broker connection: it
  tears the consumer down, reconnects and starts consuming again. The heartbeat calls it when it
  sees the broker come back from an outage or restart (see `heartbeat.py`). A reconnect that was
  not needed costs one reconnection; the job store makes a redelivered message harmless.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import Celery, bootsteps

log = logging.getLogger("autofusion_worker")


class BrokerReconnect(ConnectionError):
    """Raised inside the consumer's event loop to make Celery reconnect it."""


class ConsumerWatch:
    """The consumer's state as the heartbeat thread sees it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._consumer: Any = None
        self._live = False
        self.starts = 0

    @property
    def live(self) -> bool:
        return self._live

    def started(self, consumer: Any) -> None:
        with self._lock:
            self._consumer, self._live = consumer, True
            self.starts += 1

    def stopped(self) -> None:
        with self._lock:
            self._live = False

    def reconnect(self, reason: str) -> bool:
        """Make the consumer drop its connection and reconnect. False if it is not running."""
        with self._lock:
            hub = getattr(self._consumer, "hub", None)
            if hub is None or not self._live:
                # Not started, or a polling loop without a hub (the embedded file broker, which
                # has no connection to lose).
                return False
            self._live = False  # until the restarted consumer says otherwise

        def fail_connection() -> None:
            raise BrokerReconnect(reason)

        log.warning("reconnecting the task consumer: %s", reason)
        hub.call_soon(fail_connection)
        return True


class ConsumerStep(bootsteps.StartStopStep):
    """Tells the app's `ConsumerWatch` when the task consumer starts and stops."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.watch: ConsumerWatch | None = getattr(parent.app, "autofusion_watch", None)

    def start(self, parent: Any) -> None:
        if self.watch is not None:
            self.watch.started(parent)

    def stop(self, parent: Any) -> None:
        if self.watch is not None:
            self.watch.stopped()

    def shutdown(self, parent: Any) -> None:
        self.stop(parent)


def watch_consumer(app: Celery) -> ConsumerWatch:
    """Install the step on `app` and return the watch it reports to."""
    watch = ConsumerWatch()
    app.autofusion_watch = watch  # type: ignore[attr-defined]
    app.steps["consumer"].add(ConsumerStep)
    return watch
