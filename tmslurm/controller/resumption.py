"""Resuming a run in a new job: completing the event that the job before it left open.

Contract (at start-up, on the controller's thread, before the loop; nothing here raises):
- A requeued job (:mod:`tmslurm.controller.requeues` wrote ``requeue.json``) takes back the step
  log, the fired faults and the events it saved, and completes its open event: the redone steps
  are its target step minus the checkpoint this job resumes from, the parts recorded are detect,
  stop and reschedule (Slurm's rescheduling delay); startup, group_setup, ckpt_load and redo follow
  as the ranks start (:meth:`~tmslurm.controller.restarts.Restarts.on_started`). The file is
  archived (``requeue_archive``).
- A job requeued by a node monitor after its controller was lost (``controller-lost.json``) is
  recorded as an unexpected ``controller_lost_requeue`` event: redone steps = the last committed
  step of the previous incarnation (``snapshot.json``, or the step log when it is ahead) - the
  checkpoint resumed from. So is a job killed before the checkpoint its end asked for was complete
  (``job-ending.json``: ``job_end_unfinished``). Both take back the earlier jobs' completed events
  and step log from the run directory. A note that cannot be parsed (its writer was cut off) still
  counts, at its mtime, cause unknown; one that cannot even be stat'ed is logged and left alone.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tmslurm.controller.context import Context
from tmslurm.controller.journal import journalled, read_journal
from tmslurm.controller.requeues import event_record
from tmslurm.controller.snapshot import read_snapshot, read_steps

log = logging.getLogger(__name__)


class Resumption:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.state = ctx.state

    def resume(self) -> None:
        """At start-up: complete the event a previous incarnation of the job left open."""
        path = self.ctx.rundir.requeue
        if not path.is_file():
            if not self._resume_after_lost_controller():
                self._resume_after_unfinished_end()
            self.ctx.rundir.job_ending.unlink(missing_ok=True)  # told, but the controller-lost claim says more
            return
        saved = json.loads(path.read_text())
        path.rename(self.ctx.rundir.requeue_archive(saved["requeue_t"]))
        st = self.state
        st.step_log = saved["step_log"]
        st.fired = set(saved.get("fired", []))
        self.ctx.events.items = saved["events"]
        self.ctx.events.last_commit_t = saved["last_commit_t"]
        rec = event_record(
            self.ctx,
            saved["kind"],
            saved["trigger"],
            saved["cause"],
            saved["ranks"],
            saved["detect_t"],
            saved["failure_t"],
            saved["target_step"],
            st.step,
            node=str(saved.get("node") or ""),
        )
        rec["stop_s"] = saved["stop_s"]
        rec["requeue_t"] = saved["requeue_t"]
        rec["from_job_id"] = saved.get("job_id")
        rec["reschedule_s"] = time.time() - saved["requeue_t"]
        st.restart_t = time.time()
        self.ctx.journal.write(
            "resumed_after_requeue", from_step=st.step, redo_steps=rec["lost_steps"], reschedule_s=rec["reschedule_s"]
        )
        for held in [r for r in self.ctx.events.items if r["status"] == "switched"]:  # carried over, and this one
            self.ctx.events.hold(held)

    def _resume_after_unfinished_end(self) -> None:
        """The previous job was told it ends (``job-ending.json``) but was killed before its checkpoint
        was complete (a preemption's grace time too short): record it as an event whose redone steps
        are the last commit (``snapshot.json``) minus the checkpoint this job resumes from."""
        rd, st = self.ctx.rundir, self.state
        told = self._take_note(rd.job_ending, rd.job_ending_archive)
        if told is None:
            return
        self._take_back_history()
        t = float(told["t"])  # _take_note guarantees a number
        target, _snap = self._last_commit()
        cause = f"{told.get('reason', '?')}; the job ended before its checkpoint was complete"
        rec = event_record(self.ctx, "job_end_unfinished", "planned", cause, [], t, t, target, st.step)
        rec["reschedule_s"] = time.time() - t
        st.restart_t = time.time()
        self.ctx.journal.write(
            "resumed_after_unfinished_end", from_step=st.step, redo_steps=target - st.step, last_committed=target
        )
        self.ctx.events.hold(rec)
        log.warning(
            "the previous job ended (%s) after step %d before its checkpoint was complete: resuming "
            "from checkpoint step %d, redoing %d steps",
            told.get("reason"),
            target,
            st.step,
            target - st.step,
        )

    def _resume_after_lost_controller(self) -> bool:
        """A node monitor requeued the job because its controller was lost (``controller-lost.json``):
        record that as an unexpected event whose redone steps are the previous incarnation's last
        commit (``snapshot.json``) minus the checkpoint this one resumes from."""
        rd, st = self.ctx.rundir, self.state
        claim = self._take_note(rd.controller_lost, rd.controller_lost_archive)
        if claim is None:
            return False
        journal = self._take_back_history()
        target, snap = self._last_commit()
        st.fired = set(snap.get("fired", [])) | set(journalled(journal, ("fault", "fault_firing"), "index"))
        why = claim.get(
            "why", f"unknown: the claim was cut off, {claim['unreadable']}" if "unreadable" in claim else "?"
        )
        cause = f"controller lost ({why}); requeued by the monitor of {claim.get('node', '?')}"
        t = float(claim["t"])  # _take_note guarantees a number
        rec = event_record(
            self.ctx, "controller_lost_requeue", "unexpected", cause, [], t, snap.get("last_commit_t"), target, st.step
        )
        rec["reschedule_s"] = time.time() - t
        rec["requeue_rc"] = claim.get("requeue_rc")
        rec["requeue_t"] = t
        st.restart_t = time.time()
        self.ctx.journal.write(
            "resumed_after_lost_controller",
            from_step=st.step,
            redo_steps=target - st.step,
            last_committed=target,
            reschedule_s=rec["reschedule_s"],
            node=claim.get("node"),
        )
        self.ctx.events.hold(rec)
        log.warning(
            "the previous incarnation lost its controller after step %d; resuming from checkpoint step %d",
            target,
            st.step,
        )
        return True

    def _take_back_history(self) -> list[dict[str, Any]]:
        """A job that resumes without ``requeue.json`` (its controller was lost, or it was killed before
        its checkpoint was complete) takes back from the run directory what a requeued job gets from
        that file, so that its summary covers the whole run: the events the jobs before completed
        (:meth:`EventLog.take_back_completed`) and the step log (``steps.jsonl``). Returns the journal
        it read."""
        journal = read_journal(self.ctx.rundir.events)
        self.ctx.events.take_back_completed(journal)
        self.state.step_log = read_steps(self.ctx.rundir.steps)
        return journal

    @staticmethod
    def _take_note(path: Path, archive: Callable[[float], Path]) -> dict[str, Any] | None:
        """Read a note the previous incarnation left and move it to ``archive(its t)``; None when there is
        none. A note that exists but cannot be parsed (its writer was killed between creating and
        writing it) still says that it happened: it is taken as ``{"t": its mtime, "unreadable": why}``,
        logged and archived; one that cannot even be stat'ed is logged and left in place (None)."""
        try:
            note = json.loads(path.read_text())
            if not isinstance(note, dict) or not isinstance(note.get("t"), (int, float)):
                raise ValueError("not a JSON object with a numeric 't'")
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            try:
                note = {"t": path.stat().st_mtime, "unreadable": str(exc)}
            except OSError as stat_exc:
                log.warning("ignoring %s: unreadable (%s) and cannot be stat'ed (%s)", path, exc, stat_exc)
                return None
            log.warning(
                "%s is unreadable (%s): its writer was cut off; taking it as written at its mtime, cause unknown",
                path,
                exc,
            )
        path.rename(archive(float(note["t"])))
        return note

    def _last_commit(self) -> tuple[int, dict[str, Any]]:
        """The steps the previous incarnation committed and its snapshot: the most that ``snapshot.json``
        or the step log says (the log is appended before the snapshot is replaced, so a host that died
        between the two leaves a snapshot a commit behind); this one's step when there is neither. The
        event log's last commit time is taken from the snapshot."""
        snap = read_snapshot(self.ctx.rundir.snapshot) or {}
        self.ctx.events.last_commit_t = snap.get("last_commit_t")
        logged = read_steps(self.ctx.rundir.steps)
        return max(int(snap.get("step", self.state.step)), logged[-1]["step"] + 1 if logged else 0), snap
