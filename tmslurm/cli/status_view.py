"""How ``tmslurm status`` shows a run: the full listing, and the live view of ``--watch``.

Contract:
- :func:`format_status` is the one-shot listing of a :class:`~tmslurm.cli.run_status.RunStatus`;
  :func:`format_watch` the compact view: step, steps/s, each rank's node and state (grouped by
  node), each standby's warmth (the shape classes it is warm for, out of the layout's), the last
  events with their downtime, and the Slurm job ids. Both are pure.
- :class:`RateMeter` gives steps/s measured between samples: step delta over elapsed time, across
  the samples of the last ``window_s``; nothing (None, and the view shows no rate) until two samples
  taken at different times exist. It never derives a rate from the status's step time (the compute
  time of a step, which leaves out the pauses between steps), and starts again when the step goes
  back (a restart from a checkpoint).
- An event line leaves out what the event does not have (a requeue has no ranks and no node).
- :class:`Watch` refreshes every ``interval_s``: on a terminal it redraws in place (ANSI home and
  clear), otherwise it prints plain successive blocks without escape codes. It returns 0 once the run
  has finished (its summary exists) or on Ctrl-C. A controller that cannot be reached while the run is
  not finished shows ``controller unreachable: <reason>, retrying`` (above the last view) and the
  watch goes on; any other failure (a wrong token) propagates as the TmslurmError it is.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from tmslurm.cli.run_status import EventView, RankView, RunEnding, RunStatus, StandbyView
from tmslurm.core.errors import TmslurmError

log = logging.getLogger(__name__)

CLEAR = "\x1b[H\x1b[2J"
"""Cursor home, then clear the screen: a terminal redraws the view in place."""
LAST_EVENTS = 5
_TRANSIENT = ("unreachable", "not running", "closed the connection")


def format_status(st: RunStatus) -> str:
    """The one-shot listing of ``tmslurm status``."""
    lines = [
        f"run {st.run}  mode={st.mode}  step={st.step}/{'?' if st.steps is None else st.steps}"
        f"  step_time={st.step_time_s or 0:.3f}s  loss={st.loss or 0:.4f}"
    ]
    if st.main_job_id:
        lines.append(
            f"main job {st.main_job_id} (incarnation {st.incarnation})  spares {', '.join(st.spare_job_ids) or '-'}"
        )
    for r in st.ranks:
        lines.append(f"  rank {r.rank:>3}  {r.role:<6}  node {r.node}  {_rank_note(r)}".rstrip())
    for s in st.standbys:
        lines.append(f"  standby {s.id}  node {s.node}  warm roles: {', '.join(s.warm) or '-'}")
    lines += [f"  event {_event(ev)}" for ev in st.events]
    return "\n".join(lines)


def format_watch(st: RunStatus, steps_per_s: float | None, now: float) -> str:
    """The compact live view; ``now`` (epoch seconds) stamps it."""
    rate = "" if steps_per_s is None else f"  {steps_per_s:.2f} steps/s"
    step = f"{'?' if st.step is None else st.step}/{'?' if st.steps is None else st.steps}"
    head = (
        f"run {st.run}  {st.mode}  step {step}{rate}"
        f"  loss {'?' if st.loss is None else f'{st.loss:.4f}'}  [{time.strftime('%H:%M:%S', time.localtime(now))}]"
    )
    lines = [head, _jobs(st), "ranks:"]
    lines += [f"  {node or '-':<14} {cells}" for node, cells in _ranks_by_node(st.ranks)] or ["  -"]
    lines.append("standbys:")
    lines += [f"  {s.id:<18} {s.node or '-':<14} {_warmth(s, st.shape_classes)}" for s in st.standbys] or ["  -"]
    shown = st.events[-LAST_EVENTS:]
    lines.append(f"events ({len(shown)} of {len(st.events)}):" if len(shown) < len(st.events) else "events:")
    lines += [f"  {_event(ev)}" for ev in shown] or ["  -"]
    return "\n".join(lines)


def _jobs(st: RunStatus) -> str:
    if st.main_job_id is None:
        return "jobs: - (not on Slurm)"
    return f"jobs: main {st.main_job_id} (incarnation {st.incarnation})  spares {', '.join(st.spare_job_ids) or '-'}"


def _rank_note(r: RankView) -> str:
    return {"up": "", "dead": "(dead)", "none": "(no agent)"}.get(r.state, f"({r.state})")


def _ranks_by_node(ranks: list[RankView]) -> list[tuple[str | None, str]]:
    nodes: dict[str | None, list[str]] = {}
    for r in ranks:
        nodes.setdefault(r.node, []).append(f"{r.rank} {r.state}")
    return [(node, ", ".join(cells)) for node, cells in nodes.items()]


def _warmth(s: StandbyView, classes: tuple[str, ...]) -> str:
    """``warm 2/2 (first, last)``, ``warming 1/2 (first)``, ``cold 0/2``; ``joining`` while switched in."""
    joining = "joining, " if s.joining else ""
    if not classes:
        return f"{joining}warm: {', '.join(s.warm)}" if s.warm else f"{joining}cold"
    n = sum(c in s.warm for c in classes)
    word = "warm" if n == len(classes) else ("cold" if n == 0 else "warming")
    names = f" ({', '.join(s.warm)})" if s.warm else ""
    return f"{joining}{word} {n}/{len(classes)}{names}"


def _event(ev: EventView) -> str:
    """``kind ranks=[..] node=.. downtime=..s part=..s``, each field only when the event has it."""
    fields = [ev.kind]
    fields += [f"ranks={ev.ranks}"] if ev.ranks else []
    fields += [f"node={ev.node}"] if ev.node else []
    fields += [] if ev.downtime_s is None else [f"downtime={ev.downtime_s:.3f}s"]
    fields += [f"{k[:-2]}={v:.3f}s" for k, v in ev.parts.items()]
    return " ".join(fields)


@dataclass(frozen=True)
class Sample:
    t: float
    """Monotonic seconds."""
    step: int


class RateMeter:
    """Steps per second over the samples of the last ``window_s`` seconds (see the module's contract)."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self.samples: deque[Sample] = deque()

    def add(self, t: float, step: int | None) -> float | None:
        """Record the step seen at ``t`` (monotonic seconds); the rate, None until it can be measured."""
        if step is None:
            return None
        if self.samples and step < self.samples[-1].step:
            self.samples.clear()
        self.samples.append(Sample(t, step))
        while len(self.samples) > 2 and t - self.samples[0].t > self.window_s:  # keep the previous one
            self.samples.popleft()
        first = self.samples[0]
        if len(self.samples) >= 2 and t > first.t:
            return (step - first.step) / (t - first.t)
        return None


class Watch:
    """The ``--watch`` loop over ``fetch`` (which returns the run's status or raises TmslurmError)."""

    def __init__(
        self,
        fetch: Callable[[], RunStatus],
        out: TextIO,
        *,
        interval_s: float,
        tty: bool,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if interval_s <= 0:
            raise TmslurmError(f"--interval must be > 0 seconds, got {interval_s:g}")
        self.fetch, self.out, self.interval_s, self.tty = fetch, out, interval_s, tty
        self.clock, self.wall, self.sleep = clock, wall, sleep
        self.meter = RateMeter()
        self.last_view: str | None = None

    def run(self) -> int:
        try:
            while True:
                text, finished = self.frame()
                self.show(text)
                if finished:
                    return 0
                self.sleep(self.interval_s)
        except KeyboardInterrupt:
            self.out.write("\n")
            self.out.flush()
            return 0

    def frame(self) -> tuple[str, bool]:
        """One refresh: the text to show, and whether the run has finished."""
        try:
            st = self.fetch()
        except (TmslurmError, OSError) as exc:
            transient = isinstance(exc, RunEnding) or any(w in str(exc) for w in _TRANSIENT)
            if isinstance(exc, TmslurmError) and not transient:
                raise
            log.debug("status refresh failed: %s", exc)
            line = f"controller unreachable: {exc}, retrying every {self.interval_s:g}s"
            return line if self.last_view is None else f"{line}\n{self.last_view}", False
        self.last_view = format_watch(st, self.meter.add(self.clock(), st.step), self.wall())
        return self.last_view, st.finished

    def show(self, text: str) -> None:
        self.out.write(f"{CLEAR}{text}\n" if self.tty else f"{text}\n\n")
        self.out.flush()
