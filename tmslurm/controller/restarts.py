"""Restart paths: checkpoint restart (the fallback and the in-job baseline), requeue, batch host.

Contract (on the controller's thread; nothing here raises into the loop):
- :meth:`Restarts.restart` kills every rank and starts them all again (``incarnation + 1``) from
  the latest complete checkpoint, or step 0; the lost steps are redone, so the result stays exact.
  With ``runtime.restart_mode=requeue_restart`` and a cluster that can requeue, it requeues instead.
  A rank whose node left the job starts on a spare allocation; while one is still queued or
  starting it waits for it (:meth:`ClusterHooks.waiting_ranks`). A rank with nowhere to run in the
  job requeues it where the cluster can (``no_node_requeue``: Slurm allocates every node anew, the
  run resumes from the same checkpoint), else ends the run (``failed``); one still waiting after
  ``runtime.connect_timeout_s`` ends it too. A restarted rank that never connects (its ``srun``
  failed while slurmctld was unreachable, its node went before it started) is restarted again, all
  ranks from the same checkpoint, once ``runtime.connect_timeout_s`` passed since the restart (the
  event's failure time is the restart that did not start it). Never a hang; the checkpoint stays.
  Nodes the restarted ranks moved off (bad nodes; their ranks now run on spares) are given back.
- :meth:`Restarts.requeue` saves the step log and the open event to ``requeue.json`` and requeues
  the job (optionally away from nodes); :meth:`resume_after_requeue` (at start-up) completes that
  event in the next incarnation, so the downtime includes Slurm's rescheduling delay.
- A job requeued by a node monitor after its controller was lost (``controller-lost.json``) is
  recorded at start-up as an unexpected ``controller_lost_requeue`` event: redone steps = the last
  committed step of the previous incarnation (``snapshot.json``) - the checkpoint resumed from. So
  is a job killed before the checkpoint its end asked for was complete (``job_end_unfinished``).
  Both take back the earlier jobs' completed events and step log from the run directory.
- :meth:`checkpoint_and_requeue`: the batch host must leave; the next commit decision carries
  ``checkpoint``, and once that checkpoint is complete (:meth:`tick`) the job requeues without it.
- :meth:`checkpoint_and_end`: the main job's time limit is near (SIGUSR1); the same checkpoint,
  then ``slurm.on_limit``: requeue (event ``job_end_requeue``), resubmit (``job_end_resubmit``: a
  new job after this one) or stop (the run ends at the next commit, the checkpoint complete). No
  step is committed while the checkpoint is written, so the next job redoes none.
Parts recorded: detect, stop, reschedule (requeue), startup, group_setup, ckpt_load, redo.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tmslurm.controller.context import Context
from tmslurm.controller.items import Released
from tmslurm.controller.journal import journalled, read_journal
from tmslurm.controller.membership import Membership
from tmslurm.controller.plan_lifecycle import PlanBook
from tmslurm.controller.snapshot import read_snapshot, read_steps
from tmslurm.controller.state import CheckpointThen, JobEnd, Mode
from tmslurm.train.ckpt_index import latest_complete
from tmslurm.wire.messages import Started

log = logging.getLogger(__name__)


class Restarts:
    def __init__(self, ctx: Context, members: Membership, plans: PlanBook) -> None:
        self.ctx = ctx
        self.state = ctx.state
        self.members = members
        self.plans = plans
        self.placed_t = 0.0
        """When a rank of a restart was last seen waiting for a spare allocation: the start deadline
        of :meth:`_check_started` counts from then too (a rank placed late starts late)."""

    def restart(
        self, cause: str, ranks: list[int], trigger: str, detect_t: float, failure_t: float | None = None
    ) -> None:
        mode = self.ctx.cfg.runtime.restart_mode
        if mode == "requeue_restart" and self.ctx.hooks.can_requeue():
            self.requeue(cause, ranks, trigger, detect_t, failure_t, exclude=[])
            return
        t0 = time.time()
        target = self.state.step
        nodes = self._nodes_of(ranks)
        self._stop_all_ranks()
        self.state.epoch = self.state.new_epoch()
        k = latest_complete(self.ctx.rundir.path, self.ctx.layout.shard_names) or 0
        rec = self._record(
            "restart" if mode == "tmslurm" else mode, trigger, cause, ranks, detect_t, failure_t, target, k, node=nodes
        )
        rec["stop_s"] = time.time() - t0
        self.ctx.events.hold(rec)
        self.ctx.journal.write(
            "restart",
            epoch=self.state.epoch,
            cause=cause,
            from_step=k,
            lost_steps=target - k,
            incarnation=self.state.incarnation + 1,
        )  # the processes about to start
        log.warning("restarting every rank from checkpoint step %d (%s)", k, cause)
        failed = self._respawn_all(k)
        if failed and self.ctx.hooks.can_requeue():  # no node left for them in this job: Slurm allocates anew
            self.ctx.events.drop(rec)
            log.warning("ranks %s have no node to restart on in this job: requeueing it", failed)
            self.requeue(
                f"{cause}; no node in this job for ranks {failed}",
                ranks,
                trigger,
                detect_t,
                failure_t,
                exclude=[],
                kind="no_node_requeue",
            )
        elif failed:  # never hang: end the run with what it has, the checkpoint stays for a resume
            log.error("ranks %s cannot be restarted anywhere; ending the run (resume with train.resume_from)", failed)
            self.state.failed_reason = f"no node to restart ranks {failed}"
            self.ctx.journal.write("run_failed", reason=self.state.failed_reason)
            self._stop_all_ranks()
            self.state.mode = Mode.FINISHED

    def _nodes_of(self, ranks: list[int]) -> str:
        """The nodes ``ranks`` run on now, comma-separated, as a switch's event names them: so that an
        event is tied to the node whose fault or notice caused it."""
        agents = (self.state.agent_of(r) for r in ranks)
        return ",".join(sorted({a.node for a in agents if a is not None and a.node}))

    def _record(
        self,
        kind: str,
        trigger: str,
        cause: str,
        ranks: list[int],
        detect_t: float,
        failure_t: float | None,
        target: int,
        from_step: int,
        node: str = "",
    ) -> dict[str, Any]:
        rec = {
            "kind": kind,
            "trigger": trigger,
            "cause": cause,
            "epoch": self.state.epoch,
            "ranks": ranks,
            "node": node,
            "standby": "",
            "notice_t": failure_t or detect_t,
            "last_commit_t": self.ctx.events.last_commit_t,
            "detect_s": max(0.0, detect_t - (failure_t or detect_t)),
            "from_checkpoint_step": from_step,
            "lost_steps": target - from_step,
            "target_step": target,
            "status": "switched",
            "switched_t": time.time(),
        }
        self.ctx.events.items.append(rec)  # held (journalled) by the caller once its record is complete
        return rec

    def _stop_all_ranks(self) -> None:
        if self.state.plan is not None:
            self.plans.cancel(requeue=False)
        for r in range(self.ctx.layout.world):
            agent = self.state.agent_of(r)
            if agent is not None and agent.alive:
                agent.expected_exit = True
                self.members.kill(agent)

    def _respawn_all(self, from_step: int) -> list[int]:
        st = self.state
        st.step = st.resume_step = from_step
        st.votes = {}
        st.incarnation += 1
        st.restart_t = time.time()
        st.started = {}
        world = range(self.ctx.layout.world)
        before = {self.ctx.spawner.node_of_rank(r) for r in world}
        failed = [r for r in world if self.members.spawn_worker(r, st.incarnation) is False]
        left = sorted(before - {self.ctx.spawner.node_of_rank(r) for r in world})
        if left and not failed:  # ranks moved off these (bad) nodes: give them back, as a switch does
            self.ctx.hooks.release_nodes(left, lambda node: self.ctx.submit(Released(node)))
        st.mode = Mode.RUNNING
        return failed

    def on_started(self, msg: Started) -> None:
        rec = next(
            (
                r
                for r in reversed(self.ctx.events.items)
                if r.get("from_checkpoint_step") is not None and r["status"] == "switched"
            ),
            None,
        )
        if rec is None or msg.step != rec["from_checkpoint_step"]:
            return
        rec["group_setup_s"] = max(rec.get("group_setup_s", 0.0), msg.groups_s)
        rec["ckpt_load_s"] = max(rec.get("ckpt_load_s", 0.0), msg.ckpt_load_s)
        self.state.started[msg.rank] = msg
        if len(self.state.started) == self.ctx.layout.world and self.state.restart_t is not None:
            rec["startup_s"] = time.time() - self.state.restart_t
            rec["all_started_t"] = time.time()
            self.state.retry_notices = True  # a notice the restart cancelled or kept waiting is planned now

    # ---- requeue ------------------------------------------------------------------------------
    def requeue(
        self,
        cause: str,
        ranks: list[int],
        trigger: str,
        detect_t: float,
        failure_t: float | None,
        exclude: list[str],
        kind: str | None = None,
    ) -> None:
        """Stop every rank, save the open event, and requeue the job (``kind`` ``job_end_resubmit``:
        submit the next job instead, which starts when this one has ended)."""
        t0 = time.time()
        st = self.state
        nodes = self._nodes_of(ranks)
        self._stop_all_ranks()
        if kind is None:
            kind = "requeue_restart" if self.ctx.cfg.runtime.restart_mode == "requeue_restart" else "batch_host_requeue"
        saved = {
            "cause": cause,
            "ranks": ranks,
            "trigger": trigger,
            "detect_t": detect_t,
            "failure_t": failure_t,
            "target_step": st.step,
            "last_commit_t": self.ctx.events.last_commit_t,
            "step_log": st.step_log,
            "events": self.ctx.events.items,
            "stop_s": time.time() - t0,
            "requeue_t": time.time(),
            "exclude": exclude,
            "fired": sorted(st.fired),
            "kind": kind,
            "node": nodes,
            "job_id": self.ctx.hooks.status().get("main_job_id"),
        }
        self.ctx.rundir.requeue.write_text(json.dumps(saved, default=str))
        self.ctx.journal.write("requeue", cause=cause, target_step=st.step, exclude=exclude, kind=kind)
        log.warning(
            "%s the job (%s); it resumes from the latest checkpoint",
            "resubmitting" if kind == "job_end_resubmit" else "requeueing",
            cause,
        )
        st.requeued = True
        st.mode = Mode.FINISHED
        self.ctx.rundir.job_ending.unlink(missing_ok=True)  # the end is recorded in full: nothing to tell
        if kind == "job_end_resubmit":
            self.ctx.hooks.resubmit()
        elif kind != "job_end_sigterm":
            self.ctx.hooks.requeue(exclude)

    def resume_after_requeue(self) -> None:
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
        rec = self._record(
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
        rec = self._record("job_end_unfinished", "planned", cause, [], t, t, target, st.step)
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
        rec = self._record(
            "controller_lost_requeue", "unexpected", cause, [], t, snap.get("last_commit_t"), target, st.step
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

    def checkpoint_and_requeue(self, node: str, reason: str) -> None:
        if self.state.checkpoint_then is not None:
            return
        self.state.checkpoint_then = CheckpointThen("requeue", reason, time.time(), node=node)
        self.ctx.journal.write("batch_host_notice", node=node, reason=reason)
        log.warning("the batch host %s must leave (%s): checkpoint, then requeue without it", node, reason)

    def checkpoint_and_restart(self, ranks: list[int], reason: str, t: float) -> None:
        """A planned event with no standby: lose nothing, restart from a checkpoint of the next step."""
        if self.state.checkpoint_then is not None:
            return
        self.state.checkpoint_then = CheckpointThen("restart", reason, t, ranks=list(ranks))
        self.ctx.journal.write("checkpoint_then_restart", ranks=ranks, reason=reason)
        log.warning(
            "no warm standby for ranks %s (%s): checkpoint at the next step, then restart from it", ranks, reason
        )

    def checkpoint_and_end(self, end: JobEnd, reason: str) -> None:
        """The main job is ending: checkpoint at the next step boundary, then (:meth:`_end_job`)
        ``slurm.on_limit`` for a time limit, or wait for Slurm's kill after a SIGTERM. It supersedes a
        checkpoint-then-restart that was waiting (the next job restarts every rank anyway); a batch
        host leaving already ends the job. ``job-ending.json`` tells the next job it was announced."""
        st = self.state
        if st.requeued or st.mode is Mode.FINISHED or st.stop_requested:
            return
        then = st.checkpoint_then
        if then is not None and then.action in ("requeue", "end"):
            return
        step = then.checkpoint_step if then is not None else None
        st.checkpoint_then = CheckpointThen("end", reason, time.time(), checkpoint_step=step, end=end)
        action = self.ctx.cfg.slurm.on_limit if end is JobEnd.TIME_LIMIT else "wait for Slurm"
        self.ctx.rundir.job_ending.write_text(
            json.dumps({"t": time.time(), "end": end.value, "reason": reason, "step": st.step})
        )
        self.ctx.journal.write(
            "job_ending", end=end.value, reason=reason, then=action, superseded=then.action if then else None
        )
        log.warning("the job is ending (%s): checkpoint at the next step boundary, then %s", reason, action)

    def tick(self) -> None:
        waiting = self.ctx.hooks.waiting_ranks()
        self._check_waiting(waiting)
        self._check_started(set(waiting))
        then = self.state.checkpoint_then
        if then is None or then.checkpoint_step is None or self.state.requeued:
            return
        if latest_complete(self.ctx.rundir.path, self.ctx.layout.shard_names) != then.checkpoint_step:
            return
        self.state.checkpoint_then = None
        if then.action == "requeue":
            self.requeue(
                f"batch host {then.node} leaving: {then.reason}", [], "planned", then.t, then.t, exclude=[then.node]
            )
        elif then.action == "end":
            self._end_job(then)
        else:
            self.restart(then.reason, then.ranks, "planned", then.t)

    def _check_waiting(self, waiting: dict[int, float]) -> None:
        """Ranks of a restart that wait for a spare allocation: the run never hangs on them; after
        ``runtime.connect_timeout_s`` it ends failed (the checkpoint stays for a resume)."""
        late = sorted(r for r, waited in waiting.items() if waited > self.ctx.cfg.runtime.connect_timeout_s)
        if not late or self.state.mode.ending:
            return
        st = self.state
        log.error(
            "ranks %s found no spare allocation to restart on within %.0fs; ending the run (resume with "
            "train.resume_from)",
            late,
            self.ctx.cfg.runtime.connect_timeout_s,
        )
        st.failed_reason = (
            f"no node to restart ranks {late} (no spare allocation started within runtime.connect_timeout_s)"
        )
        self.ctx.journal.write("run_failed", reason=st.failed_reason)
        self._stop_all_ranks()
        st.mode = Mode.FINISHED

    def _check_started(self, waiting: set[int]) -> None:
        """Ranks of an in-job restart that never connected within ``runtime.connect_timeout_s`` (and
        wait for no spare allocation): nothing else would notice them (no process, no heartbeat, no
        vote), so restart again."""
        st, limit, now = self.state, self.ctx.cfg.runtime.connect_timeout_s, time.time()
        if waiting:
            self.placed_t = now
        if (
            st.restart_t is None
            or st.mode is not Mode.RUNNING
            or st.plan is not None
            or st.requeued
            or now - max(st.restart_t, self.placed_t) <= limit
        ):
            return
        missing = [
            r for r in range(self.ctx.layout.world) if r not in waiting and not st.rank_alive(r) and r not in st.started
        ]
        if not missing:
            return
        log.warning(
            "ranks %s did not start within %.0fs of the restart (runtime.connect_timeout_s): restarting again",
            missing,
            limit,
        )
        self.restart(
            f"ranks {missing} did not start within runtime.connect_timeout_s={limit:g}s of the restart",
            missing,
            "unexpected",
            now,
            st.restart_t,
        )

    def _end_job(self, then: CheckpointThen) -> None:
        if then.end is JobEnd.SIGTERM:  # Slurm requeues (preemption) or ends (scancel) the job itself
            self.requeue(then.reason, [], "planned", then.t, then.t, exclude=[], kind="job_end_sigterm")
            return
        on_limit = self.ctx.cfg.slurm.on_limit
        if on_limit == "stop" or not self.ctx.hooks.can_requeue():
            self.state.stop_requested = True  # the next commit is the last; the checkpoint is complete
            self.ctx.rundir.job_ending.unlink(missing_ok=True)
            self.ctx.journal.write("stopping_at_job_end", reason=then.reason, checkpoint_step=then.checkpoint_step)
            log.warning("stopping (%s): resume with train.resume_from=%s", then.reason, self.ctx.rundir.path)
            return
        self.requeue(then.reason, [], "planned", then.t, then.t, exclude=[], kind=f"job_end_{on_limit}")
