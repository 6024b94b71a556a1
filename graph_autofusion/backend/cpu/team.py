"""How many OpenMP threads each run of a compiled model uses: the full team, or one thread while
the full team measurably runs slower than one.

Why: the 2-vCPU virtual machines this runs on have stretches (seconds to minutes) in which the
second vCPU barely runs. Every kernel's closing barrier then waits for a worker that wakes late
or is descheduled holding a task, and a model on two threads runs slower than on one: MobileNetV2
on the Zen 4 host, medians over a minute of interleaved runs, 4.84 ms on two threads and 7.65 on
one in the normal stretches, 8.96 on two and 7.68 on one in the slow ones (OpenVINO 4.57 and
7.22). A thread count fixed at load cannot follow that; the run's own wall time can. (Those
figures are libgomp's. On the project's thread pool, threadpool/, a kernel no longer waits for a
worker that has not started its task, only for one descheduled while it holds one: the policy
stays for that case.)

The policy (`TeamChoice`): runs use the full team while the median of its last WINDOW runs stays
within SLOW_FACTOR of the fastest full-team run seen. Past that, one run on one thread is tried (at
most once per PROBE_EVERY runs); if it beats that median, the runs stay on one thread, trying the
full team again every PROBE_EVERY runs, FULL_PROBE_RUNS runs in a row, and going back to it as soon
as one of them beats one thread's recent time. In a row because a worker idle since the last
probe has gone to sleep, and the run that wakes it pays for that: a batch-1 MLP's full-team probes
took 60-140 us against 16-20 for the run after, so a lone probe never won and the MLP stayed on
one thread (47 us) for good once another runtime's spinning threads had sent it there. A
one-thread probe that loses doubles the wait before the next (up to MAX_PROBE_EVERY). A median,
not a mean: the first run pays page faults and cold caches (2-3x a warm run), and a mean that
remembered it sent MobileNetV2 to one thread for its first 16 runs on the Emerald Rapids host,
where two threads are 1.6x faster.
In the normal stretches no run is taken away from the full team. Short models adapt too: a
batch-1 MLP (25 us on two threads, 47 on one) whose worker thread waits behind another runtime's
spinning threads in the same process (OpenVINO's, in the benchmark's alternating rounds) took
0.28 ms a run, 0.09 with the policy; an OpenMP region cannot finish without every thread of its
team, where onnxruntime's caller finishes a loop alone. Only models faster than MIN_ADAPT_SECONDS
on the full team are left alone: there a wake-up is most of the run, and the policy's own
bookkeeping (under a microsecond a run) a visible share. `AUTOFUSION_ADAPTIVE_TEAM=0` turns the
policy off (every run on the full team).
"""

from __future__ import annotations

import os
import statistics
from collections import Counter, deque

ADAPTIVE_TEAM_ENV = "AUTOFUSION_ADAPTIVE_TEAM"
# The full team counts as impaired once the median of its last WINDOW runs exceeds its best by
# this factor (normal run-to-run spread on these hosts is +-10%).
SLOW_FACTOR = 1.25
# Full-team runs whose median tells an impaired team from a slow run or two; at least
# WINDOW // 2 + 1 of them must be in before a one-thread probe.
WINDOW = 5
# Runs between probes of the other team size; a one-thread probe that loses doubles the interval
# before the next one, up to MAX_PROBE_EVERY (an impaired team that still beats one thread, as
# ResNet-50's usually does, is not taxed a slow run every PROBE_EVERY).
PROBE_EVERY = 16
MAX_PROBE_EVERY = 256
# Consecutive full-team runs in a probe from one thread (the first wakes the sleeping workers).
FULL_PROBE_RUNS = 2
# Weight of the newest run in one thread's recent time.
RECENT_WEIGHT = 0.25
# Below this full-team time (seconds) the team is never changed.
MIN_ADAPT_SECONDS = 5e-6


def adaptive_team_enabled() -> bool:
    """Whether `AUTOFUSION_ADAPTIVE_TEAM` leaves the policy on (the default)."""
    return os.environ.get(ADAPTIVE_TEAM_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


class TeamChoice:
    """Picks the thread count of each run (`threads_for_run`) from the wall times it is told
    (`record`). Not thread-safe: the runtime calls it under its run lock."""

    def __init__(self, threads: int, enabled: bool | None = None) -> None:
        self.full = threads
        self.enabled = (adaptive_team_enabled() if enabled is None else enabled) and threads > 1
        self.current = threads  # the team size runs use between probes
        self.full_runs: deque[float] = deque(maxlen=WINDOW)  # the last full-team wall times
        self.best_full: float | None = None
        self.recent_one: float | None = None  # one thread's recent time (a running average)
        self._since_probe = PROBE_EVERY  # a first probe may come at once
        self._interval = PROBE_EVERY  # runs between one-thread probes
        self._probe_left = 0  # full-team runs still due in the current probe from one thread
        # runs per team size chosen: a benchmark of a model reports how many of its runs left
        # the full team (a figure from one-thread runs is not the full team's)
        self.runs: Counter[int] = Counter()

    def threads_for_run(self) -> int:
        threads = self._choose()
        self.runs[threads] += 1
        return threads

    def _choose(self) -> int:
        if not self.enabled:
            return self.full
        if self._probe_left:
            self._probe_left -= 1
            return self.full
        if self.current == self.full:
            due = self._since_probe >= self._interval and self.impaired()
        else:
            due = self._since_probe >= PROBE_EVERY  # is the full team well again?
        if due:
            self._since_probe = 0
            if self.current == self.full:
                return 1
            self._probe_left = FULL_PROBE_RUNS - 1
            return self.full
        self._since_probe += 1
        return self.current

    def impaired(self) -> bool:
        """Whether the full team's recent runs are, as a median, past SLOW_FACTOR x its best."""
        if len(self.full_runs) <= WINDOW // 2 or self.best_full is None:
            return False
        return statistics.median(self.full_runs) > SLOW_FACTOR * self.best_full

    def record(self, threads: int, seconds: float) -> None:
        """The wall time of a run on `threads` threads."""
        if not self.enabled:
            return
        if threads == self.full:
            self.full_runs.append(seconds)
            self.best_full = seconds if self.best_full is None else min(self.best_full, seconds)
            if self.current == self.full:
                if self.best_full < MIN_ADAPT_SECONDS:
                    self.enabled = False  # too short a model to be worth timing
            elif self.recent_one is not None and seconds < self.recent_one:
                self.current = self.full  # a full-team probe won: its old slow runs are history
                self._probe_left = 0
                self.full_runs.clear()
                self.full_runs.append(seconds)
                self._interval = PROBE_EVERY
            return
        previous = self.recent_one
        self.recent_one = seconds if previous is None else previous + RECENT_WEIGHT * (seconds - previous)
        if self.current == self.full:  # a one-thread probe
            if seconds < statistics.median(self.full_runs):
                self.current, self._interval = 1, PROBE_EVERY
            else:
                self._interval = min(2 * self._interval, MAX_PROBE_EVERY)
