"""Counts of a batch run and the progress bar on stderr."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TextIO

from tokenmold.service.batch.dispatch import Outcome


@dataclass
class Tally:
    """Lines of one run. ``total`` counts the lines this run has to write."""

    total: int
    #: Lines already in the output when the run started (a resumed run skips them).
    skipped: int = 0
    done: int = 0
    accepted: int = 0
    fitted: int = 0
    truncated: int = 0
    invalid: int = 0
    #: Lines whose request was refused (a 4xx) or never reached a route (bad url, method...).
    errors: int = 0
    #: Requests that met a server error: not written, so a rerun tries them again.
    retry: int = 0
    tokens: int = 0
    started: float = field(default_factory=time.monotonic)

    def restart_clock(self) -> None:
        self.started = time.monotonic()

    def count(self, outcome: Outcome) -> None:
        if outcome.server_error:
            self.retry += 1
            return
        self.done += 1
        if not outcome.ok:
            self.errors += 1
        for status in outcome.statuses:
            if status in ("accepted", "fitted", "truncated", "invalid"):
                setattr(self, status, getattr(self, status) + 1)
        self.tokens += outcome.output_tokens

    def count_problem(self) -> None:
        self.done += 1
        self.errors += 1

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        finished = self.done + self.retry
        eta = (self.total - finished) * elapsed / finished if finished else None
        width = 24
        filled = int(width * finished / self.total) if self.total else width
        return (
            f"[{'#' * filled}{'.' * (width - filled)}] {finished}/{self.total}"
            f"  accepted {self.accepted} fitted {self.fitted} truncated {self.truncated} invalid {self.invalid}"
            f" errors {self.errors}"
            f"  {self.tokens / elapsed:.0f} tok/s  ETA {_clock(eta)}"
        )

    def summary(self) -> str:
        elapsed = time.monotonic() - self.started
        parts = [
            f"{self.done} lines written in {elapsed:.1f} s ({self.skipped} already done before this run)",
            f"outputs: {self.accepted} accepted, {self.fitted} fitted, {self.truncated} truncated, "
            f"{self.invalid} invalid",
            f"{self.errors} error lines (refused requests or bad lines)",
            f"{self.tokens} tokens generated ({self.tokens / max(elapsed, 1e-9):.0f} tok/s)",
        ]
        if self.retry:
            parts.append(f"{self.retry} requests met a server error and were not written: rerun to retry them")
        return "; ".join(parts)


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "--:--"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class ProgressBar:
    """Redrawn in place on a terminal (at most 10 times a second); on anything else (a log file,
    a pipe), one line every 10 seconds."""

    def __init__(self, tally: Tally, stream: TextIO = sys.stderr) -> None:
        self.tally = tally
        self.stream = stream
        self.tty = stream.isatty()
        self._shown = 0.0

    def update(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._shown < (0.1 if self.tty else 10.0):
            return
        self._shown = now
        if self.tty:
            self.stream.write("\r\x1b[K" + self.tally.line())
        else:
            self.stream.write(self.tally.line() + "\n")
        self.stream.flush()

    def finish(self) -> None:
        self.update(force=True)
        if self.tty:
            self.stream.write("\n")
        self.stream.write(f"tokenmold: {self.tally.summary()}\n")
        self.stream.flush()
