"""When to try a request again, and how long to wait: pure decisions, no I/O.

Both clients ask the same `RetryPolicy` and only differ in how they sleep, so the sync and async
behaviour cannot drift apart. Every request the client makes is idempotent (``POST /fuse`` returns
the existing job for a repeated submission), so connection errors are retried on every method.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx

RETRY_STATUSES = frozenset({429, 502, 503, 504})

# Transport failures where the service never answered (or the connection broke mid-answer): the
# service may be restarting, behind a load balancer that lost its upstream, or briefly overloaded.
RETRY_EXCEPTIONS: tuple[type[Exception], ...] = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.ReadError,
    httpx.WriteError,
    httpx.ReadTimeout,
    httpx.WriteTimeout,
    httpx.PoolTimeout,
    httpx.RemoteProtocolError,
)


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff with full jitter.

    ``max_retries`` extra attempts after the first; the n-th retry waits a random time in
    ``[0, min(backoff_cap, backoff_base * 2**n)]`` (full jitter keeps many pipeline jobs that lost the
    service at the same moment from coming back in lockstep). A ``Retry-After`` from the service
    replaces the random delay, still capped by ``backoff_cap``.
    """

    max_retries: int = 5
    backoff_base: float = 0.5
    backoff_cap: float = 8.0
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def should_retry(self, attempt: int, *, status: int | None = None, exc: Exception | None = None) -> bool:
        """``attempt`` counts retries already made (0 after the first try)."""
        if attempt >= self.max_retries:
            return False
        if exc is not None:
            return isinstance(exc, RETRY_EXCEPTIONS)
        return status in RETRY_STATUSES

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        if retry_after is not None:
            return max(0.0, min(retry_after, self.backoff_cap))
        return self.rng.uniform(0.0, min(self.backoff_cap, self.backoff_base * (2**attempt)))


NO_RETRY = RetryPolicy(max_retries=0)


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date); ``None`` if absent/bad."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


@dataclass
class PollSchedule:
    """How long ``wait()`` sleeps between polls.

    The service's ``Retry-After`` is honoured (it knows its queue), clamped to
    ``[min_interval, max_interval]``; without it the interval grows by ``factor`` up to
    ``max_interval`` and drops back whenever the job visibly moved, so a progress bar stays live
    while a long queue wait does not hammer the service.
    """

    min_interval: float = 0.2
    max_interval: float = 5.0
    factor: float = 1.5
    _current: float = 0.0

    def next_delay(self, retry_after: float | None, *, moved: bool) -> float:
        if moved or self._current == 0.0:
            self._current = self.min_interval
        else:
            self._current = min(self.max_interval, self._current * self.factor)
        if retry_after is not None:
            return max(self.min_interval, min(retry_after, self.max_interval))
        return self._current
