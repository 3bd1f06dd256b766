"""Progress of long work: units done / total, counts, elapsed and an estimate of the time remaining.

Contract: a :class:`Progress` is built with the total number of units (None: unknown), the units'
label (``cells``, ``events``, ``steps``), a title that starts every line, and the stream its lines
go to (None: it only formats, :meth:`Progress.text`, for a caller that logs the line itself). Each
:meth:`Progress.advance` (a unit finished) or :meth:`Progress.update` (the number done is known)
writes one line such as ``bench downtime: events 3/12, cells 1, elapsed 4m10s, remaining ~12m30s
(tmslurm sigkill #0)`` and flushes it. The remaining time is the mean time per unit finished since
the object was built, times the units left; it is left out while no unit has finished or the total
is unknown.

- Plain mode (the default when the stream is not a terminal: CI logs, files, pipes): one full line
  per update ending in a newline, no carriage return, no ANSI code, so nothing is lost or garbled.
- In-place mode (``inplace=True``, or the default on a terminal: ``stream.isatty()``): the line is
  redrawn in place (``\\r`` and clear-to-end-of-line); :meth:`Progress.close`, or the last unit of
  a known total, ends it with a newline. A caller whose other output comes between updates on the
  same terminal passes ``inplace=False``.

The clock is injectable (default :func:`time.monotonic`). Nothing here raises on bad figures: a
negative duration shows as ``0s``; an error of the stream itself (closed, full disk) propagates.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

CLEAR_LINE = "\r\x1b[K"
"""Carriage return, then erase to the end of the line: an in-place redraw on a terminal."""


def format_duration(seconds: float) -> str:
    """``41s``, ``4m10s``, ``2h05m``, ``3d04h``: two units at most, whole seconds, never negative."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def remaining_s(done: int, total: int | None, elapsed: float) -> float | None:
    """The mean time per finished unit times the units left; None with no finished unit or no total."""
    if total is None or done <= 0:
        return None
    return max(0, total - done) * max(0.0, elapsed) / done


def progress_line(
    label: str,
    done: int,
    total: int | None,
    elapsed: float,
    remaining: float | None,
    counts: dict[str, int],
    note: str = "",
) -> str:
    """``events 3/12, cells 1, elapsed 4m10s, remaining ~12m30s (note)``; the parts unknown are left out."""
    parts = [f"{label} {done}" + ("" if total is None else f"/{total}")]
    parts += [f"{name} {n}" for name, n in counts.items()]
    parts.append(f"elapsed {format_duration(elapsed)}")
    if remaining is not None:
        parts.append(f"remaining ~{format_duration(remaining)}")
    return ", ".join(parts) + (f" ({note})" if note else "")


class Progress:
    """Units done out of a total, written as one line per update (see the module's contract)."""

    def __init__(
        self,
        total: int | None,
        label: str,
        stream: TextIO | None,
        *,
        title: str = "progress",
        clock: Callable[[], float] = time.monotonic,
        inplace: bool | None = None,
    ) -> None:
        self.total = total
        self.label = label
        self.stream = stream
        self.title = title
        self.clock = clock
        self.start = clock()
        self.done = 0
        """Units finished since this object was built."""
        self.counts: dict[str, int] = {}
        """Other tallies shown on the line (``events``), in the order first counted."""
        self.inplace = (stream is not None and stream.isatty()) if inplace is None else inplace
        self.open_line = False
        """In-place mode: a line is on screen without its newline yet."""

    def count(self, name: str, n: int = 1) -> None:
        """Add ``n`` to the tally ``name`` (shown from the next line on; nothing is written now)."""
        self.counts[name] = self.counts.get(name, 0) + n

    def advance(self, note: str = "", n: int = 1) -> str:
        """``n`` more units finished: write the line (when there is a stream) and return its text."""
        return self.update(self.done + n, note)

    def update(self, done: int, note: str = "") -> str:
        """``done`` units are finished now: write the line (when there is a stream) and return its text."""
        self.done = done
        line = self.text(note)
        if self.stream is not None:
            self._write(self.stream, line)
        return line

    def text(self, note: str = "") -> str:
        """The line for now, without writing it."""
        elapsed = self.clock() - self.start
        body = progress_line(
            self.label, self.done, self.total, elapsed, remaining_s(self.done, self.total, elapsed), self.counts, note
        )
        return f"{self.title}: {body}" if self.title else body

    def close(self) -> None:
        """End an in-place line left open (plain mode: nothing to do)."""
        if self.open_line and self.stream is not None:
            self.stream.write("\n")
            self.stream.flush()
        self.open_line = False

    def _write(self, stream: TextIO, line: str) -> None:
        if not self.inplace:
            stream.write(line + "\n")
            stream.flush()
            return
        stream.write(CLEAR_LINE + line)
        self.open_line = True
        stream.flush()
        if self.total is not None and self.done >= self.total:
            self.close()
