"""Requeue: the job leaves its allocation and a next job takes the run over from its checkpoint.

Contract (on the controller's thread; nothing here raises into the loop):
- :meth:`Requeues.requeue` stops every rank, saves the step log and the open event to
  ``requeue.json`` and requeues the job (optionally away from nodes), or, for ``job_end_resubmit``,
  submits the next job after this one; ``job_end_sigterm`` asks nothing of the cluster (Slurm
  requeues or ends the job itself). The run's mode becomes FINISHED with ``requeued`` set; the next
  job completes the saved event (:mod:`tmslurm.controller.resumption`), so the downtime includes
  Slurm's rescheduling delay.
- :meth:`Requeues.stop_all_ranks` cancels the plan in flight and kills every live rank, as expected
  exits: what a restart, a requeue and a run that cannot go on do first.
- :func:`event_record` makes the event record of a restart or requeue (kind, trigger, cause, the
  redone steps from the checkpoint) and appends it to the event log; the caller holds it
  (journalled) once it is complete. :func:`nodes_of` names the nodes of ranks as a switch's event
  does.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from tmslurm.controller.context import Context
from tmslurm.controller.membership import Membership
from tmslurm.controller.plan_lifecycle import PlanBook
from tmslurm.controller.state import Mode, RunState

log = logging.getLogger(__name__)


def nodes_of(state: RunState, ranks: list[int]) -> str:
    """The nodes ``ranks`` run on now, comma-separated, as a switch's event names them: so that an
    event is tied to the node whose fault or notice caused it."""
    agents = (state.agent_of(r) for r in ranks)
    return ",".join(sorted({a.node for a in agents if a is not None and a.node}))


def event_record(
    ctx: Context,
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
    """A restart's or requeue's event, appended to the event log (held, journalled, by the caller
    once its record is complete)."""
    rec = {
        "kind": kind,
        "trigger": trigger,
        "cause": cause,
        "epoch": ctx.state.epoch,
        "ranks": ranks,
        "node": node,
        "standby": "",
        "notice_t": failure_t or detect_t,
        "last_commit_t": ctx.events.last_commit_t,
        "detect_s": max(0.0, detect_t - (failure_t or detect_t)),
        "from_checkpoint_step": from_step,
        "lost_steps": target - from_step,
        "target_step": target,
        "status": "switched",
        "switched_t": time.time(),
    }
    ctx.events.items.append(rec)
    return rec


class Requeues:
    def __init__(self, ctx: Context, members: Membership, plans: PlanBook) -> None:
        self.ctx = ctx
        self.state = ctx.state
        self.members = members
        self.plans = plans

    def stop_all_ranks(self) -> None:
        if self.state.plan is not None:
            self.plans.cancel(requeue=False)
        for r in range(self.ctx.layout.world):
            agent = self.state.agent_of(r)
            if agent is not None and agent.alive:
                agent.expected_exit = True
                self.members.kill(agent)

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
        nodes = nodes_of(st, ranks)
        self.stop_all_ranks()
        if kind is None:
            kind = "requeue_restart" if self.ctx.cfg.bench.restart_mode == "requeue_restart" else "batch_host_requeue"
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
