"""A planned switch whose commit decision went out before the controller died: completed, not refused.

Contract (used by :mod:`tmslurm.controller.adoption` only, on the controller's thread):

- :func:`find` reads the rejoins. When a decision that carried a planned switch (epoch ``E``, step
  ``S``) is the last decision any live process holds, the dead controller had committed that switch:
  every process that got it holds an identical copy. :func:`find` returns it as a
  :class:`Completion` with, per move, the joiner's claim (matched by its process: the agent id
  without its connection number) and the leaving process's claim when it came back; ``None`` when no
  such decision is the last one (a switch decision followed by a later commit was completed by the
  dead controller: that commit needed the joiner's vote); or why it cannot be completed without a
  guess: two different decisions for one step, a switch decision that also carried a checkpoint,
  a joiner that did not come back or is not joining that epoch, a rank that must still apply the
  switch but holds no groups prepared for it, or a process inside another plan.
- :func:`complete` puts the controller where the normal phase 2 (:meth:`Commits.commit`) leaves it:
  the current plan is the :class:`PlannedSwitch` of epoch ``E``, applied, waiting for the joiners
  that have not joined yet and for the leavers that still have to apply the decision (they get it
  again with every other rank that missed it). A joiner whose join was never activated gets
  ``activate``. A leaver that holds the decision takes no slot (:attr:`Rejoin.leaving`): it
  hands its state over and exits, as expected. The planned event the dead controller began
  (its ``event_begin``) is taken back and completes at the first step after the switch. ``joined``
  reports that arrived while adopting are then handled by the normal path. Nothing here raises.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from tmslurm.controller import switch_planning as sw
from tmslurm.controller.context import Context
from tmslurm.controller.journal import read_journal
from tmslurm.controller.plan_types import Move, Plan, PlannedSwitch
from tmslurm.controller.planned_switches import Switches
from tmslurm.controller.state import Agent, process_of
from tmslurm.core.topology import Layout
from tmslurm.wire.messages import Activate, Decision, Joined, Rejoin

log = logging.getLogger(__name__)


@dataclass
class Claim:
    agent: Agent
    rejoin: Rejoin | None

    @property
    def rejoined(self) -> Rejoin:
        """The rejoin of a claim that takes part in a switch (it always has one)."""
        assert self.rejoin is not None, f"{self.agent.aid} did not rejoin"
        return self.rejoin


@dataclass(frozen=True)
class Completion:
    decision: Decision
    """The decision that carried the switch, as the ranks that got it hold it."""
    joiners: dict[int, Claim]
    """Rank -> the claim of the process that joins it."""
    leavers: dict[int, Claim]
    """Rank -> the claim of the process that leaves it, when that process came back."""

    @property
    def epoch(self) -> int:
        assert self.decision.switch is not None
        return self.decision.switch.epoch


def switch_groups(layout: Layout, full: bool, ranks: list[int]) -> list[str]:
    """The groups a planned switch of ``ranks`` rebuilds, as :meth:`Switches.start` chose them."""
    return sw.multi(layout, layout.groups if full else layout.affected_groups(ranks))


def find(
    claims: Iterable[Claim], workers: dict[int, Claim], last_step: Callable[[Claim], int], layout: Layout, full: bool
) -> Completion | str | None:
    """The planned switch to complete, None when there is none, or why it cannot be completed."""
    claims = [c for c in claims if c.rejoin is not None]
    held = [
        c.rejoined.decision
        for c in claims
        if c.rejoined.decision is not None and c.rejoined.decision.switch is not None
    ]
    if not held:
        return None
    d = max(held, key=lambda x: x.step)
    top = max(last_step(c) for c in workers.values())
    if d.step < top:
        return None  # a later commit needed the joiner's vote: the dead controller completed it
    if d.step > top + 1:
        return f"the decision of step {d.step} that carried a switch is more than one step ahead of every rank"
    if any(
        c.rejoined.decision is not None and c.rejoined.decision.step == d.step and c.rejoined.decision != d
        for c in claims
    ):
        return f"the ranks hold different decisions for step {d.step}"
    if d.checkpoint:
        return "the decision that carried the switch also carried a checkpoint"
    return _check(d, claims, workers, last_step, layout, full)


def _check(
    d: Decision,
    claims: list[Claim],
    workers: dict[int, Claim],
    last_step: Callable[[Claim], int],
    layout: Layout,
    full: bool,
) -> Completion | str:
    assert d.switch is not None
    epoch, moves = d.switch.epoch, d.switch.moves
    joiners: dict[int, Claim] = {}
    for m in moves:
        joiner = next((c for c in claims if process_of(c.agent.aid) == process_of(m.joiner)), None)
        if joiner is None:
            return f"the joiner of rank {m.rank} in the switch of epoch {epoch} ({m.joiner}) did not come back"
        rj = joiner.rejoined
        if rj.rank != m.rank and not (rj.rank is None and rj.in_plan and rj.epoch == epoch):
            return f"the joiner of rank {m.rank} ({joiner.agent.aid}) is not joining the switch of epoch {epoch}"
        joiners[m.rank] = joiner
    leavers = {m.rank: c for m in moves for c in claims if c.rejoined.rank == m.rank and c is not joiners[m.rank]}
    ours = {id(c) for c in joiners.values()}
    for c in claims:
        rj = c.rejoined
        if rj.in_plan and (rj.aborting or set(rj.prepared) - {epoch}):
            return f"{c.agent.aid} is inside another plan (epochs {rj.prepared}, aborting: {rj.aborting})"
        if rj.in_plan and rj.rank is None and id(c) not in ours:
            return f"standby {c.agent.aid} is inside another plan (epoch {rj.epoch})"
    plan = Plan(
        "planned", epoch, [Move(m.rank, m.joiner) for m in moves], switch_groups(layout, full, [m.rank for m in moves])
    )
    prepare = {k for k in sw.planned_messages(layout, plan) if isinstance(k, int)}
    for rank, c in sorted(workers.items()):
        if last_step(c) < d.step and rank in prepare and epoch not in c.rejoined.prepared:
            return f"rank {rank} missed decision {d.step} and holds no groups prepared for epoch {epoch}"
    return Completion(d, joiners, leavers)


def complete(
    c: Completion, ctx: Context, switches: Switches, joins: dict[str, Joined], incarnation: int, now: float
) -> dict[str, Any]:
    """Make the switch true in the controller's state (see the module docstring); what ``adopted`` journals."""
    st, d = ctx.state, c.decision
    plan = PlannedSwitch(
        c.epoch,
        [Move(r, j.agent.aid) for r, j in sorted(c.joiners.items())],
        switch_groups(ctx.layout, ctx.cfg.bench.switch_mode == "full", sorted(c.joiners)),
        "planned move",
    )
    plan.ready = plan.applied = True
    plan.target_step = d.step + 1
    plan.times.update(decision=now)
    activated = []
    for rank, j in sorted(c.joiners.items()):
        if st.owns_slot(j.agent, rank):
            continue  # it joined: it serves the rank
        j.agent.busy = True
        plan.waiting.add(j.agent.aid)
        if c.epoch in j.rejoined.prepared:  # the dead controller never sent it its activate
            j.agent.channel.try_send(Activate(epoch=c.epoch))
            activated.append(rank)
    for rank, leaver in c.leavers.items():
        if st.owns_slot(leaver.agent, rank):  # it missed the decision: it applies it and hands over
            plan.waiting.add(f"r{rank}")
    _take_back_event(plan, ctx, d.step, incarnation)
    st.plan = plan
    for j in c.joiners.values():
        if j.agent.aid in joins:
            switches.on_joined(j.agent, joins[j.agent.aid])
    switches.plans.maybe_finish()
    log.warning(
        "completing the planned switch of epoch %d committed at step %d (activated ranks %s)",
        c.epoch,
        d.step,
        activated,
    )
    return {
        "completed_switch": c.epoch,
        "switch_step": d.step,
        "activated": activated,
        "switch_waiting": sorted(plan.waiting),
    }


def _take_back_event(plan: PlannedSwitch, ctx: Context, step: int, incarnation: int) -> None:
    """The planned event the dead controller began, open again; its gap counts from the commit that carried it."""
    begun = [
        e
        for e in read_journal(ctx.rundir.events)
        if e.get("type") == "event_begin" and e.get("kind") == "planned" and e.get("epoch") == plan.epoch
    ]
    if not begun:
        return
    rec = {k: v for k, v in begun[-1].items() if k not in ("t", "type")}
    plan.reason = str(rec.get("cause") or plan.reason)
    plan.times["notice"] = rec.get("notice_t") or plan.times["decision"]
    committed = [e["t_end"] for e in ctx.state.step_log if e.get("step") == step]
    rec.update(
        status="open",
        last_commit_t=committed[-1] if committed else rec.get("last_commit_t"),
        completed_by_incarnation=incarnation,
    )
    plan.event = rec
    ctx.events.take_back(rec)
