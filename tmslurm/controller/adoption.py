"""Re-adopting the live agents after the controller itself was restarted (by its supervisor).

Contract: built by a restarted incarnation only (the supervisor wrote ``adopt.json``:
:class:`~tmslurm.controller.adoption_restore.AdoptOrder`). :meth:`Adoption.restore` (called once,
before the loop) takes back what the dead incarnation had committed and puts the run in
:data:`Mode.ADOPTING` (:mod:`tmslurm.controller.adoption_restore`). The live agents reconnect
with a :class:`~tmslurm.wire.messages.Rejoin` (:mod:`tmslurm.agent.link`); :meth:`on_hello` records it.
:meth:`tick` decides once every listed process said hello, or ``runtime.controller_lost_s`` after the start
(what the claims allow: :mod:`tmslurm.controller.adoption_claims`):

- **Adopted** when every rank's slot is claimed once, no claim is inside a plan (but one caught in
  phase 1 of a planned switch, or the switch completed below), every rank is in the same epoch (or,
  completing a switch, in its epoch or the one before), no decision carried a checkpoint, and the
  ranks' last decisions are at most one step apart. The dead controller had decided a step when any
  rank received its decision, so the ranks that did not get it receive it again (no step applied
  twice, none lost), votes that were waiting count, ``resume`` frees a rank held by a recovery that
  ended with the controller, and the run goes on (``adopted`` in the journal, a
  ``controller_restart`` event whose parts add up to its gap). Listed processes that never came back
  are fenced; a rank among them fails as an unexpected failure (the usual recovery).
- **Completed** (:mod:`tmslurm.controller.adopted_switch`), when the last decision any live process
  holds carried a planned switch (phase 2 or its first step: it reached at least one rank, the
  leaver included): the switch was committed, and every copy of that decision is identical. It
  is sent again, like any decision, to the ranks that missed it; a joiner whose join was never
  activated gets ``activate``; a leaver that holds it takes no slot and is expected to exit after
  its hand-over; the joiner takes the slot with its ``joined`` (one that arrives while adopting is
  kept for it, and its vote counts); the dead controller's planned event is taken back and
  completes at the first step after the switch (``adopted`` with ``completed_switch``). A decision
  followed by a later commit was completed by the dead controller already (that commit needed the
  joiner's vote): a plain adoption. Refused, with the reason: two different decisions for one step,
  a switch decision that also carried a checkpoint, a joiner that did not come back or is not
  joining that epoch, a rank that missed the decision without groups prepared for it, or a process
  inside another plan.
- **Rolled back** first, when the only plans in flight are planned switches caught in phase 1 (every
  agent inside a plan only prepared groups or holds a join not yet activated; no abort, no decision
  with a switch): each is cancelled everywhere (``cancel``), and its ranks are noticed again, so the
  new controller plans the move afresh under a new epoch (``plan_rolled_back`` in the journal).
- **Redone**, when a recovery was under way (a rank saw an abort newer than its epoch) and every
  rank's last decision is the same step, with no switch or checkpoint: joiners still receiving
  state are cancelled, and a new recovery under a new epoch aborts the step on every live rank and
  moves the ranks whose process is gone (``adopted`` with ``resumed_recovery``). A recovery's
  ``joined`` that arrives while adopting is ignored (the recovery is redone without it).
- **Refused** otherwise (``adoption_refused``, the reason): nothing is guessed. The rank processes
  that came back are stopped and every rank restarts from the latest complete checkpoint, in the
  same job (a job-wide ``restart`` event; the steps since are redone, so the run stays exact). A
  decision that carried a checkpoint is always refused: the restart stands in for its plan.
Nothing here raises.
"""

from __future__ import annotations

import logging
import time

from tmslurm.controller import adopted_switch
from tmslurm.controller.adopted_switch import Claim
from tmslurm.controller.adoption_claims import Claims, rejoin_of
from tmslurm.controller.adoption_restore import AdoptOrder, complete_log, open_restart_event, restore
from tmslurm.controller.commits import Commits
from tmslurm.controller.context import Context
from tmslurm.controller.journal import read_journal
from tmslurm.controller.membership import Membership
from tmslurm.controller.plan_types import PlannedSwitch
from tmslurm.controller.planned_switches import Switches
from tmslurm.controller.recoveries import Recoveries
from tmslurm.controller.state import Agent, Mode
from tmslurm.core.notices import Notice
from tmslurm.wire.messages import Cancel, Joined, Rejoin, Resume

__all__ = ["AdoptOrder", "Adoption"]
log = logging.getLogger(__name__)


class Adoption:
    def __init__(
        self,
        ctx: Context,
        members: Membership,
        commits: Commits,
        recoveries: Recoveries,
        switches: Switches,
        order: AdoptOrder,
    ) -> None:
        self.ctx = ctx
        self.members = members
        self.commits = commits
        self.recoveries = recoveries
        self.switches = switches
        self.order = order
        self.started_m = time.monotonic()
        self.started_t = time.time()
        self.claims = Claims(ctx.state)
        """What each agent said in its hello while adopting, and what that allows."""
        self.open = True
        """Adopting: the decision (:meth:`tick`) is not taken yet."""
        self.joins: dict[str, Joined] = {}
        """``joined`` reports that arrived while adopting, by agent id: handled once the switch is taken back."""

    def restore(self) -> None:
        """Before the loop: take back what the dead incarnation committed (:func:`.adoption_restore.restore`)."""
        restore(self.ctx, self.order)

    # ---- while adopting -----------------------------------------------------------------------
    def on_hello(self, agent: Agent, rejoin: Rejoin | None) -> None:
        if not self.open:
            return
        self.claims.by_agent[agent.aid] = Claim(agent, rejoin)
        if rejoin is not None and rejoin.leaving:  # it hands its slot over and exits (it took no slot)
            agent.rank, agent.expected_exit = rejoin.rank, True

    def on_joined(self, agent: Agent, msg: Joined) -> None:
        """A joiner finished while adopting (a committed switch): it serves the rank from now on (its
        votes count); its report waits for the switch to be taken back."""
        self.joins[agent.aid] = msg
        st = self.ctx.state
        if agent.rank is None and st.agent_of(msg.rank) is None:
            agent.rank = msg.rank
            st.slots[msg.rank] = agent.aid

    def tick(self) -> None:
        if not self.open:
            return
        waiting = self.ctx.state.expected
        if waiting and time.monotonic() - self.started_m < self.ctx.cfg.runtime.controller_lost_s:
            return
        self.open = False
        recovering = self.claims.recovering()
        workers = self.claims.workers()
        found = (
            None
            if recovering or self.claims.missing(workers)
            else adopted_switch.find(
                self.claims.by_agent.values(),
                workers,
                self.claims.last_step,
                self.ctx.layout,
                self.ctx.cfg.bench.switch_mode == "full",
            )
        )
        if isinstance(found, str):
            self._refuse(found)
            return
        self.claims.completion = found
        self._drop_stray_joins()
        why = self.claims.resume_refusal() if recovering else self.claims.refusal()
        if why is not None:
            self._refuse(why)
        elif recovering:
            self._resume_recovery()
        else:
            self._adopt()

    def _drop_stray_joins(self) -> None:
        """A ``joined`` while adopting not of the completed switch (a recovery's): slot and vote taken back."""
        st = self.ctx.state
        ours = (
            {j.agent.aid for j in self.claims.completion.joiners.values()}
            if self.claims.completion is not None
            else set()
        )
        for aid, msg in self.joins.items():
            if aid not in ours and st.slots.get(msg.rank) == aid:
                del st.slots[msg.rank]
                st.votes.pop(msg.rank, None)
                st.agents[aid].rank = None

    def _resume_recovery(self) -> None:
        """Redo the recovery under way from its start: joiners still receiving state are cancelled
        (they stay warm), a new abort under a new epoch goes to every live rank, the ranks whose process
        is gone are the new plan's dead. No step was committed during a recovery: it is redone once."""
        st, now = self.ctx.state, time.time()
        workers = self.claims.workers()
        last = max(self.claims.last_step(c) for c in workers.values())  # one step (:meth:`_resume_refusal`)
        st.epoch = max(c.rejoin.epoch for c in self.claims.by_agent.values() if c.rejoin is not None)
        st.epochs = max(st.epochs, st.epoch)
        st.step, st.mode, st.votes = last + 1, Mode.RUNNING, {}
        for c in self.claims.by_agent.values():
            if c.agent.rank is None and c.rejoin is not None and c.rejoin.in_plan:
                c.agent.channel.try_send(Cancel(epoch=c.rejoin.epoch))  # a join cut off: back to warm
        open_restart_event(self.ctx, self.order, self.started_t, now)
        missing = self._fence_missing()
        self.ctx.journal.write(
            "adopted",
            incarnation=self.order.incarnation,
            step=st.step,
            epoch=st.epoch,
            resent_decision=[],
            votes=[],
            missing=missing,
            adopt_s=round(now - self.started_t, 4),
            resumed_recovery=True,
        )
        log.warning(
            "adopted %d agents in the middle of a recovery at step %d: redoing it", len(self.claims.by_agent), st.step
        )
        dead = {r for r in range(self.ctx.layout.world) if not st.rank_alive(r)}
        self.recoveries.fail(dead, "the controller restarted during a recovery", now)
        st.retry_notices = True

    def _roll_back(self, epochs: set[int], now: float) -> None:
        """Cancel the planned switches caught in phase 1 everywhere and notice their ranks again: the
        new controller plans each move afresh, under a new epoch."""
        st = self.ctx.state
        begun = [
            e
            for e in read_journal(self.ctx.rundir.events)
            if e.get("type") == "event_begin" and e.get("kind") == "planned" and e.get("epoch") in epochs
        ]
        for epoch in sorted(epochs):
            for c in self.claims.by_agent.values():
                c.agent.channel.try_send(Cancel(epoch=epoch))
            self.ctx.journal.write("event_cancelled", epoch=epoch)
        again = []
        for e in begun:
            for rank in e.get("ranks", []):
                if isinstance(rank, int) and 0 <= rank < self.ctx.layout.world and rank not in again:
                    again.append(rank)
                    st.pending_notices.append(
                        Notice(
                            kind="maintenance",
                            rank=rank,
                            source="controller",
                            reason=str(e.get("cause") or "planned move"),
                            time=now,
                        )
                    )
        self.ctx.journal.write("plan_rolled_back", epochs=sorted(epochs), noticed_again=again)
        log.warning(
            "planned switch(es) of epoch %s caught in phase 1: cancelled, ranks %s noticed again", sorted(epochs), again
        )

    def _adopt(self) -> None:
        st, now = self.ctx.state, time.time()
        rollback = (self.claims.rollback() or set()) if self.claims.completion is None else set()
        workers = self.claims.workers()
        last, lead = self.claims.lead(workers)
        resent = [r for r, c in sorted(workers.items()) if self.claims.last_step(c) < last]
        if lead is not None:  # held whenever a rank is behind (:meth:`Claims.refusal`)
            for r in resent:
                workers[r].agent.channel.try_send(lead)
        completion = self.claims.completion
        epoch = completion.epoch if completion is not None else rejoin_of(next(iter(workers.values()))).epoch
        st.epoch, st.epochs = epoch, max(st.epochs, epoch)
        complete_log(self.ctx, self.order, lead, [v for c in workers.values() if (v := rejoin_of(c).vote) is not None])
        st.step, st.mode = last + 1, Mode.RUNNING
        arrived = list(st.votes.values())  # sent after a rejoin, while adopting
        st.votes = {}
        for vote in [v for c in workers.values() if (v := rejoin_of(c).vote) is not None] + arrived:
            if vote.step == st.step and vote.epoch == epoch:
                st.votes[vote.rank] = vote
                st.vote_t[vote.rank] = time.monotonic()
        completed = (
            {}
            if self.claims.completion is None
            else adopted_switch.complete(
                self.claims.completion, self.ctx, self.switches, self.joins, self.order.incarnation, now
            )
        )
        open_restart_event(self.ctx, self.order, self.started_t, now)
        missing = self._fence_missing()
        self.ctx.journal.write(
            "adopted",
            incarnation=self.order.incarnation,
            step=st.step,
            epoch=epoch,
            resent_decision=resent,
            votes=sorted(st.votes),
            missing=missing,
            adopt_s=round(now - self.started_t, 4),
            **completed,
        )
        log.warning(
            "adopted %d agents at step %d (decision %d sent again to ranks %s)",
            len(self.claims.by_agent),
            st.step,
            last,
            resent,
        )
        if rollback:
            self._roll_back(rollback, now)
        self.ctx.broadcast(
            Resume(epoch=epoch)
        )  # a rank held by a finished recovery whose resume died with the controller
        dead = {r for r in range(self.ctx.layout.world) if not st.rank_alive(r)} - self._handed_over()
        if dead:
            self.recoveries.fail(dead, "lost with the controller", now)
        else:
            self.commits.maybe_commit()
        st.retry_notices = True

    def _handed_over(self) -> set[int]:
        """The ranks a completed switch is still moving to their joiners: nobody serves them meanwhile."""
        plan = self.ctx.state.plan
        return {m.rank for m in plan.moves if m.joiner in plan.waiting} if isinstance(plan, PlannedSwitch) else set()

    def _fence_missing(self) -> list[str]:
        """Fence the listed processes that never came back; keep expecting standbys still queued."""
        st = self.ctx.state
        missing = sorted(st.expected)
        for kind, ident in missing:
            self.ctx.spawner.fence(kind, ident)
        here = {(a.kind, a.ident) for a in st.agents.values() if a.alive}
        st.expected = {("standby", i) for i in self.ctx.spawner.pending_standbys()} - here - set(missing)
        return [f"{k}{i}" for k, i in missing]

    def _refuse(self, why: str) -> None:
        """Not guessed: the rank processes that came back are stopped (a standby caught joining is
        cancelled back to warm) and every rank restarts from the latest complete checkpoint."""
        st, now = self.ctx.state, time.time()
        log.error("cannot adopt the live agents: %s; restarting every rank from the latest complete checkpoint", why)
        self.ctx.journal.write(
            "adoption_refused",
            incarnation=self.order.incarnation,
            why=why,
            fallback="checkpoint_restart",
            claims={c.agent.aid: (c.rejoin.model_dump() if c.rejoin else None) for c in self.claims.by_agent.values()},
        )
        for c in self.claims.by_agent.values():
            if c.agent.kind == "worker" or c.agent.rank is not None:
                c.agent.expected_exit = True
                self.members.kill(c.agent)
            elif c.rejoin is not None and c.rejoin.in_plan:
                c.agent.channel.try_send(Cancel(epoch=c.rejoin.epoch))
        st.slots.clear()
        self._fence_missing()
        st.epoch, st.votes, st.mode = st.epochs, {}, Mode.RUNNING
        self.recoveries.restarts.restart(
            f"the controller restarted and could not adopt the live agents: {why}",
            [],
            "controller_restart",
            now,
            self.order.died_t,
        )
