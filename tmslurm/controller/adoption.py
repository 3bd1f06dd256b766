"""Re-adopting the live agents after the controller itself was restarted (by its supervisor).

Contract: built by a restarted incarnation only (the supervisor wrote ``adopt.json``: the
incarnation number, when the previous one died, and the (kind, ident) of every worker and standby
process still running). :meth:`Adoption.restore` (called once, before the loop) takes back what the
dead incarnation had committed: the step log (``steps.jsonl``), the completed events (``event`` journal
lines), the fired faults, the standbys started, the incarnation and the highest epoch ever handed out
(the snapshot, and the journal for what came after it), and puts the run in :data:`Mode.ADOPTING`,
expecting a hello from the listed processes but those its journal found lost. The live agents reconnect
with a :class:`~tmslurm.wire.messages.Rejoin` (:mod:`tmslurm.agent.link`); :meth:`on_hello` records it.
:meth:`tick` decides once every listed process said hello, or ``runtime.controller_lost_s`` after the start:

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

import json
import logging
import time
from dataclasses import dataclass, field

from tmslurm.controller import adopted_switch
from tmslurm.controller.adopted_switch import Claim, Completion
from tmslurm.controller.commits import Commits
from tmslurm.controller.context import Context
from tmslurm.controller.journal import journalled, read_journal
from tmslurm.controller.membership import Membership
from tmslurm.controller.plan_types import PlannedSwitch
from tmslurm.controller.planned_switches import Switches
from tmslurm.controller.recoveries import Recoveries
from tmslurm.controller.snapshot import read_snapshot, read_steps
from tmslurm.controller.state import Agent, Mode, found_gone
from tmslurm.core.notices import Notice
from tmslurm.wire.messages import Cancel, Decision, Joined, Rejoin, Resume

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdoptOrder:
    """What the supervisor tells a restarted controller (``adopt.json``)."""

    incarnation: int
    died_t: float
    alive: list[tuple[str, int]]

    @classmethod
    def parse(cls, text: str) -> AdoptOrder:
        data = json.loads(text)
        alive = [(str(k), int(i)) for k, i in data["alive"] if k in ("worker", "standby")]
        return cls(int(data["incarnation"]), float(data["died_t"]), alive)


@dataclass
class Adoption:
    ctx: Context
    members: Membership
    commits: Commits
    recoveries: Recoveries
    switches: Switches
    order: AdoptOrder
    started_m: float = field(default_factory=time.monotonic)
    started_t: float = field(default_factory=time.time)
    claims: dict[str, Claim] = field(default_factory=dict)
    open: bool = True
    completion: Completion | None = None
    """A planned switch whose decision went out before the death, to complete (:mod:`.adopted_switch`)."""
    joins: dict[str, Joined] = field(default_factory=dict)
    """``joined`` reports that arrived while adopting, by agent id: handled once the switch is taken back."""

    # ---- before the loop ----------------------------------------------------------------------
    def restore(self) -> None:
        st, rd = self.ctx.state, self.ctx.rundir
        snap = read_snapshot(rd.snapshot) or {}
        journal = read_journal(rd.events)
        st.step_log = read_steps(rd.steps)
        st.step = st.step_log[-1]["step"] + 1 if st.step_log else st.start_step
        st.fired = set(snap.get("fired", [])) | set(journalled(journal, ("fault", "fault_firing"), "index"))
        st.standbys_started = max(
            int(snap.get("standbys_started", 0)),
            1 + max((i for k, i in self.order.alive if k == "standby"), default=-1),
        )
        st.epochs = max([int(snap.get("epochs", 0)), int(snap.get("epoch", 0)), *journalled(journal, None, "epoch")])
        st.epoch = int(snap.get("epoch", 0))
        st.incarnation = max([int(snap.get("incarnation", 0)), *journalled(journal, ("restart",), "incarnation")])
        st.expected = set(self.order.alive) - found_gone(journal)  # not waited for: found lost already
        st.mode = Mode.ADOPTING
        self.ctx.events.restore(journal, st.step_log[-1]["t_end"] if st.step_log else None)
        self.ctx.journal.write(
            "adopting",
            incarnation=self.order.incarnation,
            step=st.step,
            expected=[f"{k}{i}" for k, i in sorted(st.expected)],
        )
        log.warning(
            "controller incarnation %d: adopting %d live processes at step %d",
            self.order.incarnation,
            len(st.expected),
            st.step,
        )

    # ---- while adopting -----------------------------------------------------------------------
    def on_hello(self, agent: Agent, rejoin: Rejoin | None) -> None:
        if not self.open:
            return
        self.claims[agent.aid] = Claim(agent, rejoin)
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
        recovering = self._recovering()
        workers = self._workers()
        found = (
            None
            if recovering or self._missing(workers)
            else adopted_switch.find(
                self.claims.values(),
                workers,
                self._last_step,
                self.ctx.layout,
                self.ctx.cfg.runtime.switch_mode == "full",
            )
        )
        if isinstance(found, str):
            self._refuse(found)
            return
        self.completion = found
        self._drop_stray_joins()
        why = self._resume_refusal() if recovering else self._refusal()
        if why is not None:
            self._refuse(why)
        elif recovering:
            self._resume_recovery()
        else:
            self._adopt()

    def _drop_stray_joins(self) -> None:
        """A ``joined`` while adopting not of the completed switch (a recovery's): slot and vote taken back."""
        st = self.ctx.state
        ours = {j.agent.aid for j in self.completion.joiners.values()} if self.completion is not None else set()
        for aid, msg in self.joins.items():
            if aid not in ours and st.slots.get(msg.rank) == aid:
                del st.slots[msg.rank]
                st.votes.pop(msg.rank, None)
                st.agents[aid].rank = None

    # ---- the decision -------------------------------------------------------------------------
    def _workers(self) -> dict[int, Claim]:
        """The claims that serve a slot by what they reported: a fresh worker by its id, a rejoin by its
        rank (not a leaver handing its slot over, nor a joiner that joined while adopting)."""
        return {
            c.agent.rank: c
            for c in self.claims.values()
            if c.agent.rank is not None and (c.rejoin is None or (c.rejoin.rank is not None and not c.rejoin.leaving))
        }

    def _lead(self, workers: dict[int, Claim]) -> tuple[int, Decision | None]:
        """The last step decided and its decision, None when no live process holds it."""
        if self.completion is not None:
            return self.completion.decision.step, self.completion.decision
        last = max(self._last_step(c) for c in workers.values())
        return last, next(
            (
                c.rejoin.decision
                for c in workers.values()
                if c.rejoin.decision is not None and c.rejoin.decision.step == last
            ),
            None,
        )

    def _last_step(self, c: Claim) -> int:
        """The last step decided for this rank: its last decision's, else (a standby that joined and got
        no decision since) the step before the one it computes next, else the run's start."""
        d = c.rejoin.decision if c.rejoin is not None else None
        if d is not None:
            return d.step
        if c.rejoin is not None and c.rejoin.step is not None:
            return c.rejoin.step - 1
        return self.ctx.state.start_step - 1

    def _missing(self, workers: dict[int, Claim]) -> str | None:  # why the ranks back are not enough; None: they are
        if not workers:
            return "no rank came back"
        if any(c.rejoin is None for c in workers.values()):
            return "a rank started by the dead controller had not joined yet (a restart was in flight)"
        return None

    def _refusal(self) -> str | None:
        workers = self._workers()
        if (why := self._missing(workers)) is not None:
            return why
        in_plan = any(c.rejoin.in_plan for c in self.claims.values() if c.rejoin is not None)
        if self.completion is None and in_plan and self._rollback() is None:
            return "a switch or recovery was in flight"
        switched = {self.completion.epoch} if self.completion is not None else set()
        if len({c.rejoin.epoch for c in workers.values()} - switched) > 1:
            return "the ranks are in different epochs"
        last, lead = self._lead(workers)
        steps = {self._last_step(c) for c in workers.values()} | {last}
        if max(steps) - min(steps) > 1:
            return f"the ranks' last decisions are more than one step apart: {sorted(steps)}"
        if len(steps) > 1 and lead is None:
            return f"no rank holds decision {last} to send again"
        for c in workers.values():
            d = c.rejoin.decision
            if d is not None and d.checkpoint:
                return "the last decision carried a checkpoint (a checkpoint-then-restart is not taken over)"
            if self._last_step(c) < last and (c.rejoin.vote is None or c.rejoin.vote.step != last):
                return f"rank {c.agent.rank} missed decision {last} without having voted for it"
        return None

    def _recovering(self) -> bool:
        """A recovery was under way when the controller died: a rank saw an abort newer than its epoch."""
        return any(c.rejoin is not None and c.rejoin.aborting for c in self.claims.values())

    def _resume_refusal(self) -> str | None:
        """Why a recovery caught by the controller's death cannot be redone from the start; None: it can."""
        workers = self._workers()
        if (why := self._missing(workers)) is not None:
            return why
        decisions = [c.rejoin.decision for c in workers.values() if c.rejoin.decision is not None]
        steps = {self._last_step(c) for c in workers.values()}
        if len(steps) > 1:
            return f"a recovery was in flight and the ranks' last decisions differ: {sorted(steps)}"
        if any(d.switch is not None or d.checkpoint for d in decisions):
            return "the last decision carried a switch or a checkpoint"
        if any(c.rejoin is not None and c.rejoin.leaving for c in self.claims.values()):
            return "a recovery was in flight while a rank was handing its slot over in a switch"
        return None

    def _resume_recovery(self) -> None:
        """Redo the recovery under way from its start: joiners still receiving state are cancelled
        (they stay warm), a new abort under a new epoch goes to every live rank, the ranks whose process
        is gone are the new plan's dead. No step was committed during a recovery: it is redone once."""
        st, now = self.ctx.state, time.time()
        workers = self._workers()
        last = max(self._last_step(c) for c in workers.values())  # one step (:meth:`_resume_refusal`)
        st.epoch = max(c.rejoin.epoch for c in self.claims.values() if c.rejoin is not None)
        st.epochs = max(st.epochs, st.epoch)
        st.step, st.mode, st.votes = last + 1, Mode.RUNNING, {}
        for c in self.claims.values():
            if c.agent.rank is None and c.rejoin is not None and c.rejoin.in_plan:
                c.agent.channel.try_send(Cancel(epoch=c.rejoin.epoch))  # a join cut off: back to warm
        self._open_event(now)
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
        log.warning("adopted %d agents in the middle of a recovery at step %d: redoing it", len(self.claims), st.step)
        dead = {r for r in range(self.ctx.layout.world) if not st.rank_alive(r)}
        self.recoveries.fail(dead, "the controller restarted during a recovery", now)
        st.retry_notices = True

    def _rollback(self) -> set[int] | None:
        """The epochs of planned switches caught in phase 1 that can be rolled back: every agent inside
        a plan is inside one only by groups it prepared or a join not yet activated (no abort, no
        applied switch: a decision carrying a switch is refused on its own). None when another plan
        was in flight."""
        epochs: set[int] = set()
        for c in self.claims.values():
            rj = c.rejoin
            if rj is None or not rj.in_plan:
                continue
            if rj.aborting or not rj.prepared:
                return None
            epochs |= set(rj.prepared)
        return epochs

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
            for c in self.claims.values():
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
        rollback = (self._rollback() or set()) if self.completion is None else set()
        workers = self._workers()
        last, lead = self._lead(workers)
        resent = [r for r, c in sorted(workers.items()) if self._last_step(c) < last]
        for r in resent:
            workers[r].agent.channel.try_send(lead)
        epoch = self.completion.epoch if self.completion is not None else next(iter(workers.values())).rejoin.epoch
        st.epoch, st.epochs = epoch, max(st.epochs, epoch)
        self._complete_log(lead, workers, now)
        st.step, st.mode = last + 1, Mode.RUNNING
        arrived = list(st.votes.values())  # sent after a rejoin, while adopting
        st.votes = {}
        for vote in [c.rejoin.vote for c in workers.values() if c.rejoin.vote is not None] + arrived:
            if vote.step == st.step and vote.epoch == epoch:
                st.votes[vote.rank] = vote
                st.vote_t[vote.rank] = time.monotonic()
        completed = (
            {}
            if self.completion is None
            else adopted_switch.complete(
                self.completion, self.ctx, self.switches, self.joins, self.order.incarnation, now
            )
        )
        self._open_event(now)
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
            "adopted %d agents at step %d (decision %d sent again to ranks %s)", len(self.claims), st.step, last, resent
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

    def _complete_log(self, lead: Decision | None, workers: dict[int, Claim], now: float) -> None:
        """A decided step the dead controller had no time to log gets an entry (its losses are gone)."""
        st = self.ctx.state
        logged = st.step_log[-1]["step"] if st.step_log else st.start_step - 1
        for step in range(logged + 1, lead.step + 1 if lead is not None else 0):
            votes = [
                c.rejoin.vote for c in workers.values() if c.rejoin.vote is not None and c.rejoin.vote.step == step
            ]
            st.step_log.append(
                {
                    "step": step,
                    "t_end": self.order.died_t,
                    "dt": max((v.dt for v in votes), default=0.0),
                    "loss": None,
                    "epoch": lead.epoch,
                    "restored": True,
                }
            )

    def _open_event(self, now: float) -> None:
        st = self.ctx.state
        last_t = st.step_log[-1]["t_end"] if st.step_log else None
        died, up = self.order.died_t, self.started_t
        self.ctx.events.open_record(
            {
                "kind": "controller_restart",
                "cause": "the controller process died",
                "epoch": st.epoch,
                "ranks": [],
                "node": "",
                "standby": "",
                "notice_t": died,
                "last_commit_t": last_t,
                "status": "switched",
                "switched_t": now,
                "target_step": st.step,
                "incarnation": self.order.incarnation,
                "before_death_s": None if last_t is None else max(0.0, died - last_t),
                "restart_s": max(0.0, up - died),
                "adopt_s": max(0.0, now - up),
            }
        )

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
            claims={c.agent.aid: (c.rejoin.model_dump() if c.rejoin else None) for c in self.claims.values()},
        )
        for c in self.claims.values():
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
