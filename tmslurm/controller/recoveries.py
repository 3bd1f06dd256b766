"""Failures: detection outcomes, abort, recovery through warm standbys, fallback to a restart.

Contract (on the controller's thread):
- :meth:`Recoveries.fail` fences the dead ranks (their own handles), folds a switch in progress into
  the failure, opens a new epoch (older votes and reports are ignored from now on), aborts the
  uncommitted step everywhere and waits for each alive rank's ``aborted`` op counts.
- Then (:meth:`_plan`) it rebuilds only the affected and dirty groups, gives each dead rank a warm
  standby and a data-parallel state source, and waits for ``recovered`` / ``joined``. Unless
  ``runtime.redo_overlap``, the ranks that send no state are held: they redo the step after the
  ``resume`` that :class:`~tmslurm.controller.plan_lifecycle.PlanBook` sends when the plan finishes. With no
  switch possible it falls back to :meth:`~tmslurm.controller.restarts.Restarts.restart`.
- A failure during a recovery replans under a newer epoch. A lost joiner cancels a planned switch
  not yet applied (the notice is retried) or fails the step otherwise.
- A joiner can finish its join while the controller drops its plan (a second death handled before
  its ``joined``): it is a worker by then and ignores any further ``join``. Its late ``joined``
  (:meth:`late_join`) makes it the owner of the rank when the current recovery still counts that
  rank as dead, and the recovery is redone under a newer epoch with it as an alive rank (whatever
  the dropped plan picked it for again is replanned); when another process serves the rank, it is
  fenced. A ``joined`` matching no dropped join is ignored. Nothing here raises.
"""

from __future__ import annotations

import logging
import time

from tmslurm.controller import switch_planning as sw
from tmslurm.controller.context import Context
from tmslurm.controller.membership import Membership
from tmslurm.controller.plan_lifecycle import PlanBook
from tmslurm.controller.plan_types import Move, PlannedSwitch, Recovery
from tmslurm.controller.restarts import Restarts
from tmslurm.controller.state import Agent, Mode
from tmslurm.wire.messages import Abort, Aborted, CommErrorReport, FaultFired, FaultSpec, Joined, Recover, Recovered

log = logging.getLogger(__name__)


class Recoveries:
    def __init__(self, ctx: Context, members: Membership, plans: PlanBook, restarts: Restarts) -> None:
        self.ctx = ctx
        self.state = ctx.state
        self.members = members
        self.plans = plans
        self.restarts = restarts

    def fail(self, dead: set[int], cause: str, detect_t: float, failure_t: float | None = None) -> None:
        st = self.state
        if st.mode.ending:
            return
        st.comm_error_since = None
        if self.ctx.cfg.bench.restart_mode != "tmslurm":
            self.restarts.restart(cause, sorted(dead), "unexpected", detect_t, failure_t)
            return
        for r in dead:
            self.members.fence_rank(r, cause)
        dead = set(dead) | self._absorb_plan()
        st.epoch = st.new_epoch()
        st.mode = Mode.RECOVERING
        st.votes = {}
        alive = [r for r in range(self.ctx.layout.world) if r not in dead and st.rank_alive(r)]
        dead |= set(range(self.ctx.layout.world)) - set(alive)  # a set: O(N), not a list scan per rank
        plan = Recovery(
            st.epoch,
            [Move(r, "") for r in sorted(dead)],
            [],
            cause,
            dead=dead,
            alive=alive,
            target_step=st.step,
            deadline=time.time() + 2 * self.ctx.cfg.detect.heartbeat_timeout_s,
        )
        plan.times["detect"] = detect_t
        if failure_t is not None:  # only an injected fault knows its instant: "failure" stays unset otherwise
            plan.times["failure"] = failure_t
        plan.waiting = {f"r{r}" for r in alive}
        st.plan = plan
        self.ctx.events.begin(plan, st.agents, st.slots)
        self.ctx.journal.write("abort", epoch=st.epoch, step=st.step, dead=sorted(dead), cause=cause)
        log.warning("failure (%s) of ranks %s: aborting step %d, epoch %d", cause, sorted(dead), st.step, st.epoch)
        self.ctx.broadcast(Abort(epoch=st.epoch, step=st.step))
        if not plan.waiting:
            self._plan()

    def _absorb_plan(self) -> set[int]:
        """Cancel the plan in progress; return ranks whose replacement had not completed."""
        plan, st = self.state.plan, self.state
        if plan is None:
            return set()
        if isinstance(plan, PlannedSwitch) and not plan.applied:
            self.plans.cancel(requeue=True)
            return set()
        pending = set()
        for m in plan.moves:
            agent = st.agent_of(m.rank)
            if agent is None or not agent.alive or (isinstance(plan, PlannedSwitch) and agent.kind == "worker"):
                pending.add(m.rank)
        if isinstance(plan, Recovery):
            pending |= {r for r in plan.dead if not st.rank_alive(r)}
        self.plans.cancel(requeue=False)
        return pending

    def on_aborted(self, agent: Agent, msg: Aborted) -> None:
        plan = self.state.plan
        if not isinstance(plan, Recovery) or msg.epoch != plan.epoch or plan.applied:
            return
        plan.statuses[msg.rank] = {name: s.model_dump() for name, s in msg.status.items()}
        plan.waiting.discard(f"r{msg.rank}")
        if not plan.waiting:
            self._plan()

    def _plan(self) -> None:
        plan = self.state.plan
        assert isinstance(plan, Recovery)
        dead, layout = sorted(plan.dead), self.ctx.layout
        try:
            moves = sw.pick_joiners(layout, dead, self.members.warm_pool(), self.members.standby_nodes())
            for m in moves:
                m.source = sw.dp_source(layout, m.rank, set(dead))
        except sw.PlanError as exc:
            log.warning("no switch possible (%s): falling back to a checkpoint restart", exc)
            if plan.event is not None:
                plan.event["status"] = "cancelled"
            self.state.plan = None
            self.restarts.restart(
                f"{plan.reason}; {exc}", dead, "unexpected", plan.times["detect"], plan.times.get("failure")
            )
            return
        dirty = sw.dirty_groups(layout, plan.statuses)
        plan.moves = moves
        plan.groups = sw.multi(layout, set(layout.affected_groups(dead)) | dirty)
        plan.applied = True
        plan.times["pick"] = time.time()
        plan.dirty = sorted(dirty)
        for m in moves:
            self.state.agents[m.joiner].busy = True
        msgs = self.ctx.with_join_faults(
            sw.recovery_messages(layout, plan, plan.alive, hold=not self.ctx.cfg.runtime.redo_overlap)
        )
        plan.waiting = {k if isinstance(k, str) else f"r{k}" for k in msgs}
        plan.held = sorted(k for k, v in msgs.items() if isinstance(k, int) and isinstance(v, Recover) and v.hold)
        self.ctx.journal.write(
            "recover",
            epoch=plan.epoch,
            moves=[m.__dict__ for m in moves],
            groups=plan.groups,
            dirty=plan.dirty,
            held=plan.held,
        )
        for key, msg in msgs.items():
            self.ctx.send_to(key, msg)

    def on_recovered(self, agent: Agent, msg: Recovered) -> None:
        plan = self.state.plan
        if plan is None or msg.epoch != plan.epoch:
            return
        plan.waiting.discard(f"r{msg.rank}")
        plan.part("phase1_s", msg.build_s)
        plan.part("transfer_s", msg.transfer_s)
        self.plans.maybe_finish()

    def late_join(self, agent: Agent, msg: Joined) -> None:
        """``joined`` for a plan that was dropped before it arrived: the process serves ``msg.rank`` now."""
        st = self.state
        if st.dropped_joins.get(agent.aid) != (msg.epoch, msg.rank):
            return  # not a join we asked for and dropped: an old or bogus report
        del st.dropped_joins[agent.aid]
        plan, rank = st.plan, msg.rank
        adopt = isinstance(plan, Recovery) and rank in plan.dead and not st.rank_alive(rank)
        self.ctx.journal.write(
            "late_join",
            agent=agent.aid,
            rank=rank,
            epoch=msg.epoch,
            node=agent.node,
            outcome="adopted" if adopt else "fenced",
        )
        if not adopt:
            log.warning(
                "%s joined rank %d in dropped epoch %d, which another process serves: fencing it",
                agent.aid,
                rank,
                msg.epoch,
            )
            self.members.kill(agent)
            self.ctx.journal.write("fenced", agent=agent.aid, rank=rank, node=agent.node, cause="late join")
            self.members.replenish()
            return
        log.warning(
            "%s finished joining rank %d in dropped epoch %d: it owns the rank; recovering again with it",
            agent.aid,
            rank,
            msg.epoch,
        )
        old = st.agent_of(rank)
        if old is not None and old is not agent:
            old.expected_exit = True
        agent.rank, agent.busy = rank, False
        st.slots[rank] = agent.aid
        self.fail(set(), f"rank {rank} joined late (epoch {msg.epoch})", time.time())

    def on_comm_error(self, agent: Agent, msg: CommErrorReport) -> None:
        self.ctx.journal.write("comm_error", rank=msg.rank, step=msg.step, error=msg.error[:300])
        plan = self.state.plan
        if isinstance(plan, Recovery) and plan.applied and msg.epoch == plan.epoch:
            self.fail(set(), f"rebuild failed on rank {msg.rank}", time.time())
        elif self.state.mode is Mode.RUNNING and self.state.comm_error_since is None:
            self.state.comm_error_since = time.time()

    def on_fault(self, agent: Agent, msg: FaultFired) -> None:
        """A rank fired an injected fault: a kill, stop or hang starts its detection clock; a hiccup
        or a slow rank is not a failure and starts none."""
        self.state.fired.add(msg.index)
        if msg.kind in ("kill", "stop", "hang") and self.state.owns_slot(agent, msg.rank):  # not a joiner's
            self.state.fault_t[msg.rank] = time.time()
        self.ctx.journal.write("fault", index=msg.index, rank=msg.rank, step=msg.step, kind=msg.kind)

    def on_cluster_fault(self, fault: FaultSpec, nodes: tuple[str, ...], t: float) -> None:
        """A fault the cluster injected (the failure lab's) happened on ``nodes`` at ``t``: every rank
        on them was hit then. A node that went silent (power-off, partition) has its ranks'
        detection measured from that moment; a slow one (throttle, slowlink) stays in the run."""
        ranks = sorted(r for node in nodes for r in self.members.ranks_of_node(node))
        if fault.kind in ("power_off", "partition"):
            for rank in ranks:
                self.state.fault_t[rank] = t
        self.ctx.journal.write(
            "fault",
            index=fault.index,
            kind=fault.kind,
            rank=fault.rank,
            node=nodes[0],
            nodes=list(nodes),
            ranks=ranks,
            amount=fault.amount or None,
            via="lab",
            at=t,
        )

    def disconnect(self, agent: Agent | None) -> None:
        if agent is None or not agent.alive:
            return
        agent.alive = False
        if agent.expected_exit or self.state.mode.ending:
            return
        self.lost(agent, "process exit")

    def lost(self, agent: Agent, cause: str) -> None:
        """An agent is gone (exit, missed heartbeats): a slot owner fails its rank, a standby is replaced."""
        if agent.rank is not None and self.state.owns_slot(agent, agent.rank):
            self.fail({agent.rank}, cause, time.time(), self.state.fault_t.pop(agent.rank, None))
            return
        self.ctx.journal.write("standby_lost", agent=agent.aid, node=agent.node, cause=cause)
        log.warning("standby %s lost (%s)", agent.aid, cause)
        plan = self.state.plan
        if plan is not None and agent.aid in plan.joiners():
            if isinstance(plan, PlannedSwitch) and not plan.applied:
                self.plans.cancel(requeue=True)
            else:
                self.fail(set(), f"joiner {agent.aid} lost", time.time())
        self.members.replenish()
