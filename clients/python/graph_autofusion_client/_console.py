"""Terminal output of the CLI: a live progress line, and the final statistics table.

Progress goes to stderr so that ``--json`` output on stdout stays machine-readable. On a TTY the bar
redraws one line in place; elsewhere (CI logs) each change is a plain line of its own, because
carriage returns turn a log file into one unreadable line.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, TextIO

from ._job import _JobView
from ._models import Report

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


def _flatten(prefix: str, value: Any) -> Iterable[tuple[str, str]]:
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _flatten(f"{prefix}.{key}" if prefix else str(key), inner)
    elif isinstance(value, list):
        yield prefix, str(len(value))
    elif isinstance(value, float):
        yield prefix, f"{value:.4g}"
    elif value is not None:
        yield prefix, str(value)


def statistics_rows(job: _JobView, report: Report | None) -> list[tuple[str, str]]:
    """The rows of the final table: the job's identity, then every statistic the report carries.

    The report is rendered generically (numbers as they are, lists by their length, nested objects
    as dotted keys) so that a statistic the engine adds shows up without a client release.
    """
    rows: list[tuple[str, str]] = [("job", job.id), ("status", job.status.value), ("target", job.target)]
    if job.model is not None:
        rows.append(("model", f"{job.model.filename or '-'} ({job.model.size} bytes)"))
    if job.artifacts.model is not None:
        fused = job.artifacts.model
        rows.append(("fused model", f"{fused.size} bytes, sha256 {fused.digest[:12]}"))
    if job.error is not None:
        rows.append(("error", f"[{job.error.code}] {job.error.detail or job.error.title}"))
    if report is not None:
        data = report.model_dump(mode="json")
        for key in ("operators", "kernels", "fusions", "groups", "refused"):
            rows.extend(_flatten(key, data.pop(key, None)))
        for code, count in sorted(report.refused_by_code().items()):
            rows.append((f"refused {code}", str(count)))
        for key, value in data.items():
            rows.extend(_flatten(key, value))
    return rows


def render_table(rows: list[tuple[str, str]]) -> str:
    width = max((len(name) for name, _ in rows), default=0)
    return "\n".join(f"{name.ljust(width)}  {value}" for name, value in rows)
