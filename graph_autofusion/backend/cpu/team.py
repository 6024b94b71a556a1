"""How many OpenMP threads each run of a compiled model uses: the full team, or one thread while
the full team measurably runs slower than one.

Why: the 2-vCPU virtual machines this runs on have stretches (seconds to minutes) in which the
second vCPU barely runs. Every kernel's closing barrier then waits for a worker that wakes late
or is descheduled holding a task, and a model on two threads runs slower than on one: MobileNetV2
on the Zen 4 host, medians over a minute of interleaved runs, 4.84 ms on two threads and 7.65 on
one in the normal stretches, 8.96 on two and 7.68 on one in the slow ones (OpenVINO 4.57 and
7.22). A thread count fixed at load cannot follow that; the run's own wall time can.

The policy (`TeamChoice`): runs use the full team while its recent time (an average of the last
few runs) stays within SLOW_FACTOR of the fastest full-team run seen. Past that, one run on one
thread is tried (at most once per PROBE_EVERY runs), and while one thread is faster the runs stay
there, trying the full team again every PROBE_EVERY runs. A one-thread probe that loses doubles
the wait before the next (up to MAX_PROBE_EVERY). In the normal stretches no run is taken away
from the full team. Models faster than MIN_ADAPT_SECONDS on the full team are left alone: a wake-up
there is most of the run, and timing it costs a visible share. `AUTOFUSION_ADAPTIVE_TEAM=0` turns
the policy off (every run on the full team).
"""

from __future__ import annotations

import os

ADAPTIVE_TEAM_ENV = "AUTOFUSION_ADAPTIVE_TEAM"
# The full team counts as impaired once its recent time exceeds its best by this factor (normal
# run-to-run spread on these hosts is +-10%).
SLOW_FACTOR = 1.25
# Runs between probes of the other team size; a one-thread probe that loses doubles the interval
# before the next one, up to MAX_PROBE_EVERY (an impaired team that still beats one thread, as
# ResNet-50's usually does, is not taxed a slow run every PROBE_EVERY).
PROBE_EVERY = 16
MAX_PROBE_EVERY = 256
# Weight of the newest run in a team size's recent time.
RECENT_WEIGHT = 0.25
# Below this full-team time (seconds) the team is never changed.
MIN_ADAPT_SECONDS = 1e-3


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
        self.recent: dict[int, float] = {}
        self.best_full: float | None = None
        self._since_probe = PROBE_EVERY  # a first probe may come at once
        self._interval = PROBE_EVERY  # runs between one-thread probes
        self._last: int | None = None

    def threads_for_run(self) -> int:
        if not self.enabled:
            return self.full
        other = 1 if self.current == self.full else self.full
        interval = self._interval if other == 1 else PROBE_EVERY
        if self._since_probe >= interval and self._probe_due():
            self._since_probe = 0
            return other
        self._since_probe += 1
        return self.current

    def _probe_due(self) -> bool:
        if self.current != self.full:
            return True  # is the full team well again?
        recent, best = self.recent.get(self.full), self.best_full
        return recent is not None and best is not None and recent > SLOW_FACTOR * best

    def record(self, threads: int, seconds: float) -> None:
        """The wall time of a run on `threads` threads."""
        if not self.enabled:
            return
        previous = self.recent.get(threads)
        consecutive = self._last == threads and previous is not None
        self.recent[threads] = previous + RECENT_WEIGHT * (seconds - previous) if consecutive else seconds
        self._last = threads
        if threads == self.full:
            self.best_full = seconds if self.best_full is None else min(self.best_full, seconds)
            if self.best_full < MIN_ADAPT_SECONDS and self.current == self.full:
                self.enabled = False  # too short a model to be worth timing
                return
        one, full = self.recent.get(1), self.recent.get(self.full)
        if one is not None and full is not None:
            before, self.current = self.current, 1 if one < full else self.full
            if threads == 1 and before == self.current == self.full:  # a one-thread probe lost
                self._interval = min(2 * self._interval, MAX_PROBE_EVERY)
            elif self.current != before:
                self._interval = PROBE_EVERY
