"""The controller's dispatch: every queue item to its handler by its type, every agent message too.

Contract (on the controller's thread, called by :meth:`tmslurm.controller.loop.Controller.handle`):
- An item goes to its handler by its type (``item_handlers``, one per class of
  :mod:`tmslurm.controller.items`; a gate's :class:`~tmslurm.controller.items.Batch`: each of its
  items), an agent's message by the message's type (``handlers``); a node monitor's hello, messages
  and disconnect go to the node watch. A message of a type no agent sends (a monitor's, from a worker
  or standby) changes nothing (``message_refused``); one from an agent that is gone is dropped.
- Items reach the queue already authenticated and validated (:mod:`tmslurm.controller.gate`); a
  handler that still fails is journalled (``handler_error``) and the run goes on (a failing
  request is answered with an ``error``). Nothing here raises.
- While a restarted controller adopts (:mod:`tmslurm.controller.adoption`), hellos are its claims
  and a ``joined`` goes to it; after each item a pending notice is retried when a plan ending or a
  standby warming asked for it (``RunState.retry_notices``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from tmslurm.controller.adoption import Adoption
from tmslurm.controller.commits import Commits
from tmslurm.controller.context import Context
from tmslurm.controller.intake import Intake
from tmslurm.controller.items import (
    Batch,
    Disconnected,
    FaultAt,
    HelloIn,
    Item,
    MessageIn,
    NoticeIn,
    Released,
    RequestIn,
    VotesIn,
)
from tmslurm.controller.membership import Membership
from tmslurm.controller.monitors import NodeMonitors
from tmslurm.controller.planned_switches import Switches
from tmslurm.controller.recoveries import Recoveries
from tmslurm.controller.restarts import Restarts
from tmslurm.controller.state import Agent, Mode
from tmslurm.wire import messages as m

log = logging.getLogger(__name__)


class Dispatch:
    def __init__(
        self,
        ctx: Context,
        members: Membership,
        commits: Commits,
        switches: Switches,
        recoveries: Recoveries,
        restarts: Restarts,
        intake: Intake,
        monitors: NodeMonitors,
        adoption: Adoption | None,
    ) -> None:
        self.ctx = ctx
        self.state = ctx.state
        self.members = members
        self.commits = commits
        self.switches = switches
        self.recoveries = recoveries
        self.restarts = restarts
        self.intake = intake
        self.monitors = monitors
        self.adoption = adoption
        """Set in a restarted controller: hellos and ``joined`` reports go to it while it adopts."""
        self.handlers: dict[type, Callable[[Agent, Any], None]] = {
            m.Vote: self.commits.on_vote,
            m.Progress: self.commits.on_progress,
            m.Groups: self.commits.on_groups,
            m.Prepared: self.switches.on_prepared,
            m.ShadowReady: self.switches.on_shadow_ready,
            m.ShadowChecked: self.switches.on_shadow_checked,
            m.Switched: self.switches.on_switched,
            m.Left: self.switches.on_left,
            m.Joined: self._on_joined,
            m.JoinFailed: self.switches.on_join_failed,
            m.Aborted: self.recoveries.on_aborted,
            m.Recovered: self.recoveries.on_recovered,
            m.CommErrorReport: self.recoveries.on_comm_error,
            m.FaultFired: self.recoveries.on_fault,
            m.Started: self._on_started,
            m.Ready: self._on_ready,
            m.Done: self._on_done,
        }
        self.item_handlers: dict[type, Callable[[Any], None]] = {
            HelloIn: self._on_hello,
            RequestIn: self._on_request,
            MessageIn: self._on_message,
            Disconnected: self._on_disconnect,
            VotesIn: self._on_votes,
            NoticeIn: self._on_notice,
            FaultAt: self._on_fault_at,
            Released: self._on_released,
            Batch: self._on_batch,
        }
        """Queue item type -> its handler (:mod:`tmslurm.controller.items`), as ``handlers`` is for messages."""

    def handle(self, item: Item) -> None:
        """Handle one queue item (a gate's :class:`Batch`: each of its items); a failing handler is
        journalled, never raised."""
        try:
            self.item_handlers[type(item)](item)
        except Exception as exc:  # a bug must not end the run: journal it loudly and go on
            log.exception("controller handler for %s failed", item.label)
            self.ctx.journal.write("handler_error", item=item.label, error=repr(exc)[:300])
            if isinstance(item, RequestIn):
                item.ch.try_send(m.ErrorReply(error=f"internal error: {exc!r}"[:300]))
                item.ch.close()
        if self.state.retry_notices:
            self.intake.retry_pending()

    # ---- one handler per kind of queue item (:mod:`tmslurm.controller.items`) ----------------------
    def _on_batch(self, item: Batch) -> None:
        for one in item.items:
            self.handle(one)

    def _on_hello(self, item: HelloIn) -> None:
        if item.hello.kind == "monitor":
            self.monitors.hello(item.hello, item.conn, item.ch)
            return
        agent = self.members.hello(item.hello, item.conn, item.ch)
        if agent is not None:
            self.monitors.watch(agent)
            if self.adoption is not None:
                self.adoption.on_hello(agent, item.hello.rejoin)

    def _on_message(self, item: MessageIn) -> None:
        if self.monitors.owns(item.conn):
            self.monitors.on_msg(item.conn, item.msg)
            return
        agent = self.members.agent_of_conn(item.conn)
        if agent is None or not agent.alive:
            return
        handler = self.handlers.get(type(item.msg))
        if handler is None:  # a monitor's message (exited, probed, ...) from a worker or standby: changes nothing
            self.ctx.journal.write("message_refused", agent=agent.aid, msg=str(_type_of(item.msg))[:40])
            return
        handler(agent, item.msg)

    def _on_disconnect(self, item: Disconnected) -> None:
        if self.monitors.owns(item.conn):
            self.monitors.disconnect(item.conn)
        else:
            self.recoveries.disconnect(self.members.agent_of_conn(item.conn))

    def _on_votes(self, item: VotesIn) -> None:
        """A node relay's votes, for its agents' connections (0: refused)."""
        agents = [self.members.agent_of_conn(c) if c else None for c in item.conns]
        now_m = time.monotonic()
        for agent in agents:  # a vote is a line from its agent: it proves it alive
            if agent is not None:
                agent.last_seen = now_m
        self.commits.on_node_votes(agents, item.votes)

    def _on_request(self, item: RequestIn) -> None:
        self.intake.request(item.request, item.ch)

    def _on_notice(self, item: NoticeIn) -> None:
        self.intake.notice(item.notice)

    def _on_fault_at(self, item: FaultAt) -> None:
        self.recoveries.on_cluster_fault(item.fault, item.nodes, item.t)

    def _on_released(self, item: Released) -> None:
        """The cluster hooks gave a node back, off this thread."""
        self.ctx.journal.write("node_released", node=item.node)

    def _on_started(self, agent: Agent, msg: m.Started) -> None:
        agent.starting = False
        self.restarts.on_started(msg)

    def _on_ready(self, agent: Agent, msg: m.Ready) -> None:
        agent.starting = False
        agent.roles[msg.role] = msg.model_dump(exclude={"type"})
        self.ctx.journal.write(
            "standby_ready",
            agent=agent.aid,
            node=agent.node,
            **agent.roles[msg.role],
            largest_rank_peak_rss_mb=self.commits.largest_rank_rss(),
        )
        self.commits.maybe_commit()
        self.state.retry_notices = True

    def _on_joined(self, agent: Agent, msg: m.Joined) -> None:
        if self.adoption is not None and self.adoption.open:  # a switch the adoption may take back
            self.adoption.on_joined(agent, msg)
        else:
            self.switches.on_joined(agent, msg)

    def _on_done(self, agent: Agent, msg: m.Done) -> None:
        if self.state.owns_slot(agent, msg.rank):
            self.state.done[msg.rank] = msg
            if len(self.state.done) >= self.ctx.layout.world:
                self.state.mode = Mode.FINISHED


def _type_of(msg: m.Msg) -> Any:
    """A message's ``type`` tag (every message class declares one; the base class does not)."""
    return type(msg).model_fields["type"].default
