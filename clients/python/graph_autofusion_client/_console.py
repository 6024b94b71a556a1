"""Terminal output of the CLI: a live progress line, and the final statistics table.

Progress goes to stderr so that ``--json`` output on stdout stays machine-readable. On a TTY the bar
redraws one line in place; elsewhere (CI logs) each change is a plain line of its own, because
carriage returns turn a log file into one unreadable line.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TextIO

from ._job import _JobView
from ._models import BeforeAfter, Report

BAR_WIDTH = 24


def _is_tty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class ProgressPrinter:
    """``on_progress`` callback for ``wait()`` that draws the job's status, stage and progress."""

    def __init__(self, stream: TextIO, *, tty: bool | None = None) -> None:
        self.stream = stream
        self.tty = _is_tty(stream) if tty is None else tty
        self._start = time.monotonic()
        self._drawn = False

    def line(self, job: _JobView) -> str:
        elapsed = time.monotonic() - self._start
        parts = [f"{int(elapsed) // 60:02d}:{int(elapsed) % 60:02d}", job.id, job.status.value]
        if job.stage:
            parts.append(job.stage)
        progress = job.progress
        if progress is not None and progress.total > 0:
            if self.tty:
                filled = round(BAR_WIDTH * min(progress.done, progress.total) / progress.total)
                parts.append("[" + "#" * filled + "." * (BAR_WIDTH - filled) + "]")
            unit = " kernels" if job.stage and "compil" in job.stage else ""
            parts.append(f"{progress.done}/{progress.total}{unit}")
        return "  ".join(parts)

    def __call__(self, job: _JobView) -> None:
        text = self.line(job)
        if self.tty:
            self.stream.write("\r\x1b[2K" + text)
            self._drawn = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End the redrawn line so that what follows starts on a fresh one."""
        if self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False


def _human_bytes(value: float | int | None) -> str:
    if value is None:
        return "?"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"  # pragma: no cover


def _arrow(pair: BeforeAfter, fmt: Callable[[Any], str] = str) -> str | None:
    if pair.before is None and pair.after is None:
        return None
    return f"{fmt(pair.before)} -> {fmt(pair.after)}"


def statistics_rows(job: _JobView, report: Report | None) -> list[tuple[str, str]]:
    """The rows of the final table: the job's identity, then what fusion did and is estimated to buy."""
    rows: list[tuple[str, str | None]] = [
        ("job", job.id),
        ("status", job.status.value),
        ("target", job.target),
    ]
    if job.model is not None:
        rows.append(("model", f"{job.model.filename or '-'} ({_human_bytes(job.model.size)})"))
    if job.artifacts.model is not None:
        fused = job.artifacts.model
        rows.append(("fused model", f"{_human_bytes(fused.size)}, sha256 {fused.digest[:12]}"))
    if job.error is not None:
        rows.append(("error", f"[{job.error.code}] {job.error.detail or job.error.title}"))
    if report is not None:
        ops = report.operators
        est = report.estimates
        latency = _arrow(est.latency_us, lambda v: f"{v:.1f} us" if v is not None else "?")
        speedup = est.speedup
        rows += [
            (
                "operators",
                f"{ops.original} (canonical {ops.canonical})" if ops.original is not None else None,
            ),
            ("kernels", _arrow(report.kernels)),
            ("fusions", None if report.fusions is None else str(report.fusions)),
            ("bytes moved", _arrow(est.bytes_moved, _human_bytes)),
            ("peak memory", _arrow(est.peak_memory_bytes, _human_bytes)),
            (f"latency ({est.profile or '?'})", latency),
            ("est. speedup", None if speedup is None else f"{speedup:.2f}x"),
            ("strategy", report.strategy),
            ("refused", ", ".join(f"{code} x{n}" for code, n in report.refusals().items()) or "none"),
        ]
    return [(name, value) for name, value in rows if value is not None]


def render_table(rows: list[tuple[str, str]]) -> str:
    width = max((len(name) for name, _ in rows), default=0)
    return "\n".join(f"{name.ljust(width)}  {value}" for name, value in rows)
