"""Planned switches: move the ranks of a leaving node to warm standbys while training goes on.

Contract (on the controller's thread):
- :meth:`Switches.start` picks one warm standby per leaving rank (same shape class; all on one spare node
  when they fit), takes a new epoch, and sends phase 1 (``prepare`` to the stayers in the affected
  groups and the leaver, ``join`` with ``activate=false`` to the joiners). With no warm standby
  yet but one warming, the notice waits (retried when a standby is ready); with none at all it
  checkpoints at the next step and restarts from that checkpoint (nothing lost); so does a restart
  baseline (``bench.restart_mode`` injob_restart / requeue_restart), as a good restart-based
  system honours a notice: no step is lost to a planned event in any mode.
- The next commit decision after every ``prepared`` carries the switch (see
  :mod:`tmslurm.controller.commits`); ``left`` and ``joined`` finish it. A joiner that followed a live
  shadow compares its state with the leaver's behind its first step and reports ``shadow_checked``
  before that step's vote; a mismatch (a bug, journalled loudly) aborts that step for every rank,
  to be redone on the leaver's whole state, which the joiner received. A failed phase 1 cancels
  the switch and retries the notice; a failed joiner does the same before the switch was applied
  and fails the step after. Reports for another epoch are ignored, except a ``joined`` of a dropped
  plan (see :meth:`~tmslurm.controller.recoveries.Recoveries.late_join`). Nothing here raises.
"""

from __future__ import annotations

import logging
import time

from tmslurm.controller import switch_planning as sw
from tmslurm.controller.context import Context
from tmslurm.controller.membership import Membership
from tmslurm.controller.plan_lifecycle import PlanBook
from tmslurm.controller.plan_types import PlannedSwitch
from tmslurm.controller.recoveries import Recoveries
from tmslurm.controller.restarts import Restarts
from tmslurm.controller.state import Agent
from tmslurm.core.notices import Notice
from tmslurm.wire.messages import Joined, JoinFailed, Left, Prepared, ShadowChecked, ShadowReady, Switched

log = logging.getLogger(__name__)


class Switches:
    def __init__(
        self, ctx: Context, members: Membership, plans: PlanBook, restarts: Restarts, recoveries: Recoveries
    ) -> None:
        self.ctx = ctx
        self.state = ctx.state
        self.members = members
        self.plans = plans
        self.restarts = restarts
        self.recoveries = recoveries

    def start(self, ranks: list[int], notice: Notice) -> None:
        t0, cfg, layout = time.time(), self.ctx.cfg, self.ctx.layout
        if cfg.bench.restart_mode != "tmslurm":  # a fair baseline honours the notice: checkpoint, then restart
            self.restarts.checkpoint_and_restart(ranks, f"planned {notice.reason} ({cfg.bench.restart_mode})", t0)
            return
        try:
            moves = sw.pick_joiners(layout, ranks, self.members.warm_pool(), self.members.standby_nodes())
        except sw.PlanError as exc:
            if self.members.any_idle_standby():
                log.info("planned migration of ranks %s waits for a standby to finish warming up", ranks)
                self.state.pending_notices.append(notice)
                return
            log.warning("planned migration of ranks %s impossible (%s); checkpoint, then restart", ranks, exc)
            self.restarts.checkpoint_and_restart(ranks, str(exc), t0)
            return
        full = cfg.bench.switch_mode == "full"
        groups = layout.groups if full else layout.affected_groups(ranks)
        plan = PlannedSwitch(
            self.state.new_epoch(),
            moves,
            sw.multi(layout, groups),
            notice.reason,
            source=notice.source,
            node=notice.node,
        )
        plan.times.update(notice=notice.time, detect=t0, pick=time.time())
        self._decide_shadow(plan, notice, t0, full)
        for m in moves:
            self.state.agents[m.joiner].busy = True
        msgs = self.ctx.with_join_faults(sw.planned_messages(layout, plan, shadow=plan.shadow))
        self.state.plan = plan
        if full:  # no phase 1: everything is built inside the pause, after the next commit
            plan.deferred = msgs
            plan.ready = True
        else:
            plan.waiting = {k if isinstance(k, str) else f"r{k}" for k in msgs}
            for key, msg in msgs.items():
                self.ctx.send_to(key, msg)
        self.ctx.events.begin(plan, self.state.agents, self.state.slots)
        log.info(
            "planned switch epoch %d: ranks %s -> %s (rebuilding %s)",
            plan.epoch,
            ranks,
            [m.joiner for m in moves],
            plan.groups,
        )

    def _decide_shadow(self, plan: PlannedSwitch, notice: Notice, now: float, full: bool) -> None:
        """Shadow unless switched off, in switch_mode=full, at parallel.zero=1 (a live shadow follows a whole
        replica's state, not a slice and its buddy's), or the notice's deadline leaves no time to catch up."""
        sh = self.ctx.cfg.shadow
        left = None if notice.deadline is None else notice.deadline - now
        plan.shadow = sh.enabled and not full and not self.ctx.layout.zero and (left is None or left >= sh.min_notice_s)
        if not plan.shadow:
            if sh.enabled and not full and not self.ctx.layout.zero:
                log.info(
                    "notice leaves %.1fs (< shadow.min_notice_s=%.1f): switching without a shadow",
                    left,
                    sh.min_notice_s,
                )
            return
        plan.shadow_pending = plan.joiners()
        budget = sh.catchup_timeout_s if left is None else min(sh.catchup_timeout_s, left - sh.min_notice_s / 2)
        plan.shadow_until = now + budget

    def on_shadow_ready(self, agent: Agent, msg: ShadowReady) -> None:
        plan = self.state.plan
        if not isinstance(plan, PlannedSwitch) or msg.epoch != plan.epoch or agent.aid not in plan.shadow_pending:
            return
        plan.shadow_pending.discard(agent.aid)
        plan.part("shadow_catchup_s", msg.catchup_s)
        self.ctx.journal.write(
            "shadow_ready", agent=agent.aid, rank=msg.rank, epoch=msg.epoch, step=msg.step, catchup_s=msg.catchup_s
        )

    def on_prepared(self, agent: Agent, msg: Prepared) -> None:
        plan = self.state.plan
        if plan is None or msg.epoch != plan.epoch:
            return
        if plan.applied:  # switch_mode=full: built inside the pause
            plan.part("phase1_s", msg.phase1_s)
            return
        if msg.error:
            log.warning("phase 1 failed on %s: %s", agent.aid, msg.error)
            self.plans.cancel(requeue=True)
            return
        plan.waiting.discard(self.state.who(agent))
        plan.part("phase1_s", msg.phase1_s)
        if not plan.waiting and isinstance(plan, PlannedSwitch):
            plan.ready = True
            plan.times["phase1_done"] = time.time()

    def on_switched(self, agent: Agent, msg: Switched) -> None:
        plan = self.state.plan
        if plan is not None and msg.epoch == plan.epoch:
            plan.part("phase2_s", msg.phase2_s)

    def on_left(self, agent: Agent, msg: Left) -> None:
        if agent.rank != msg.rank:
            return  # only the rank's own process can hand it over
        agent.expected_exit = True
        plan = self.state.plan
        if plan is not None:
            plan.waiting.discard(f"r{msg.rank}")
            plan.part("phase2_s", msg.phase2_s)
            plan.part("apply_s", msg.apply_s)
        self.ctx.journal.write(
            "left",
            agent=agent.aid,
            rank=msg.rank,
            node=agent.node,
            transfer_s=msg.transfer_s,
            bytes=msg.bytes,
            shadowed=msg.shadowed,
        )
        if plan is not None and plan.event is not None and msg.shadowed:
            rec = plan.event
            rec["shadow_steps"] = max(rec.get("shadow_steps", 0), msg.shadow_steps)
            rec["shadow_follow_s_per_step"] = msg.shadow_wait_s / msg.shadow_steps if msg.shadow_steps else None
        self.plans.maybe_finish()

    def on_joined(self, agent: Agent, msg: Joined) -> None:
        plan = self.state.plan
        if plan is None or msg.epoch != plan.epoch or agent.aid not in plan.joiners():
            self.recoveries.late_join(agent, msg)
            return
        self.state.dropped_joins.pop(agent.aid, None)
        old = self.state.agent_of(msg.rank)
        if old is not None and old is not agent:
            old.expected_exit = True
        agent.rank = msg.rank
        agent.busy = False
        self.state.slots[msg.rank] = agent.aid
        plan.waiting.discard(agent.aid)
        if msg.shadowed:  # no state moved in the pause; the fingerprints are compared behind the first step
            plan.part("transfer_s", 0.0)
        else:
            plan.part("transfer_s", msg.transfer_s)
        plan.bytes += msg.bytes
        if msg.shadowed:
            plan.part("apply_s", msg.apply_s)
        rec = plan.event
        if rec is not None:  # warm only if every joiner of the plan was
            rec["joiner_warm"] = rec.get("joiner_warm", True) and msg.joiner_warm
            rec["shadowed"] = rec.get("shadowed", True) and msg.shadowed
            if msg.warm_reason:
                rec.setdefault("warm_reasons", []).append(f"rank {msg.rank}: {msg.warm_reason}")
        self.ctx.journal.write(
            "joined",
            agent=agent.aid,
            rank=msg.rank,
            node=agent.node,
            epoch=plan.epoch,
            joiner_warm=msg.joiner_warm,
            warm_reason=msg.warm_reason,
        )
        self.plans.maybe_finish()
        self.members.replenish()

    def on_shadow_checked(self, agent: Agent, msg: ShadowChecked) -> None:
        """The new rank's verdict on its shadow, before its first step's vote."""
        if agent.rank != msg.rank:
            return  # only the rank's own process compared its state
        self.ctx.journal.write(
            "shadow_checked",
            agent=agent.aid,
            rank=msg.rank,
            epoch=msg.epoch,
            step=msg.step,
            matched=msg.matched,
            verify_s=msg.verify_s,
            wait_s=msg.wait_s,
        )
        self.plans.release_checked(msg.epoch)  # the leaver's part is done, a repair included
        rec = self.ctx.events.of_epoch(msg.epoch)
        if rec is not None:
            rec["shadow_matched"] = rec.get("shadow_matched", True) and msg.matched
            for part, value in (
                ("verify_s", msg.verify_s),
                ("verify_wait_s", msg.wait_s),
                ("transfer_s", msg.transfer_s),
            ):
                rec[part] = max(rec.get(part) or 0.0, value)
        if msg.matched:
            return
        log.error(
            "rank %d: its shadow DIFFERED from the leaver at the switch (a bug); the whole state was sent and "
            "step %d is redone",
            msg.rank,
            msg.step,
        )
        self.ctx.journal.write("shadow_mismatch", rank=msg.rank, agent=agent.aid, step=msg.step, bytes=msg.bytes)
        self.recoveries.fail(set(), f"rank {msg.rank}'s shadow differed: step {msg.step} redone", time.time())

    def on_join_failed(self, agent: Agent, msg: JoinFailed) -> None:
        log.warning("standby %s failed to join: %s", agent.aid, msg.error)
        agent.busy = False
        plan = self.state.plan
        if plan is None or msg.epoch != plan.epoch:
            return
        if isinstance(plan, PlannedSwitch) and not plan.applied:
            self.plans.cancel(requeue=True)
        else:
            self.recoveries.fail(set(), f"joiner {agent.aid} failed", time.time())
