"""In-job restarts: every rank again from the latest complete checkpoint, and the checkpoint-then actions.

Contract (on the controller's thread; nothing here raises into the loop):
- :meth:`Restarts.restart` kills every rank and starts them all again (``incarnation + 1``) from
  the latest complete checkpoint, or step 0; the lost steps are redone, so the result stays exact.
  With ``bench.restart_mode=requeue_restart`` and a cluster that can requeue, it requeues instead
  (:mod:`tmslurm.controller.requeues`).
  A rank whose node left the job starts on a spare allocation; while one is still queued or
  starting it waits for it (:meth:`ClusterHooks.waiting_ranks`). A rank with nowhere to run in the
  job requeues it where the cluster can (``no_node_requeue``: Slurm allocates every node anew, the
  run resumes from the same checkpoint), else ends the run (``failed``); one still waiting after
  ``runtime.connect_timeout_s`` ends it too. A restarted rank that never connects (its ``srun``
  failed while slurmctld was unreachable, its node went before it started) is restarted again, all
  ranks from the same checkpoint, once ``runtime.connect_timeout_s`` passed since the restart (the
  event's failure time is the restart that did not start it). Never a hang; the checkpoint stays.
  Nodes the restarted ranks moved off (bad nodes; their ranks now run on spares) are given back.
- :meth:`Restarts.resume_after_requeue` (at start-up) completes the event a previous job left open
  (:mod:`tmslurm.controller.resumption`), so the downtime includes Slurm's rescheduling delay.
- :meth:`checkpoint_and_requeue`: the batch host must leave; the next commit decision carries
  ``checkpoint``, and once that checkpoint is complete (:meth:`tick`) the job requeues without it.
- :meth:`checkpoint_and_restart`: a planned event with no warm standby; the same checkpoint, then
  a restart from it that loses nothing.
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

from tmslurm.controller.context import Context
from tmslurm.controller.items import Released
from tmslurm.controller.membership import Membership
from tmslurm.controller.plan_lifecycle import PlanBook
from tmslurm.controller.requeues import Requeues, event_record, nodes_of
from tmslurm.controller.resumption import Resumption
from tmslurm.controller.state import CheckpointThen, JobEnd, Mode
from tmslurm.train.ckpt_index import latest_complete
from tmslurm.wire.messages import Started

log = logging.getLogger(__name__)


class Restarts:
    def __init__(self, ctx: Context, members: Membership, plans: PlanBook) -> None:
        self.ctx = ctx
        self.state = ctx.state
        self.members = members
        self.requeues = Requeues(ctx, members, plans)
        self.placed_t = 0.0
        """When a rank of a restart was last seen waiting for a spare allocation: the start deadline
        of :meth:`_check_started` counts from then too (a rank placed late starts late)."""

    def resume_after_requeue(self) -> None:
        """At start-up: complete the event a previous job left open (:mod:`tmslurm.controller.resumption`)."""
        Resumption(self.ctx).resume()

    def restart(
        self, cause: str, ranks: list[int], trigger: str, detect_t: float, failure_t: float | None = None
    ) -> None:
        mode = self.ctx.cfg.bench.restart_mode
        if mode == "requeue_restart" and self.ctx.hooks.can_requeue():
            self.requeues.requeue(cause, ranks, trigger, detect_t, failure_t, exclude=[])
            return
        t0 = time.time()
        target = self.state.step
        nodes = nodes_of(self.state, ranks)
        self.requeues.stop_all_ranks()
        self.state.epoch = self.state.new_epoch()
        k = latest_complete(self.ctx.rundir.path, self.ctx.layout.shard_names) or 0
        rec = event_record(
            self.ctx,
            "restart" if mode == "tmslurm" else mode,
            trigger,
            cause,
            ranks,
            detect_t,
            failure_t,
            target,
            k,
            node=nodes,
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
            self.requeues.requeue(
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
            self.requeues.stop_all_ranks()
            self.state.mode = Mode.FINISHED

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
            self.requeues.requeue(
                f"batch host {then.node} leaving: {then.reason}",
                [],
                "planned",
                then.t,
                then.t,
                exclude=[then.node] if then.node is not None else [],
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
        self.requeues.stop_all_ranks()
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
            self.requeues.requeue(then.reason, [], "planned", then.t, then.t, exclude=[], kind="job_end_sigterm")
            return
        on_limit = self.ctx.cfg.slurm.on_limit
        if on_limit == "stop" or not self.ctx.hooks.can_requeue():
            self.state.stop_requested = True  # the next commit is the last; the checkpoint is complete
            self.ctx.rundir.job_ending.unlink(missing_ok=True)
            self.ctx.journal.write("stopping_at_job_end", reason=then.reason, checkpoint_step=then.checkpoint_step)
            log.warning("stopping (%s): resume with train.resume_from=%s", then.reason, self.ctx.rundir.path)
            return
        self.requeues.requeue(then.reason, [], "planned", then.t, then.t, exclude=[], kind=f"job_end_{on_limit}")
