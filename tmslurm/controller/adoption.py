"""Re-adopting the live agents after the controller itself was restarted (by its supervisor).

Contract: built by a restarted incarnation only (the supervisor wrote ``adopt.json``: the
incarnation number, when the previous one died, and the (kind, ident) of every worker and standby
process still running). :meth:`Adoption.restore` (called once, before the loop) takes back what the
dead incarnation had committed: the step log (``steps.jsonl``), the completed events (``event``
journal lines), the fired faults, the standbys started and the highest epoch ever handed out
(snapshot and journal), and puts the run in :data:`Mode.ADOPTING`, expecting a hello from exactly
the listed processes. The live agents reconnect with a :class:`~tmslurm.wire.messages.Rejoin`
(:mod:`tmslurm.agent.link`); :meth:`on_hello` records it. :meth:`tick` decides once every listed
process said hello, or ``runtime.controller_lost_s`` after the start (the agents give up then):

- **Adopted** when every rank's slot is claimed once, no claim is inside a plan, every rank is in
  the same epoch, no decision carried a switch or a checkpoint, and the ranks' last decisions are
  at most one step apart. The dead controller had decided a step when any rank received its
  decision, so the ranks that did not get it receive it again (no step applied twice, none lost),
  votes that were waiting count, and the run goes on (``adopted`` in the journal, a
  ``controller_restart`` event whose parts add up to its gap). Listed processes that never came
  back are fenced; a rank among them fails as an unexpected failure (the usual recovery).
- **Refused** otherwise: nothing is guessed. The run ends failed (``adoption_refused``, the
  reason in ``summary.json``) and the agents are told to finish.

Nothing here raises.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field

from tmslurm.controller.commits import Commits
from tmslurm.controller.context import Context
from tmslurm.controller.membership import Membership
from tmslurm.controller.recoveries import Recoveries
from tmslurm.controller.snapshot import read_snapshot, read_steps
from tmslurm.controller.state import Agent, Mode
from tmslurm.wire.messages import Decision, Rejoin
from tmslurm.controller.journal import read_journal

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdoptOrder:
    """What the supervisor tells a restarted controller (``adopt.json``)."""

    incarnation: int
    died_t: float
    alive: list[tuple[str, int]]

    @classmethod
    def parse(cls, text: str) -> "AdoptOrder":
        data = json.loads(text)
        alive = [(str(k), int(i)) for k, i in data["alive"] if k in ("worker", "standby")]
        return cls(int(data["incarnation"]), float(data["died_t"]), alive)


@dataclass
class Claim:
    agent: Agent
    rejoin: Rejoin | None


@dataclass
class Adoption:
    ctx: Context
    members: Membership
    commits: Commits
    recoveries: Recoveries
    order: AdoptOrder
    started_m: float = field(default_factory=time.monotonic)
    started_t: float = field(default_factory=time.time)
    claims: dict[str, Claim] = field(default_factory=dict)
    open: bool = True

    # ---- before the loop ----------------------------------------------------------------------
    def restore(self) -> None:
        st, rd = self.ctx.state, self.ctx.rundir
        snap = read_snapshot(rd.snapshot) or {}
        journal = read_journal(rd.events)
        st.step_log = read_steps(rd.steps)
        st.step = st.step_log[-1]["step"] + 1 if st.step_log else st.start_step
        st.fired = set(snap.get("fired", [])) | {int(e["index"]) for e in journal if e.get("type") == "fault_firing"}
        st.standbys_started = max(int(snap.get("standbys_started", 0)),
                                  1 + max((i for k, i in self.order.alive if k == "standby"), default=-1))
        seen = [int(e["epoch"]) for e in journal if isinstance(e.get("epoch"), int)]
        st.epochs = max([int(snap.get("epochs", 0)), int(snap.get("epoch", 0)), *seen])
        st.epoch = int(snap.get("epoch", 0))
        st.incarnation = int(snap.get("incarnation", 0))
        st.expected = set(self.order.alive)
        st.mode = Mode.ADOPTING
        self.ctx.events.restore([e for e in journal if e.get("type") == "event"],
                                st.step_log[-1]["t_end"] if st.step_log else None)
        self.ctx.journal.write("adopting", incarnation=self.order.incarnation, step=st.step,
                               expected=[f"{k}{i}" for k, i in sorted(st.expected)])
        log.warning("controller incarnation %d: adopting %d live processes at step %d", self.order.incarnation,
                    len(st.expected), st.step)

    # ---- while adopting -----------------------------------------------------------------------
    def on_hello(self, agent: Agent, rejoin: Rejoin | None) -> None:
        if self.open:
            self.claims[agent.aid] = Claim(agent, rejoin)

    def tick(self) -> None:
        if not self.open:
            return
        waiting = self.ctx.state.expected
        if waiting and time.monotonic() - self.started_m < self.ctx.cfg.runtime.controller_lost_s:
            return
        self.open = False
        why = self._refusal()
        if why is None:
            self._adopt()
        else:
            self._refuse(why)

    # ---- the decision -------------------------------------------------------------------------
    def _workers(self) -> dict[int, Claim]:
        return {c.agent.rank: c for c in self.claims.values() if c.agent.rank is not None}

    def _last_step(self, c: Claim) -> int:
        d = c.rejoin.decision if c.rejoin is not None else None
        return d.step if d is not None else self.ctx.state.start_step - 1

    def _refusal(self) -> str | None:
        workers = self._workers()
        if not workers:
            return "no rank came back"
        if any(c.rejoin is None for c in workers.values()):
            return "a rank started by the dead controller had not joined yet (a restart was in flight)"
        if any(c.rejoin.in_plan for c in self.claims.values() if c.rejoin is not None):
            return "a switch or recovery was in flight"
        if len({c.rejoin.epoch for c in workers.values()}) > 1:
            return "the ranks are in different epochs"
        steps = {self._last_step(c) for c in workers.values()}
        if max(steps) - min(steps) > 1:
            return f"the ranks' last decisions are more than one step apart: {sorted(steps)}"
        for c in workers.values():
            d = c.rejoin.decision
            if d is not None and (d.switch is not None or d.checkpoint):
                return "the last decision carried a switch or a checkpoint"
            if self._last_step(c) < max(steps) and (c.rejoin.vote is None or c.rejoin.vote.step != max(steps)):
                return f"rank {c.agent.rank} missed decision {max(steps)} without having voted for it"
        return None

    def _adopt(self) -> None:
        st, now = self.ctx.state, time.time()
        workers = self._workers()
        last = max(self._last_step(c) for c in workers.values())
        lead = next((c.rejoin.decision for c in workers.values() if c.rejoin.decision is not None
                     and c.rejoin.decision.step == last), None)
        resent = [r for r, c in sorted(workers.items()) if self._last_step(c) < last]
        for r in resent:
            workers[r].agent.channel.try_send(lead)
        epoch = next(iter(workers.values())).rejoin.epoch
        st.epoch, st.epochs = epoch, max(st.epochs, epoch)
        self._complete_log(lead, workers, now)
        st.step, st.mode = last + 1, Mode.RUNNING
        arrived = list(st.votes.values())  # sent after a rejoin, while adopting
        st.votes = {}
        for vote in [c.rejoin.vote for c in workers.values() if c.rejoin.vote is not None] + arrived:
            if vote.step == st.step and vote.epoch == epoch:
                st.votes[vote.rank] = vote
                st.vote_t[vote.rank] = time.monotonic()
        self._open_event(now)
        missing = self._fence_missing()
        self.ctx.journal.write("adopted", incarnation=self.order.incarnation, step=st.step, epoch=epoch,
                               resent_decision=resent, votes=sorted(st.votes), missing=missing,
                               adopt_s=round(now - self.started_t, 4))
        log.warning("adopted %d agents at step %d (decision %d sent again to ranks %s)", len(self.claims), st.step,
                    last, resent)
        dead = {r for r in range(self.ctx.layout.world) if not st.rank_alive(r)}
        if dead:
            self.recoveries.fail(dead, "lost with the controller", now)
        else:
            self.commits.maybe_commit()
        st.retry_notices = True

    def _complete_log(self, lead: Decision | None, workers: dict[int, Claim], now: float) -> None:
        """A decided step the dead controller had no time to log gets an entry (its losses are gone)."""
        st = self.ctx.state
        logged = st.step_log[-1]["step"] if st.step_log else st.start_step - 1
        for step in range(logged + 1, lead.step + 1 if lead is not None else 0):
            votes = [c.rejoin.vote for c in workers.values() if c.rejoin.vote is not None and c.rejoin.vote.step == step]
            st.step_log.append({"step": step, "t_end": self.order.died_t, "dt": max((v.dt for v in votes), default=0.0),
                                "loss": None, "epoch": lead.epoch, "restored": True})

    def _open_event(self, now: float) -> None:
        st = self.ctx.state
        last_t = st.step_log[-1]["t_end"] if st.step_log else None
        died, up = self.order.died_t, self.started_t
        self.ctx.events.open_record({
            "kind": "controller_restart", "cause": "the controller process died", "epoch": st.epoch, "ranks": [],
            "node": "", "standby": "", "notice_t": died, "last_commit_t": last_t, "status": "switched",
            "switched_t": now, "target_step": st.step, "incarnation": self.order.incarnation,
            "before_death_s": None if last_t is None else max(0.0, died - last_t),
            "restart_s": max(0.0, up - died), "adopt_s": max(0.0, now - up)})

    def _fence_missing(self) -> list[str]:
        st = self.ctx.state
        missing = sorted(st.expected)
        for kind, ident in missing:
            self.ctx.spawner.fence(kind, ident)
        st.expected.clear()
        return [f"{k}{i}" for k, i in missing]

    def _refuse(self, why: str) -> None:
        st = self.ctx.state
        log.error("cannot adopt the live agents: %s; the run ends", why)
        self.ctx.journal.write("adoption_refused", incarnation=self.order.incarnation, why=why,
                               claims={c.agent.aid: (c.rejoin.model_dump() if c.rejoin else None) for c in self.claims.values()})
        st.failed_reason = f"controller restart: cannot adopt the live agents: {why}"
        st.mode = Mode.FINISHED

