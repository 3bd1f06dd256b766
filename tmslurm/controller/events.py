"""Per-event timelines: notice, detection, standby pick, phase 1, phase 2, state transfer, first step.

Contract: the controller opens a record when it acts on an event (:meth:`EventLog.begin`), fills in
the parts as the switch progresses, and the record completes at the commit of the first step after
the switch (:meth:`EventLog.on_commit`). Then ``gap_s`` = (completion of that step) − (completion of
the last step before the event), ``downtime_s`` = ``gap_s`` − median step time and ``pause_s`` =
``gap_s`` − the step's own work that a planned switch's gap holds anyway: the first step after it
(``first_step_s``) and the optimizer update of the step it rode on (``apply_s``, reported by the
leaver and the joiner; see docs/benchmarks.md); ``other_s`` is the part of the gap its measured pause parts do not
explain (:func:`pause_parts`), so the parts always add up to the gap;
:meth:`finalize` recomputes ``downtime_s`` with the whole run's median. Each completed event is
journalled and logged as one line with its parts.

A restart or a requeue is an event with no plan: :meth:`EventLog.hold` journals it (``event_open``,
with an ``eid``) as soon as its record is complete, :meth:`EventLog.drop` when it is superseded before
it completes (``event_dropped``), so a restarted controller takes back every such event still open
(:meth:`EventLog.restore`) instead of losing it with the dead controller's memory.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from tmslurm.controller.journal import Journal

log = logging.getLogger(__name__)
PARTS = (
    "before_fault_s",
    "detect_s",
    "pick_s",
    "phase1_s",
    "phase2_s",
    "apply_s",
    "transfer_s",
    "verify_s",
    "verify_wait_s",
    "first_step_s",
)
"""``before_fault_s``: an unexpected failure whose instant is known (an injected fault reports it as it
fires): the last commit -> the fault, work the step in flight had done and must redo, which no
recovery can save. ``verify_s``: a shadowed switch's comparison of the leaver's and the shadow's
fingerprints (no state moves), which runs behind the new rank's first step, so it is not in the
pause; ``verify_wait_s``: how long that step's vote waited for it, a part of the pause (taken out
of ``first_step_s``)."""
RESTART_PARTS = ("detect_s", "stop_s", "reschedule_s", "startup_s", "group_setup_s", "ckpt_load_s", "redo_s")
JOB_STARTS = ("resumed_after_requeue", "resumed_after_lost_controller", "resumed_after_unfinished_end")
"""Journal records a Slurm job's controller writes when it takes over from the job before."""
CONTROLLER_PARTS = ("before_death_s", "restart_s", "adopt_s")
"""A controller restart: last commit -> death, death -> new controller up, up -> adopted; then first_step_s."""


def _noticed(times: dict[str, float]) -> float | None:
    """When the event became known: its notice, else the fault's instant where known, else its detection."""
    return next((times[k] for k in ("notice", "failure", "detect") if times.get(k) is not None), None)


def pause_parts(rec: dict[str, Any]) -> tuple[str, ...]:
    """The parts of an event that lie one after the other in its pause: with ``other_s`` they sum to
    ``gap_s``. A planned switch's phase 1 runs while training goes on, so it is not one of them; a
    restart's group setup and checkpoint load are inside its start-up."""
    kind = rec.get("kind")
    if kind == "controller_restart":
        return CONTROLLER_PARTS + ("first_step_s",)
    if kind == "planned":  # no fault before a notice; the shadow's check runs behind the first step
        return tuple(
            p
            for p in PARTS
            if p not in ("phase1_s", "before_fault_s", "verify_s") and (p != "verify_wait_s" or "verify_wait_s" in rec)
        )
    if rec.get("from_checkpoint_step") is not None or any(p in rec for p in ("stop_s", "startup_s", "redo_s")):
        return ("detect_s", "stop_s", "reschedule_s", "startup_s", "redo_s")  # a restart from a checkpoint
    return PARTS


def other_s(rec: dict[str, Any]) -> float | None:
    """What the measured parts do not explain: ``gap_s`` minus the pause parts (negative when parts
    overlap), None before the event completed."""
    gap = rec.get("gap_s")
    if not isinstance(gap, (int, float)):
        return None
    return gap - sum(v for v in (rec.get(p) for p in pause_parts(rec)) if isinstance(v, (int, float)))


class EventLog:
    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.items: list[dict[str, Any]] = []
        self.last_commit_t: float | None = None

    def begin(self, plan: Any, agents: dict[str, Any], slots: dict[int, str]) -> dict[str, Any]:
        nodes = sorted({agents[slots[r]].node for r in plan.ranks if slots.get(r) in agents}) or [plan.node]
        rec = {
            "kind": plan.kind,
            "cause": plan.reason,
            "epoch": plan.epoch,
            "ranks": plan.ranks,
            "node": ",".join(n for n in nodes if n),
            "standby": ",".join(m.joiner for m in plan.moves),
            "notice_t": _noticed(plan.times),
            "last_commit_t": self.last_commit_t,
            "status": "open",
        }
        plan.event = rec
        self.items.append(rec)
        self.journal.write("event_begin", **rec)
        return rec

    def open_record(self, rec: dict[str, Any]) -> None:
        """An event that is not a plan (a controller restart), completed by the commit of ``target_step``."""
        self.items.append(rec)
        self.journal.write("event_begin", **rec)

    def of_epoch(self, epoch: int) -> dict[str, Any] | None:
        """The newest event of a switch's epoch, None if there is none."""
        return next((r for r in reversed(self.items) if r.get("epoch") == epoch), None)

    def take_back(self, rec: dict[str, Any]) -> None:
        """An event a dead controller began (its ``event_begin`` is in the journal), open again in its successor."""
        self.items.append(rec)

    def hold(self, rec: dict[str, Any]) -> None:
        """An event with no plan (a restart, a requeue) is open: completed by the commit of its
        ``target_step``, like a switch; journalled now so that a restarted controller takes it back."""
        rec.setdefault("eid", uuid.uuid4().hex[:12])
        if rec not in self.items:
            self.items.append(rec)
        self.journal.write("event_open", **rec)

    def drop(self, rec: dict[str, Any]) -> None:
        """A held event superseded before it completed (its restart could not start the ranks)."""
        self.items.remove(rec)
        self.journal.write("event_dropped", eid=rec.get("eid"))

    def restore(self, journal: list[dict[str, Any]], last_commit_t: float | None) -> None:
        """A restarted controller takes back the completed events (journal ``event`` lines), the events
        this Slurm job held that are still open (``event_open`` since the job's start, never completed nor
        dropped; a job resumed after a requeue holds again the ones it carried over) and the last commit."""
        closed = {e.get("eid") for e in journal if e.get("type") in ("event", "event_dropped")} - {None}
        start = max((i for i, e in enumerate(journal) if e.get("type") in JOB_STARTS), default=-1)
        kept = [
            e
            for i, e in enumerate(journal)
            if e.get("type") == "event" or (i > start and e.get("type") == "event_open" and e.get("eid") not in closed)
        ]
        self.items = [_record_of(line) for line in kept]
        self.last_commit_t = last_commit_t

    def take_back_completed(self, journal: list[dict[str, Any]]) -> None:
        """A job that resumes without ``requeue.json`` takes back the events the jobs before it completed
        (journal ``event`` lines); one a dead job left open never completes, and the new job's own
        event stands for it."""
        self.items = [_record_of(line) for line in journal if line.get("type") == "event"]

    def switched(self, plan: Any) -> None:
        rec = plan.event
        if rec is None:
            return
        t = plan.times
        rec["ranks"] = plan.ranks
        rec["standby"] = ",".join(m.joiner for m in plan.moves)
        rec["sources"] = [m.source for m in plan.moves if m.source is not None]  # who sent the state after a failure
        rec["detect_s"] = max(0.0, t.get("detect", 0.0) - (t.get("failure") or t.get("notice") or t.get("detect", 0.0)))
        if t.get("failure") is not None and rec.get("last_commit_t") is not None:
            rec["before_fault_s"] = max(0.0, t["failure"] - rec["last_commit_t"])
        rec["pick_s"] = max(0.0, t.get("pick", t.get("detect", 0.0)) - t.get("detect", 0.0))
        for part in ("phase1_s", "phase2_s", "transfer_s"):
            rec[part] = plan.parts.get(part)
        for part in ("apply_s", "verify_s", "shadow_catchup_s"):
            if part in plan.parts:
                rec[part] = plan.parts[part]
        rec["switched_t"] = t.get("switched", time.time())
        rec["target_step"] = plan.target_step
        rec["status"] = "switched"

    def restart(self, rec: dict[str, Any], parts: dict[str, float], target_step: int) -> None:
        rec.update(parts)
        rec["target_step"] = target_step
        rec["status"] = "switched"

    def cancel(self, plan: Any) -> None:
        rec = plan.event
        if rec is not None:
            rec["status"] = "cancelled"
            self.journal.write("event_cancelled", epoch=plan.epoch)

    def on_commit(self, step: int, t: float, median: float) -> None:
        for rec in self.items:
            if rec["status"] == "switched" and rec.get("target_step") == step:
                rec["first_step_s"] = t - rec.get("switched_t", t) - (rec.get("verify_wait_s") or 0.0)
                rec["first_step_t"] = t
                if rec.get("all_started_t") is not None:
                    rec["redo_s"] = t - rec["all_started_t"]
                    rec["first_step_s"] = None
                if rec.get("last_commit_t") is not None:
                    rec["gap_s"] = t - rec["last_commit_t"]
                    rec["downtime_s"] = max(0.0, rec["gap_s"] - median)
                    rec["other_s"] = other_s(rec)
                    rec["pause_s"] = pause_s(rec)
                    rec["pause_from_fault_s"] = pause_from_fault_s(rec)
                rec["status"] = "done"
                self.journal.write("event", **rec)
                log.info("EVENT %s", describe(rec))
        self.last_commit_t = t

    def finalize(self, median: float) -> list[dict[str, Any]]:
        for rec in self.items:
            if rec.get("gap_s") is not None:
                rec["downtime_s"] = max(0.0, rec["gap_s"] - median)
        return [r for r in self.items if r["status"] != "cancelled"]


def _record_of(line: dict[str, Any]) -> dict[str, Any]:
    """The event record a journal line carries: the line without its own ``t`` and ``type``."""
    return {k: v for k, v in line.items() if k not in ("t", "type")}


def pause_s(rec: dict[str, Any]) -> float | None:
    """What the move cost beyond the one step it must run anyway: ``gap_s`` − ``first_step_s`` −
    ``apply_s`` (the optimizer update of the step the switch rode on, which every step's gap holds
    too; steps' noise cannot hide the rest, where it swallows a slow transfer in ``downtime_s``);
    None for an event without a first step of its own (a restart redoes steps instead)."""
    gap, first = rec.get("gap_s"), rec.get("first_step_s")
    if not isinstance(gap, (int, float)) or not isinstance(first, (int, float)):
        return None
    apply = rec.get("apply_s")
    return max(0.0, gap - first - (apply if isinstance(apply, (int, float)) else 0.0))


def pause_from_fault_s(rec: dict[str, Any]) -> float | None:
    """An unexpected failure's pause counted from the fault instead of the last commit: ``pause_s`` −
    ``before_fault_s``; None where the fault's instant is unknown (a real failure: only its
    detection is) or the event has no pause."""
    pause, before = rec.get("pause_s"), rec.get("before_fault_s")
    if not isinstance(pause, (int, float)) or not isinstance(before, (int, float)):
        return None
    return max(0.0, pause - before)


def describe(rec: dict[str, Any]) -> str:
    """One line: the event, its downtime, then its gap as the sum of its pause parts and ``other``."""
    num = lambda k: rec.get(k) if isinstance(rec.get(k), (int, float)) else None  # noqa: E731
    down = num("downtime_s")
    head = (
        f"{rec['kind']} ranks={rec.get('ranks')} node={rec.get('node') or '-'} standby={rec.get('standby') or '-'} "
        f"downtime={'?' if down is None else f'{down:.3f}s'}"
        + (f" pause={num('pause_s'):.3f}s" if num("pause_s") is not None else "")
    )
    terms = [f"{p[:-2]} {num(p):.3f}" for p in pause_parts(rec) if num(p) is not None]
    if num("other_s") is not None:
        terms.append(f"other {num('other_s'):.3f}")
    line = head + (
        f" | gap {num('gap_s'):.3f}s = " + " + ".join(terms) if num("gap_s") is not None else " | " + ", ".join(terms)
    )
    aside = [
        f"{p[:-2]} {num(p):.3f}s"
        for p in ("phase1_s", "verify_s", "group_setup_s", "ckpt_load_s")
        if p not in pause_parts(rec) and num(p) is not None
    ]
    return line + (f" | not in the sum: {', '.join(aside)}" if aside else "")
