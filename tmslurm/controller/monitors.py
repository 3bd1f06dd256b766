"""Node monitors on the controller's side: sub-second detection of a node that went dark.

Contract (on the controller's thread, except :meth:`NodeMonitors.touch`, called by the gate's reader
thread, which only stamps a time):
- A ``monitor`` hello is accepted for any node that has no live monitor (a second one is refused
  with an error); the monitor is told (``watch``) the pid of every live worker and standby on its
  node, now and whenever one says hello later.
- ``exited`` from a monitor about an agent on the monitor's own node with that pid ends that agent
  as a process exit (detected even when no socket closed); ``stopped`` (it stayed SIGSTOPped for
  ``detect.node_timeout_s``) fences it and handles it as lost (cause ``stopped``, journal ``hung``
  with ``source: monitor``); anything else is journalled and ignored.
- :meth:`tick`: a node whose monitor *and* every tmslurm process on it were silent for
  ``detect.node_timeout_s``, while some other node was heard within half of it (so a stall of
  the controller itself never looks like a dead node), is lost: its processes are fenced and its
  ranks fail at once, with the cause ``node lost`` and the silence in the journal (``node_lost``).
  A lone node, or a monitor silent while its node's processes talk, is left to the per-process
  heartbeat timeout.
- A monitor that disconnects or goes silent alone is dropped (``monitor_gone``); its node falls
  back to heartbeats. Monitors get a ``beat`` every ``runtime.controller_lost_s`` / 5 (they get no
  decisions) and ``finish`` at the end like every agent.
- With link probes on, a monitor's ``sink`` and ``probed`` go to :class:`LinkProbes`, every
  :meth:`tick` lets it start a round among the live monitors, and a dropped monitor's node is
  forgotten there. Nothing here raises.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from tmslurm.controller.context import Context
from tmslurm.controller.linkwatch import LinkProbes
from tmslurm.controller.membership import Membership
from tmslurm.controller.recoveries import Recoveries
from tmslurm.controller.state import Agent, Mode
from tmslurm.core.config import to_dict
from tmslurm.wire.messages import (
    Address,
    Beat,
    ErrorReply,
    Exited,
    Finish,
    Hello,
    Probed,
    SinkAt,
    Stopped,
    Watch,
    Welcome,
)
from tmslurm.wire.protocol import LineChannel

log = logging.getLogger(__name__)


@dataclass
class NodeMonitor:
    node: str
    pid: int
    """As reported: for logs only, never signalled."""
    channel: LineChannel
    last_seen: float
    alive: bool = True


class NodeMonitors:
    def __init__(
        self, ctx: Context, members: Membership, recoveries: Recoveries, links: LinkProbes | None = None
    ) -> None:
        self.ctx = ctx
        self.links = links
        """Link probes between the monitors (``gray.evict`` with ``gray.link_probe_s`` > 0); None: off."""
        self.state = ctx.state
        self.members = members
        self.recoveries = recoveries
        self.monitors: dict[int, NodeMonitor] = {}  # by connection number
        self.last_beat_m = 0.0

    # ---- the gate's items ---------------------------------------------------------------------
    def owns(self, conn: int) -> bool:
        return conn in self.monitors

    def touch(self, conn: int) -> None:
        mon = self.monitors.get(conn)
        if mon is not None:
            mon.last_seen = time.monotonic()

    def hello(self, msg: Hello, conn: int, ch: LineChannel) -> None:
        if msg.rejoin is not None and self.state.mode is not Mode.ADOPTING:
            ch.try_send(ErrorReply(error="refused: this controller did not restart; there is nothing to rejoin"))
            ch.close()
            self.ctx.journal.write(
                "hello_refused",
                kind="monitor",
                node=msg.node,
                reported_pid=msg.pid,
                why="a rejoin, but this controller did not restart",
            )
            return
        if self.monitor_of(msg.node) is not None:
            ch.try_send(ErrorReply(error=f"refused: node {msg.node!r} already has a live monitor"))
            ch.close()
            self.ctx.journal.write("hello_refused", kind="monitor", node=msg.node, reported_pid=msg.pid)
            return
        self.monitors[conn] = NodeMonitor(msg.node, msg.pid, ch, time.monotonic())
        ch.try_send(
            Welcome(
                config=to_dict(self.ctx.cfg),
                epoch=self.state.epoch,
                generation=self.state.epoch,
                resume_step=self.state.resume_step,
                faults=[],
                address=Address.model_validate(self.members.address),
            )
        )
        self.ctx.journal.write("monitor_up", node=msg.node, pid=msg.pid)
        for agent in self._agents_on(msg.node):
            ch.try_send(Watch(agent=agent.aid, pid=agent.pid))

    def watch(self, agent: Agent) -> None:
        """A worker or standby said hello: its node's monitor watches its process."""
        mon = self.monitor_of(agent.node)
        if mon is not None:
            mon.channel.try_send(Watch(agent=agent.aid, pid=agent.pid))

    def on_msg(self, conn: int, msg: object) -> None:
        mon = self.monitors[conn]
        if mon.alive and self.links is not None and isinstance(msg, (SinkAt, Probed)):
            return self.links.sink_at(mon.node, msg) if isinstance(msg, SinkAt) else self.links.probed(mon.node, msg)
        if not mon.alive or not isinstance(msg, (Exited, Stopped)):
            return
        agent = self.state.agents.get(msg.agent)
        if agent is None or agent.node != mon.node or agent.pid != msg.pid:
            self.ctx.journal.write(
                "exited_ignored" if isinstance(msg, Exited) else "stopped_ignored",
                node=mon.node,
                agent=msg.agent[:100],
                pid=msg.pid,
            )
            return
        if not agent.alive or agent.expected_exit:
            return
        if isinstance(msg, Exited):
            self.ctx.journal.write("process_exit", agent=agent.aid, node=agent.node, source="monitor")
            agent.channel.close()
            self.recoveries.disconnect(agent)
            return
        log.warning("%s stopped for %.2fs (its node's monitor): fencing it", agent.aid, msg.stopped_s)
        self.ctx.journal.write("hung", agent=agent.aid, node=agent.node, source="monitor", stopped_s=msg.stopped_s)
        self.members.kill(agent)
        self.recoveries.lost(agent, "stopped")

    def disconnect(self, conn: int) -> None:
        mon = self.monitors[conn]
        if mon.alive:
            self._drop(mon, "disconnected")

    # ---- deadlines ----------------------------------------------------------------------------
    def tick(self, now_m: float | None = None) -> None:
        now_m = time.monotonic() if now_m is None else now_m
        limit = self.ctx.cfg.detect.node_timeout_s
        self._beat(now_m)
        if self.state.mode.ending:
            return
        for mon in [m for m in self.monitors.values() if m.alive and now_m - m.last_seen > limit]:
            agents = self._agents_on(mon.node)
            if any(now_m - a.last_seen <= limit for a in agents):
                if now_m - mon.last_seen > self.ctx.cfg.detect.heartbeat_timeout_s:
                    self._drop(mon, "silent while its node's processes talk")
                continue
            if not agents:
                continue
            if now_m - self._freshest_elsewhere(mon.node) > limit / 2:
                continue  # nobody else heard either: the controller stalled, not the node
            self._node_lost(mon, agents, now_m - mon.last_seen)
        if self.links is not None:
            self.links.tick(now_m, {m.node: m.channel for m in self.monitors.values() if m.alive})

    def _beat(self, now_m: float) -> None:
        """Monitors get no decisions: the beat is all that tells them their controller lives."""
        if now_m - self.last_beat_m < self.ctx.cfg.runtime.controller_lost_s / 5:
            return
        self.last_beat_m = now_m
        for mon in self.monitors.values():
            if mon.alive:
                mon.channel.try_send(Beat())

    def _node_lost(self, mon: NodeMonitor, agents: list[Agent], silent_s: float) -> None:
        now = time.time()
        log.warning("node %s lost: its monitor and %d processes silent for %.2fs", mon.node, len(agents), silent_s)
        self.ctx.journal.write(
            "node_lost", node=mon.node, silent_s=round(silent_s, 4), source="monitor", agents=[a.aid for a in agents]
        )
        self._drop(mon, "node lost")
        self.ctx.hooks.node_lost(mon.node)  # before any restart picks a node for its ranks
        ranks = []
        for agent in agents:
            self.members.kill(agent)
            if agent.rank is not None and self.state.owns_slot(agent, agent.rank):
                ranks.append(agent.rank)
            else:
                self.recoveries.lost(agent, "node lost")
        if ranks:
            failure_t = min((self.state.fault_t.pop(r) for r in ranks if r in self.state.fault_t), default=None)
            self.recoveries.fail(set(ranks), f"node {mon.node} lost (monitor silent {silent_s:.2f}s)", now, failure_t)

    # ---- helpers ------------------------------------------------------------------------------
    def monitor_of(self, node: str) -> NodeMonitor | None:
        return next((m for m in self.monitors.values() if m.alive and m.node == node), None)

    def _agents_on(self, node: str) -> list[Agent]:
        return [a for a in self.state.agents.values() if a.alive and not a.expected_exit and a.node == node]

    def _freshest_elsewhere(self, node: str) -> float:
        seen = [a.last_seen for a in self.state.agents.values() if a.alive and a.node != node]
        seen += [m.last_seen for m in self.monitors.values() if m.alive and m.node != node]
        return max(seen, default=float("-inf"))

    def _drop(self, mon: NodeMonitor, why: str) -> None:
        mon.alive = False
        mon.channel.close()
        if self.links is not None:
            self.links.forget(mon.node)
        self.ctx.journal.write("monitor_gone", node=mon.node, why=why)

    def finish(self) -> None:
        for mon in self.monitors.values():
            if mon.alive:
                mon.channel.try_send(Finish())
