"""The current plan's lifecycle: finish it when everyone reported, or cancel it.

Contract: :meth:`PlanBook.maybe_finish` closes the current plan once nobody is waited for (and a
planned switch was applied): the event record gets its parts, a recovery's held ranks get
``resume``, the nodes it emptied are handed to the cluster hooks (which answer with a ``released`` queue item), the mode
returns to running and pending notices are retried.
:meth:`PlanBook.cancel` abandons the plan: every participant gets ``cancel`` (joiners go back to
the pool, still warm), the event is marked cancelled and, with ``requeue``, a planned move whose
ranks are still alive becomes a pending notice again. A joiner that had not reported ``joined`` is
remembered in ``state.dropped_joins``: it may have finished before the ``cancel`` reached it, and
its late ``joined`` is then handled by ``Recoveries.late_join``. :meth:`PlanBook.end_of_run` does the
bookkeeping of a cancel when the run ends (a planned move not applied stays a pending notice). None
raises.
"""

from __future__ import annotations

import logging
import time

from tmslurm.controller.context import Context
from tmslurm.controller.items import Released
from tmslurm.controller.membership import Membership
from tmslurm.controller.plan_types import PlannedSwitch, Recovery
from tmslurm.controller.state import Mode
from tmslurm.core.notices import Notice
from tmslurm.wire.messages import Cancel, Resume

log = logging.getLogger(__name__)


class PlanBook:
    def __init__(self, ctx: Context, members: Membership) -> None:
        self.ctx = ctx
        self.state = ctx.state
        self.members = members

    def maybe_finish(self) -> None:
        plan = self.state.plan
        if plan is None or plan.waiting or (isinstance(plan, PlannedSwitch) and not plan.applied):
            return
        plan.times["switched"] = time.time()
        self.ctx.events.switched(plan)
        self.state.plan = None
        emptied = sorted({n for n in str((plan.event or {}).get("node", "")).split(",") if n})
        if isinstance(plan, PlannedSwitch) and (plan.event or {}).get("shadowed"):
            self.state.release_after_check[plan.epoch] = emptied  # the leavers still answer the check there
        else:
            self._release(emptied)
        if isinstance(plan, Recovery):
            for rank in plan.held:  # every transfer is done: the held ranks redo the step now
                self.ctx.send_to(rank, Resume(epoch=plan.epoch))
        self.state.mode = Mode.RUNNING
        self.state.retry_notices = True

    def release_checked(self, epoch: int) -> None:
        """The shadows of switch ``epoch`` were checked: its leavers are done, give their nodes back."""
        self._release(self.state.release_after_check.pop(epoch, []))

    def _release(self, nodes: list[str]) -> None:
        empty = [n for n in nodes if not self.members.ranks_of_node(n)]
        if empty:
            self.ctx.hooks.release_nodes(empty, lambda node: self.ctx.submit(Released(node)))

    def end_of_run(self) -> None:
        """The run ended with a plan in flight: its event is cancelled (no switch, no downtime), and a
        planned move not yet applied leaves its notice pending, so the summary still lists it."""
        plan = self.state.plan
        if plan is None:
            return
        self.ctx.events.cancel(plan)
        if isinstance(plan, PlannedSwitch) and not plan.applied:
            # every rank of the plan, with the notice's own time: the summary reports the notice as it came
            self.state.pending_notices += notices_again(
                plan, plan.ranks, (plan.event or {}).get("notice_t") or time.time()
            )

    def cancel(self, requeue: bool) -> None:
        plan, self.state.plan = self.state.plan, None
        if plan is None:
            return
        for move in plan.moves:
            if move.joiner and self.state.slots.get(move.rank) != move.joiner:
                self.state.dropped_joins[move.joiner] = (plan.epoch, move.rank)  # it may have finished anyway
        for aid in plan.joiners():
            self.ctx.send_to(aid, Cancel(epoch=plan.epoch))
            if aid in self.state.agents:
                self.state.agents[aid].busy = False
        self.ctx.broadcast(Cancel(epoch=plan.epoch))
        self.ctx.events.cancel(plan)
        if requeue and isinstance(plan, PlannedSwitch):
            alive = [r for r in plan.ranks if (a := self.state.agent_of(r)) is not None and a.alive]
            if alive:  # one live rank's notice, from now, plans the move again
                self.state.pending_notices += notices_again(plan, alive[:1], time.time())


def notices_again(plan: PlannedSwitch, ranks: list[int], t: float) -> list[Notice]:
    """Maintenance notices that put ``plan``'s move of ``ranks`` back in the queue (noticed at ``t``)."""
    return [Notice(kind="maintenance", rank=r, source="controller", reason=plan.reason, time=t) for r in ranks]
