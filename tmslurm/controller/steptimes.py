"""The run's median step time, kept up to date in O(log n) per commit instead of O(steps).

Contract: :meth:`StepTimes.median` is ``statistics.median`` of the gaps between consecutive
committed steps (``t_end`` of step s+1 minus that of step s, only where both are in the step log),
or 0.0 when there is none yet. It reads only the entries appended since its last call; when the
step log was replaced (a restart or an adoption loads a saved one) or shrank, it starts over from
the new log. Every commit asks for it (downtime = gap - median step) and so does the hang check at
every deadline tick: recomputing it from the whole log made each commit cost O(steps), which at
~1.2 M steps (a week of 0.5 s steps) is a sort of 1.2 M numbers per step. Nothing here raises.
"""

from __future__ import annotations

import heapq
from typing import Any


class RunningMedian:
    """The median of every value added so far: two heaps (the lower half negated), O(log n) per add."""

    def __init__(self) -> None:
        self.low: list[float] = []
        """The smaller half, negated (a max-heap); it holds the extra value when the count is odd."""
        self.high: list[float] = []

    def __len__(self) -> int:
        return len(self.low) + len(self.high)

    def add(self, x: float) -> None:
        if self.low and x > -self.low[0]:
            heapq.heappush(self.high, x)
        else:
            heapq.heappush(self.low, -x)
        if len(self.low) > len(self.high) + 1:
            heapq.heappush(self.high, -heapq.heappop(self.low))
        elif len(self.high) > len(self.low):
            heapq.heappush(self.low, -heapq.heappop(self.high))

    def median(self) -> float:
        if not self.low:
            return 0.0
        if len(self.low) > len(self.high):
            return -self.low[0]
        return (-self.low[0] + self.high[0]) / 2


class StepTimes:
    """The median gap between consecutive commits of a step log that only grows (or is replaced)."""

    def __init__(self) -> None:
        self.log: list[dict[str, Any]] | None = None
        """The step log last read (by identity)."""
        self.read = 0
        """How many of its entries were read."""
        self.gaps = RunningMedian()

    def median(self, log: list[dict[str, Any]]) -> float:
        if log is not self.log or len(log) < self.read:
            self.log, self.read, self.gaps = log, 0, RunningMedian()
        for i in range(max(1, self.read), len(log)):
            a, b = log[i - 1], log[i]
            if b["step"] == a["step"] + 1:
                self.gaps.add(b["t_end"] - a["t_end"])
        self.read = len(log)
        return self.gaps.median()
