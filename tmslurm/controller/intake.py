"""Event intake: notices (watcher, admin, strigger, injected faults) and one-shot requests.

Contract (on the controller's thread):
- :meth:`Intake.notice` maps a notice to the ranks it concerns (its rank, or the ranks on its
  node). A notice for the batch host is diverted to checkpoint-and-requeue; one for a node drops
  the idle standbys there (its ranks, if any, move elsewhere); a Slurm ``failure`` whose ranks still heartbeat
  is journalled and ignored (Slurm lost the node's daemon, not the ranks); a ``failure`` fails
  the ranks; a ``maintenance`` starts a planned switch, or waits when a plan is in progress.
- :meth:`Intake.request` answers ``status``, ``stop`` and ``notice`` requests (already
  authenticated and validated by the gate). A ``stop`` makes the next commit the last one, with a
  checkpoint (a run stopped so resumes exactly with ``train.resume_from``). A notice for an unknown node or rank gets an
  ``error`` naming the valid ones. The requester's connection is always closed.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from tmslurm.controller.context import Context
from tmslurm.controller.membership import Membership
from tmslurm.controller.planned_switches import Switches
from tmslurm.controller.recoveries import Recoveries
from tmslurm.controller.restarts import Restarts
from tmslurm.controller.state import Mode
from tmslurm.core.notices import Notice
from tmslurm.wire.messages import ErrorReply, NoticeRequest, OkReply, StatusReply, StatusRequest, StopRequest
from tmslurm.wire.protocol import LineChannel

log = logging.getLogger(__name__)


class Intake:
    def __init__(
        self,
        ctx: Context,
        members: Membership,
        switches: Switches,
        recoveries: Recoveries,
        restarts: Restarts,
        status: Callable[[], dict[str, Any]],
    ) -> None:
        self.ctx = ctx
        self.state = ctx.state
        self.members = members
        self.switches = switches
        self.recoveries = recoveries
        self.restarts = restarts
        self.status = status

    def notice(self, notice: Notice) -> None:
        if self.ctx.hooks.is_batch_host(notice.node) and notice.planned and notice.node is not None:
            self.ctx.journal.write("notice", **dataclasses.asdict(notice), handled="batch host")
            self.restarts.checkpoint_and_requeue(notice.node, notice.reason)
            return
        ranks = [notice.rank] if notice.rank is not None else self.members.ranks_of_node(notice.node or "")
        if not ranks:
            self._standby_notice(notice)
            return
        self.ctx.journal.write("notice", **dataclasses.asdict(notice), ranks=ranks)
        if not notice.planned and notice.source == "slurm" and self.members.heartbeating(ranks):
            log.warning(
                "Slurm reports %s %s but its ranks %s are alive: not a failure of the run",
                notice.node,
                notice.reason,
                ranks,
            )
            self.ctx.journal.write("slurm_failure_not_confirmed", node=notice.node, ranks=ranks)
            return
        if notice.rank is None and notice.node:  # the node leaves: its standbys must not take its ranks
            self._retire_standbys_on(notice, busy_too=False)
        if not notice.planned:
            self.recoveries.fail(set(ranks), f"notice: {notice.reason}".strip(), detect_t=time.time())
        elif self.state.mode is Mode.RUNNING and self.state.plan is None:
            self.switches.start(ranks, notice)
        else:
            self.state.pending_notices.append(notice)

    def retry_pending(self) -> None:
        """Called by the loop when a plan ended or a standby warmed up."""
        st = self.state
        st.retry_notices = False
        if st.pending_notices and st.plan is None and st.mode is Mode.RUNNING:
            self.notice(st.pending_notices.pop(0))

    def _standby_notice(self, notice: Notice) -> None:
        self._retire_standbys_on(notice, busy_too=True)
        if not any(a.node == notice.node for a in self.state.agents.values()):
            self.ctx.journal.write("notice_ignored", node=notice.node, why="no rank or standby of this run there")

    def _retire_standbys_on(self, notice: Notice, busy_too: bool) -> None:
        """Let go of the idle standbys on the notice's node and ask for others (``standby.replenish``).
        A node that hosts ranks and standbys (a restart placed a rank on a spare's node) must not have
        its ranks moved to a standby on the same node. A busy one (joining a plan) is kept unless
        ``busy_too``: the notice waits for that plan, and then finds it a rank or idle."""
        gone = [
            a
            for a in self.state.agents.values()
            if a.idle_standby and a.node == notice.node and (busy_too or not a.busy)
        ]
        for a in gone:
            self.ctx.journal.write("standby_lost", agent=a.aid, reason=notice.reason or notice.kind)
            self.members.kill(a)
        if gone:
            self.members.replenish()

    def request(self, msg: NoticeRequest | StatusRequest | StopRequest, ch: LineChannel) -> None:
        try:
            if isinstance(msg, NoticeRequest):
                ch.try_send(self._notice_request(msg))
            elif isinstance(msg, StatusRequest):
                ch.try_send(StatusReply(status=self.status()))
            elif isinstance(msg, StopRequest):  # checkpointed with the final commit (Commits.commit)
                self.state.stop_requested = self.state.stop_checkpoint = True
                self.ctx.journal.write("stop_requested", step=self.state.step)
                log.warning("stop requested: checkpoint at the next step boundary, then end the run")
                ch.try_send(OkReply(stopping_after_step=self.state.step))
        finally:
            ch.close()

    def _notice_request(self, msg: NoticeRequest) -> OkReply | ErrorReply:
        nodes = self.members.nodes()
        if msg.rank is None and msg.node not in nodes:
            return ErrorReply(error=f"unknown node {msg.node!r}; this run uses: {', '.join(sorted(nodes))}")
        if msg.rank is not None and msg.rank >= self.ctx.layout.world:
            return ErrorReply(error=f"unknown rank {msg.rank!r}; valid: 0..{self.ctx.layout.world - 1}")
        notice = Notice(
            kind=msg.event,
            node=msg.node,
            rank=msg.rank,
            source=msg.source,
            reason=msg.reason,
            deadline=msg.deadline,
            time=time.time(),
        )
        self.notice(notice)
        return OkReply(accepted=dataclasses.asdict(notice))
