"""Progress reporting for long work: done/total, items per second and time left, logged at an interval."""

from __future__ import annotations

import logging
import time


def format_duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    hours, remainder = divmod(seconds, 3600)
    minutes, seconds = divmod(remainder, 60)
    return f"{hours}h{minutes:02d}m{seconds:02d}s" if hours else f"{minutes}m{seconds:02d}s"


class Progress:
    """Logs `what: done/total (percent), rate unit/s, ETA` at most every `interval_seconds`, and when done, unless
    the work took less than `quiet_below_seconds` (too short for progress to tell anyone anything)."""

    def __init__(
        self,
        what: str,
        total: int,
        unit: str = "items",
        logger: logging.Logger | None = None,
        interval_seconds: float = 10.0,
        clock=time.monotonic,
        quiet_below_seconds: float = 0.0,
    ):
        self.what = what
        self.total = total
        self.unit = unit
        self.logger = logger or logging.getLogger(__name__)
        self.interval_seconds = interval_seconds
        self.clock = clock
        self.start = clock()
        self.last_report = self.start
        self.done = 0
        self.quiet_below_seconds = quiet_below_seconds

    def rate(self) -> float:
        elapsed = self.clock() - self.start
        return self.done / elapsed if elapsed > 0 else 0.0

    def message(self) -> str:
        rate = self.rate()
        percent = 100.0 * self.done / self.total if self.total else 100.0
        remaining = (self.total - self.done) / rate if rate > 0 else float("nan")
        eta = format_duration(remaining) if rate > 0 else "unknown"
        return (
            f"{self.what}: {self.done}/{self.total} {self.unit} ({percent:.0f}%), {rate:,.0f} {self.unit}/s, ETA {eta}"
        )

    def advance(self, count: int = 1) -> None:
        self.done += count
        now = self.clock()
        due = now - self.last_report >= self.interval_seconds
        finished = self.done >= self.total and now - self.start >= self.quiet_below_seconds
        if due or finished:
            self.last_report = now
            self.logger.info(self.message())
