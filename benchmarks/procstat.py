"""Figures for ``bench control``: a process's CPU, RSS and threads from /proc, percentiles, py-spy stacks.

Contract: :func:`proc_sample` reads ``/proc/<pid>/stat`` (the thread count, the RSS) and, with
``cpu``, the nanosecond on-CPU time of every live thread (``/proc/<pid>/task/*/schedstat``: finer
than utime + stime's clock ticks, which read 0 for a short window) and of the main thread (tid = pid:
the controller's loop); it raises :class:`OSError` when the process is gone. :func:`percentile` is the nearest-rank
percentile; :func:`summarize` gives p50/p99/max/mean and the sample count (all None for no sample).
:func:`top_frames` reads a py-spy ``raw`` (collapsed stacks) file and returns the most sampled
functions by self and by inclusive samples. All pure but the /proc reads.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class ProcSample:
    cpu_s: float
    """On-CPU seconds of the process's live threads (0 without ``cpu``)."""
    main_cpu_s: float
    """On-CPU seconds of its main thread (0 without ``cpu``)."""
    threads: int
    rss_mb: float


def _stat_fields(path: str) -> list[str]:
    with open(path) as f:
        text = f.read()
    return text[text.rindex(")") + 2 :].split()  # after "pid (comm) ": field 3 (state) is index 0


def parse_stat(fields: list[str]) -> tuple[float, int, float]:
    """(cpu seconds, threads, rss MiB) from the fields of a /proc stat line after its comm."""
    return ((int(fields[11]) + int(fields[12])) / TICK, int(fields[17]), int(fields[21]) * PAGE / 2**20)


def _oncpu_s(path: str) -> float:
    try:
        with open(path) as f:
            return int(f.read().split()[0]) / 1e9
    except (FileNotFoundError, ProcessLookupError):
        return 0.0  # a thread that just ended


def proc_sample(pid: int, cpu: bool = True) -> ProcSample:
    _, threads, rss = parse_stat(_stat_fields(f"/proc/{pid}/stat"))
    if not cpu:
        return ProcSample(0.0, 0.0, threads, rss)
    total = sum(_oncpu_s(f"/proc/{pid}/task/{tid}/schedstat") for tid in os.listdir(f"/proc/{pid}/task"))
    return ProcSample(total, _oncpu_s(f"/proc/{pid}/task/{pid}/schedstat"), threads, rss)


def self_cpu_s() -> float:
    """CPU seconds of this process (every thread)."""
    t = os.times()
    return t.user + t.system


def percentile(xs: list[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0..100) of a non-empty list."""
    if not xs:
        raise ValueError("percentile of no samples")
    ordered = sorted(xs)
    return ordered[max(0, math.ceil(q / 100.0 * len(ordered)) - 1)]


def summarize(xs: list[float]) -> dict[str, Any]:
    if not xs:
        return {"p50": None, "p99": None, "max": None, "mean": None, "samples": 0}
    return {
        "p50": percentile(xs, 50),
        "p99": percentile(xs, 99),
        "max": max(xs),
        "mean": sum(xs) / len(xs),
        "samples": len(xs),
    }


def _frame_name(frame: str) -> str:
    """``func (path/file.py:123)`` -> ``func (file.py)``: lines of one function are summed."""
    name, _, where = frame.partition(" (")
    file = where.rstrip(")").rsplit(":", 1)[0]
    return f"{name} ({file.rsplit('/', 1)[-1]})" if file else name


def top_frames(path: Path, n: int = 12) -> dict[str, Any]:
    """The ``n`` functions with the most samples, by self (leaf) and inclusive samples."""
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [_frame_name(f) for f in stack.split(";") if f]
        if not frames:
            continue
        k = int(count)
        total += k
        own[frames[-1]] += k
        for name in set(frames):
            incl[name] += k

    def share(c: Counter[str]) -> list[dict[str, Any]]:
        return [{"frame": f, "samples": s, "share": round(s / total, 3)} for f, s in c.most_common(n)]

    return {"samples": total, "self": share(own) if total else [], "inclusive": share(incl) if total else []}
