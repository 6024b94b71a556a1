"""Which failures mean "a dependency is away", not "a bug": the store or the broker is unreachable.

The API answers these as `503 broker_unavailable` with `Retry-After` (clients retry), and a worker
waits them out instead of failing the job it runs: a Redis restart is an outage, not a verdict on
the model. Everything else stays a bug and is reported as one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import kombu.exceptions
import redis.exceptions

T = TypeVar("T")


class StoreUnavailable(Exception):
    """Raised by a job store that cannot reach its backend (an embedded database locked for long)."""


#: Exceptions that say the job store or the broker cannot be reached right now.
UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,  # refused, reset, closed; also BusyLoadingError (AOF replay)
    redis.exceptions.TimeoutError,
    kombu.exceptions.OperationalError,
    StoreUnavailable,
)


def is_unavailable(exc: BaseException) -> bool:
    return isinstance(exc, UNAVAILABLE_ERRORS)


def until_available(
    call: Callable[[], T], timeout: float, *, interval: float = 0.2, max_interval: float = 2.0
) -> T:
    """`call()`, retried with backoff while the store or broker is unavailable, for up to `timeout`
    seconds; then the last unavailability error propagates. Other errors propagate at once."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except UNAVAILABLE_ERRORS:
            if time.monotonic() + interval > deadline:
                raise
        time.sleep(interval)
        interval = min(max_interval, interval * 2)
