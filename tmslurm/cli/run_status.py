"""A run's status as typed data, read from its live controller or, once it has ended, ``summary.json``.

Contract: :func:`fetch` returns the raw status dict (what ``tmslurm status --json`` prints): the
controller's ``status`` reply, or for a finished run ``summary.json`` (read as a
:class:`~tmslurm.core.results.Summary`: a malformed one raises TmslurmError naming the file) with
``mode`` ``finished`` and ``step``, ``loss``, ``step_time_s`` filled in. It raises
:class:`~tmslurm.core.errors.TmslurmError`: "unreachable"/"not running" when no controller answers
and no summary exists ("not running yet", naming ``controller.json``, when the controller never
advertised itself), the controller's own
refusal (e.g. a wrong token) otherwise. A controller that answers that the run is ending (it
takes no more requests) is followed by its ``summary.json``: :func:`fetch` waits for it, up to its
timeout, then raises :class:`RunEnding`. :meth:`RunStatus.from_dict` turns either dict into a
:class:`RunStatus` (its events read as :class:`~tmslurm.core.results.Event`); missing fields (an older
controller, a summary) read as unknown, never fail.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tmslurm.core.errors import TmslurmError
from tmslurm.core.results import PAUSE_PARTS, Event, Summary, load_summary
from tmslurm.core.rundir import RunDir

log = logging.getLogger(__name__)

EVENT_PARTS = PAUSE_PARTS


@dataclass(frozen=True)
class RankView:
    rank: int
    node: str | None
    role: str
    state: str
    """``up`` (its agent is alive), ``dead`` (its agent died, not yet replaced) or ``none`` (no agent)."""


@dataclass(frozen=True)
class StandbyView:
    id: str
    node: str | None
    warm: tuple[str, ...]
    """The shape classes it has warmed up for."""
    joining: bool
    """It is being switched in for a rank."""


@dataclass(frozen=True)
class EventView:
    kind: str
    ranks: list[int]
    node: str | None
    downtime_s: float | None
    parts: dict[str, float]
    """The measured parts of the downtime (:data:`EVENT_PARTS`), seconds."""


@dataclass(frozen=True)
class RunStatus:
    run: str
    mode: str
    step: int | None
    steps: int | None
    step_time_s: float | None
    loss: float | None
    shape_classes: tuple[str, ...]
    """Every shape class of the layout (empty when the source does not say)."""
    ranks: list[RankView]
    standbys: list[StandbyView]
    events: list[EventView]
    main_job_id: str | None
    spare_job_ids: list[str]
    incarnation: int

    @property
    def finished(self) -> bool:
        return self.mode == "finished"

    @classmethod
    def from_dict(cls, st: dict[str, Any]) -> RunStatus:
        return cls(
            run=str(st.get("run_dir") or st.get("run_id") or "?"),
            mode=str(st.get("mode")),
            step=st.get("step"),
            steps=st.get("steps"),
            step_time_s=st.get("step_time_s"),
            loss=st.get("loss"),
            shape_classes=tuple(st.get("shape_classes") or ()),
            ranks=[_rank(r) for r in st.get("ranks") or []],
            standbys=[_standby(s) for s in st.get("standbys") or []],
            events=[_event(Event.parse(e, "status event")) for e in st.get("events") or []],
            main_job_id=None if st.get("main_job_id") is None else str(st["main_job_id"]),
            spare_job_ids=[str(j) for j in st.get("spare_job_ids") or []],
            incarnation=int(st.get("incarnation") or 0),
        )


def _rank(r: dict[str, Any]) -> RankView:
    state = "none" if r.get("agent", "") is None else ("up" if r.get("alive", True) else "dead")
    return RankView(int(r["rank"]), r.get("node"), str(r.get("role", "")), state)


def _standby(s: dict[str, Any]) -> StandbyView:
    return StandbyView(str(s.get("id")), s.get("node"), tuple(sorted(s.get("roles") or ())), bool(s.get("busy", False)))


def _event(ev: Event) -> EventView:
    parts = {k: v for k in EVENT_PARTS if (v := ev.part(k)) is not None}
    return EventView(ev.kind, list(ev.ranks), ev.node, ev.part("downtime_s"), parts)


class RunEnding(TmslurmError):
    """The controller takes no more requests (the run is ending) and no summary.json appeared in time."""


def fetch(
    run_dir: Path,
    token: str | None,
    timeout_s: float = 10.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """The run's status dict (see the module's contract); ``timeout_s`` bounds connecting and the reply,
    and how long a run that is ending may take to write its summary."""
    from tmslurm.wire.protocol import request

    summary, controller = RunDir(run_dir).summary, RunDir(run_dir).controller
    if not controller.exists() and not summary.is_file():
        raise TmslurmError(
            f"the run's controller is not running yet ({controller} does not exist): the run is starting, "
            "or its job waits in the queue"
        )
    try:
        reply = request(run_dir, {"type": "status"}, token=token, timeout_s=timeout_s)
    except TmslurmError:
        if not summary.is_file():
            raise
        return from_summary(load_summary(summary))
    if "status" in reply:
        return reply["status"]
    if not reply.get("ending"):
        raise TmslurmError(f"the controller refused the status request: {reply.get('error', reply)}")
    deadline = clock() + timeout_s  # the summary is written right after requests close
    while not summary.is_file():
        if clock() >= deadline:
            raise RunEnding(f"{reply.get('error')}; no summary.json yet")
        sleep(0.1)
    return from_summary(load_summary(summary))


def from_summary(summary: Summary) -> dict[str, Any]:
    """``summary.json`` in the shape of a status reply."""
    return {
        **summary.model_dump(mode="json"),
        "mode": "finished",
        "step": summary.steps,
        "loss": summary.loss_last,
        "step_time_s": summary.median_step_s,
    }
