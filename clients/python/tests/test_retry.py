import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
from graph_autofusion_client import RetryPolicy
from graph_autofusion_client._retry import PollSchedule, parse_retry_after


def test_retry_after_seconds_and_http_dates() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(" 1.5 ") == 1.5
    assert parse_retry_after(format_datetime(now + timedelta(seconds=7), usegmt=True), now=now) == 7.0
    assert parse_retry_after(format_datetime(now - timedelta(seconds=7), usegmt=True), now=now) == 0.0
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None
    assert parse_retry_after("-4") == 0.0


def test_what_is_retried() -> None:
    policy = RetryPolicy(max_retries=2)
    request = httpx.Request("GET", "http://x")
    assert policy.should_retry(0, exc=httpx.ConnectError("no", request=request))
    assert policy.should_retry(1, exc=httpx.ReadTimeout("slow", request=request))
    assert not policy.should_retry(2, exc=httpx.ConnectError("no", request=request))  # bounded
    assert not policy.should_retry(0, exc=httpx.UnsupportedProtocol("ftp", request=request))
    assert [s for s in (200, 400, 404, 429, 500, 502, 503, 504) if policy.should_retry(0, status=s)] == [
        429,
        502,
        503,
        504,
    ]


def test_backoff_grows_until_the_cap() -> None:
    policy = RetryPolicy(backoff_base=1.0, backoff_cap=5.0, rng=random.Random(3))
    worst = [max(policy.delay(n) for _ in range(400)) for n in range(6)]
    assert worst[0] <= 1.0 < worst[1] <= 2.0 < worst[2] <= 4.0
    assert all(w <= 5.0 for w in worst) and worst[5] > 4.0


def test_poll_schedule_backs_off_while_idle_and_resets_on_movement() -> None:
    schedule = PollSchedule(min_interval=0.5, max_interval=4.0, factor=2.0)
    idle = [schedule.next_delay(None, moved=False) for _ in range(6)]
    assert idle == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert schedule.next_delay(None, moved=True) == 0.5
    assert schedule.next_delay(2.0, moved=False) == 2.0  # the service's Retry-After wins ...
    assert schedule.next_delay(60.0, moved=False) == 4.0  # ... within the cap
    assert schedule.next_delay(0.0, moved=False) == 0.5  # and never below the floor
