"""What the live agents told a restarted controller, and whether it can be taken over as it is.

Contract (pure reads of the claims, on the controller's thread; used by :mod:`tmslurm.controller.adoption`):
a :class:`Claims` holds one :class:`~tmslurm.controller.adopted_switch.Claim` per agent that said
hello while adopting (its :class:`~tmslurm.wire.messages.Rejoin`, None for a process that had not
joined yet) and, once found, the committed planned switch to complete. From them:

- :meth:`Claims.workers`: the claims that serve a slot (not a leaver handing its slot over, nor a
  joiner that joined while adopting); :meth:`Claims.last_step`: the last step decided for one;
  :meth:`Claims.lead`: the last step decided and the decision to send again.
- :meth:`Claims.refusal`: why the ranks cannot be adopted as they are (no rank back, a rank that had
  not joined, a plan in flight that cannot be rolled back, different epochs, last decisions more
  than one step apart or one that carried a checkpoint, a rank that missed the last decision without
  having voted for it); None when they can.
- :meth:`Claims.recovering` / :meth:`Claims.resume_refusal`: a recovery was under way, and why it
  cannot be redone from its start (None: it can).
- :meth:`Claims.rollback`: the epochs of planned switches caught in phase 1 (only groups prepared or
  a join not activated), None when another plan was in flight.
Nothing here changes the run's state or raises (:func:`rejoin_of` asserts what :meth:`Claims.refusal`
checked first: every worker rejoined).
"""

from __future__ import annotations

from tmslurm.controller.adopted_switch import Claim, Completion
from tmslurm.controller.state import RunState
from tmslurm.wire.messages import Decision, Rejoin


def rejoin_of(c: Claim) -> Rejoin:
    """The rejoin of a claim that holds one: every worker's once :meth:`Claims.missing` found none missing."""
    assert c.rejoin is not None, f"{c.agent.aid} had not rejoined"
    return c.rejoin


class Claims:
    def __init__(self, state: RunState) -> None:
        self.state = state
        self.by_agent: dict[str, Claim] = {}
        """Agent id -> what it said in its hello."""
        self.completion: Completion | None = None
        """A planned switch whose decision went out before the death, to complete (:mod:`.adopted_switch`)."""

    def workers(self) -> dict[int, Claim]:
        """The claims that serve a slot by what they reported: a fresh worker by its id, a rejoin by its
        rank (not a leaver handing its slot over, nor a joiner that joined while adopting)."""
        return {
            c.agent.rank: c
            for c in self.by_agent.values()
            if c.agent.rank is not None and (c.rejoin is None or (c.rejoin.rank is not None and not c.rejoin.leaving))
        }

    def lead(self, workers: dict[int, Claim]) -> tuple[int, Decision | None]:
        """The last step decided and its decision, None when no live process holds it."""
        if self.completion is not None:
            return self.completion.decision.step, self.completion.decision
        last = max(self.last_step(c) for c in workers.values())
        return last, next(
            (d for c in workers.values() if (d := rejoin_of(c).decision) is not None and d.step == last), None
        )

    def last_step(self, c: Claim) -> int:
        """The last step decided for this rank: its last decision's, else (a standby that joined and got
        no decision since) the step before the one it computes next, else the run's start."""
        d = c.rejoin.decision if c.rejoin is not None else None
        if d is not None:
            return d.step
        if c.rejoin is not None and c.rejoin.step is not None:
            return c.rejoin.step - 1
        return self.state.start_step - 1

    def missing(self, workers: dict[int, Claim]) -> str | None:
        """Why the ranks back are not enough; None: they are."""
        if not workers:
            return "no rank came back"
        if any(c.rejoin is None for c in workers.values()):
            return "a rank started by the dead controller had not joined yet (a restart was in flight)"
        return None

    def refusal(self) -> str | None:
        workers = self.workers()
        if (why := self.missing(workers)) is not None:
            return why
        in_plan = any(c.rejoin.in_plan for c in self.by_agent.values() if c.rejoin is not None)
        if self.completion is None and in_plan and self.rollback() is None:
            return "a switch or recovery was in flight"
        switched = {self.completion.epoch} if self.completion is not None else set()
        if len({rejoin_of(c).epoch for c in workers.values()} - switched) > 1:
            return "the ranks are in different epochs"
        last, lead = self.lead(workers)
        steps = {self.last_step(c) for c in workers.values()} | {last}
        if max(steps) - min(steps) > 1:
            return f"the ranks' last decisions are more than one step apart: {sorted(steps)}"
        if len(steps) > 1 and lead is None:
            return f"no rank holds decision {last} to send again"
        for c in workers.values():
            rj = rejoin_of(c)
            if rj.decision is not None and rj.decision.checkpoint:
                return "the last decision carried a checkpoint (a checkpoint-then-restart is not taken over)"
            if self.last_step(c) < last and (rj.vote is None or rj.vote.step != last):
                return f"rank {c.agent.rank} missed decision {last} without having voted for it"
        return None

    def recovering(self) -> bool:
        """A recovery was under way when the controller died: a rank saw an abort newer than its epoch."""
        return any(c.rejoin is not None and c.rejoin.aborting for c in self.by_agent.values())

    def resume_refusal(self) -> str | None:
        """Why a recovery caught by the controller's death cannot be redone from the start; None: it can."""
        workers = self.workers()
        if (why := self.missing(workers)) is not None:
            return why
        decisions = [d for c in workers.values() if (d := rejoin_of(c).decision) is not None]
        steps = {self.last_step(c) for c in workers.values()}
        if len(steps) > 1:
            return f"a recovery was in flight and the ranks' last decisions differ: {sorted(steps)}"
        if any(d.switch is not None or d.checkpoint for d in decisions):
            return "the last decision carried a switch or a checkpoint"
        if any(c.rejoin is not None and c.rejoin.leaving for c in self.by_agent.values()):
            return "a recovery was in flight while a rank was handing its slot over in a switch"
        return None

    def rollback(self) -> set[int] | None:
        """The epochs of planned switches caught in phase 1 that can be rolled back: every agent inside
        a plan is inside one only by groups it prepared or a join not yet activated (no abort, no
        applied switch: a decision carrying a switch is refused on its own). None when another plan
        was in flight."""
        epochs: set[int] = set()
        for c in self.by_agent.values():
            rj = c.rejoin
            if rj is None or not rj.in_plan:
                continue
            if rj.aborting or not rj.prepared:
                return None
            epochs |= set(rj.prepared)
        return epochs
