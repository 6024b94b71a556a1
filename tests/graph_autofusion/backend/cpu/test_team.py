"""The run-by-run team size (backend/cpu/team.py), driven by synthetic wall times: the full team
while it runs near its best, one thread only while that is measurably faster."""

from __future__ import annotations

import itertools

import pytest

from graph_autofusion.backend.cpu.team import (
    ADAPTIVE_TEAM_ENV,
    FULL_PROBE_RUNS,
    MAX_PROBE_EVERY,
    MIN_ADAPT_SECONDS,
    PROBE_EVERY,
    SLOW_FACTOR,
    WINDOW,
    TeamChoice,
)

FULL_MS, ONE_MS = 5.0, 7.7  # MobileNetV2 on the Zen 4 host, two threads and one


def _runs(team: TeamChoice, n: int, times: dict[int, float]) -> list[int]:
    """`n` runs, each taking `times[threads]` ms; the thread counts the policy chose."""
    chosen = []
    for _ in range(n):
        threads = team.threads_for_run()
        team.record(threads, times[threads] / 1e3)
        chosen.append(threads)
    return chosen


def test_a_healthy_team_keeps_every_run() -> None:
    team = TeamChoice(2, enabled=True)
    # spread within SLOW_FACTOR of the best: never a one-thread run
    chosen = []
    for k in range(10 * PROBE_EVERY):
        full = FULL_MS * (1.0 + 0.2 * (k % 3) / 2)
        chosen += _runs(team, 1, {2: full, 1: ONE_MS})
    assert set(chosen) == {2}


def test_a_cold_first_run_or_a_slow_run_now_and_then_leaves_the_team_alone() -> None:
    team = TeamChoice(2, enabled=True)
    # the first run pays page faults (2.6x), then a one-off 2x run every WINDOW runs
    times = [2.6 * FULL_MS] + [FULL_MS * (2.0 if k % WINDOW == 0 else 1.0) for k in range(1, 20 * WINDOW)]
    chosen = []
    for ms in times:
        chosen += _runs(team, 1, {2: ms, 1: ONE_MS})
    assert set(chosen) == {2}


@pytest.mark.parametrize("scale", [1.0, 0.005])  # MobileNetV2's times, and a batch-1 MLP's (25 us)
def test_an_impaired_team_gives_way_to_one_thread_and_takes_over_again(scale: float) -> None:
    team = TeamChoice(2, enabled=True)
    _runs(team, 4, {2: FULL_MS * scale, 1: ONE_MS * scale})
    # the second vCPU barely runs: two threads slower than one
    slow = _runs(team, 3 * PROBE_EVERY, {2: 9.0 * scale, 1: ONE_MS * scale})
    switched = slow.index(1)
    assert switched <= 8  # once the recent time passes SLOW_FACTOR x the best
    after = slow[switched:]
    # from then on one thread, the full team tried FULL_PROBE_RUNS runs in a row every PROBE_EVERY
    probes = len(after) / (PROBE_EVERY + FULL_PROBE_RUNS)
    assert after.count(2) == pytest.approx(FULL_PROBE_RUNS * probes, abs=FULL_PROBE_RUNS)
    assert all(
        len(list(g)) == FULL_PROBE_RUNS for k, g in itertools.groupby(after[:-FULL_PROBE_RUNS]) if k == 2
    )
    assert team.current == 1
    # the team recovers: the next probe finds it faster and every run goes back to it
    back = _runs(team, 2 * PROBE_EVERY, {2: FULL_MS * scale, 1: ONE_MS * scale})
    first = back.index(2)
    assert first <= PROBE_EVERY and set(back[first:]) == {2}
    # every run is counted under the team size it was given (what a benchmark reports)
    chosen = [2] * 4 + slow + back
    assert team.runs == {2: chosen.count(2), 1: chosen.count(1)} and chosen.count(1) > PROBE_EVERY


def test_a_full_team_probe_that_must_first_wake_its_workers_still_takes_the_runs_back() -> None:
    team = TeamChoice(2, enabled=True)
    _runs(team, 4, {2: FULL_MS, 1: ONE_MS})
    _runs(team, 3 * PROBE_EVERY, {2: 9.0 * FULL_MS, 1: ONE_MS})
    assert team.current == 1
    # healthy again, but the worker slept through the one-thread runs: a full-team run right
    # after one costs 3x one thread's (a batch-1 MLP: 60-140 us against 47), the next FULL_MS
    chosen, previous = [], 1
    for _ in range(2 * PROBE_EVERY):
        threads = team.threads_for_run()
        team.record(
            threads, (3 * ONE_MS if previous == 1 else FULL_MS) / 1e3 if threads == 2 else ONE_MS / 1e3
        )
        chosen.append(previous := threads)
    first = chosen.index(2)
    assert first <= PROBE_EVERY and set(chosen[first:]) == {2} and team.current == 2


def test_a_slow_team_that_still_beats_one_thread_keeps_the_runs() -> None:
    team = TeamChoice(2, enabled=True)
    _runs(team, 4, {2: FULL_MS, 1: ONE_MS})
    chosen = _runs(team, 1000, {2: FULL_MS * SLOW_FACTOR * 1.2, 1: ONE_MS})
    # one-thread probes ever rarer (each loss doubles the wait, up to MAX_PROBE_EVERY runs), and
    # the runs stay with the team
    probes = [k for k, threads in enumerate(chosen) if threads == 1]
    gaps = [b - a for a, b in itertools.pairwise(probes)]
    assert team.current == 2 and len(probes) <= 1000 // MAX_PROBE_EVERY + 5
    assert gaps == sorted(gaps) and gaps[-1] >= MAX_PROBE_EVERY


def test_off_one_thread_and_short_models_always_take_the_full_team(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ADAPTIVE_TEAM_ENV, "0")
    off = TeamChoice(2)
    assert set(_runs(off, 40, {2: 9.0, 1: 1.0})) == {2} and off.runs == {2: 40}
    monkeypatch.delenv(ADAPTIVE_TEAM_ENV)
    assert TeamChoice(2).enabled and not TeamChoice(1).enabled
    assert set(_runs(TeamChoice(1), 5, {1: 1.0})) == {1}
    short = MIN_ADAPT_SECONDS * 1e3 / 2
    team = TeamChoice(2, enabled=True)
    assert set(_runs(team, 40, {2: short, 1: short / 10})) == {2} and not team.enabled
