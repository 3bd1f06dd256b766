"""Membership: which process serves which slot, the warm pool, spawning and fencing.

Contract:
- :meth:`Membership.hello` admits only a process this controller spawned and still waits for
  (``state.expected``), and a ``rejoin`` only while a restarted controller adopts; anything else
  (an impostor, a late duplicate, a fenced process reconnecting) is refused and journalled
  (``hello_refused``) and gets no slot. A worker takes its rank's slot; a standby joins the pool.
- :meth:`Membership.kill` fences an agent through the spawner's own handle for it (its process, or
  its Slurm step / spare job), never by a pid a client reported, and closes its connection.
- The pool queries (:meth:`warm_pool`, :meth:`standby_nodes`, :meth:`nodes`,
  :meth:`ranks_of_node`) read the state and never fail. :meth:`replenish` keeps
  ``standby.count`` standbys per node alive or starting (``standby.replenish``; unset: on Slurm only).
"""

from __future__ import annotations

import logging
import time

from tmslurm.controller.context import Context
from tmslurm.controller.state import Agent, Mode, agent_id
from tmslurm.core.config import to_dict
from tmslurm.wire.messages import Address, ErrorReply, Hello, Welcome
from tmslurm.wire.protocol import LineChannel

log = logging.getLogger(__name__)


class Membership:
    def __init__(self, ctx: Context, address: dict[str, object]) -> None:
        self.ctx = ctx
        self.state = ctx.state
        self.address = address
        cfg = ctx.cfg
        self.standby_target = cfg.standby.count * cfg.parallel.ranks_per_node
        self.replenishing = cfg.cluster == "slurm" if cfg.standby.replenish is None else cfg.standby.replenish

    # ---- connections --------------------------------------------------------------------------
    def hello(self, msg: Hello, conn: int, ch: LineChannel) -> Agent | None:
        if msg.rejoin is not None and self.state.mode is not Mode.ADOPTING:
            # only a restarted controller takes agents back; this one closed the connection itself (a fence)
            self.ctx.journal.write(
                "hello_refused",
                kind=msg.kind,
                id=msg.id,
                node=msg.node,
                reported_pid=msg.pid,
                why="a rejoin, but this controller did not restart",
            )
            ch.try_send(ErrorReply(error="refused: this controller did not restart; there is nothing to rejoin"))
            ch.close()
            return None
        if (msg.kind, msg.id) not in self.state.expected:
            self.ctx.journal.write("hello_refused", kind=msg.kind, id=msg.id, node=msg.node, reported_pid=msg.pid)
            ch.try_send(ErrorReply(error=f"refused: no {msg.kind} {msg.id} is expected by this run"))
            ch.close()
            return None
        rank = self._claimed_rank(msg)
        if rank == -1:
            self.ctx.journal.write(
                "hello_refused",
                kind=msg.kind,
                id=msg.id,
                node=msg.node,
                reported_pid=msg.pid,
                why="rejoin claims a slot it cannot hold",
            )
            claimed = msg.rejoin.rank if msg.rejoin is not None else None  # -1 comes only with a rejoin
            ch.try_send(ErrorReply(error=f"refused: {msg.kind} {msg.id} cannot rejoin as rank {claimed}"))
            ch.close()
            return None
        self.state.expected.discard((msg.kind, msg.id))
        agent = Agent(
            agent_id(msg.kind, msg.id, msg.pid, conn),
            msg.kind,
            msg.id,
            msg.pid,
            msg.node,
            ch,
            time.monotonic(),
            host=msg.host,
            starting=msg.rejoin is None,
        )
        self.state.agents[agent.aid] = agent
        self.state.conn_agent[conn] = agent.aid
        if rank is not None:
            agent.rank = rank
            self.state.slots[rank] = agent.aid
        faults = [
            f for f in self.ctx.pending_faults() if msg.kind == "worker" and msg.id in f.ranks and f.when != "join"
        ]  # a join fault is the joining standby's: it comes with its join
        ch.try_send(
            Welcome(
                config=to_dict(self.ctx.cfg),
                epoch=self.state.epoch,
                generation=self.state.epoch,
                resume_step=self.state.resume_step,
                faults=faults,
                address=Address.model_validate(self.address),
            )
        )
        self.ctx.journal.write("agent_up", agent=agent.aid, node=agent.node, pid=agent.pid)
        return agent

    def _claimed_rank(self, msg: Hello) -> int | None:
        """The slot this hello takes: a worker's own rank, or the one a rejoining joined standby serves;
        -1 when a rejoin claims a slot that is not its to take (another rank, an out-of-range or held one).
        A process whose last decision moved its slot to a joiner takes none: it only hands over and exits."""
        if msg.rejoin is not None and msg.rejoin.leaving:
            return None
        if msg.rejoin is None or msg.rejoin.rank is None:
            return msg.id if msg.kind == "worker" else None
        rank = msg.rejoin.rank
        if (msg.kind == "worker" and rank != msg.id) or rank >= self.ctx.layout.world or self.state.rank_alive(rank):
            return -1
        return rank

    def agent_of_conn(self, conn: int) -> Agent | None:
        return self.state.agents.get(self.state.conn_agent.get(conn, ""))

    def touch(self, conn: int) -> None:
        agent = self.agent_of_conn(conn)
        if agent is not None:
            agent.last_seen = time.monotonic()

    # ---- processes ----------------------------------------------------------------------------
    def spawn_worker(self, rank: int, incarnation: int) -> bool:
        self.state.expected.add(("worker", rank))
        return self.ctx.spawner.spawn_worker(rank, incarnation)

    def spawn_standby(self) -> None:
        index = self.state.standbys_started
        self.state.expected.add(("standby", index))
        self.state.standbys_started += 1
        self.ctx.spawner.spawn_standby(index)

    def replenish(self) -> None:
        if not self.replenishing or self.state.mode.ending:
            return
        pool = [a for a in self.state.standbys() if a.idle_standby and a.aid not in self.state.retiring]
        starting = sum(1 for kind, _ in self.state.expected if kind == "standby")  # spawned, not connected yet
        for _ in range(self.standby_target - len(pool) - starting):
            self.spawn_standby()

    def kill(self, agent: Agent) -> None:
        agent.alive = False
        self.ctx.spawner.fence(agent.kind, agent.ident)  # our own handle: never a pid a client reported
        agent.channel.close()

    def fence_rank(self, rank: int, cause: str) -> None:
        agent = self.state.agent_of(rank)
        if agent is not None and agent.alive:
            self.kill(agent)
            self.ctx.journal.write("fenced", agent=agent.aid, rank=rank, node=agent.node, cause=cause)

    # ---- queries ------------------------------------------------------------------------------
    def warm_pool(self) -> dict[str, set[str]]:
        return {a.aid: set(a.roles) for a in self.state.agents.values() if a.idle_standby and not a.busy and a.roles}

    def any_idle_standby(self) -> bool:
        return any(a.idle_standby and not a.busy for a in self.state.agents.values())

    def standby_nodes(self) -> dict[str, str]:
        return {a.aid: a.node for a in self.state.standbys()}

    def nodes(self) -> dict[str, str]:
        out = {self.state.agents[aid].node: "main" for aid in self.state.slots.values() if aid in self.state.agents}
        out.update({a.node: "spare" for a in self.state.agents.values() if a.idle_standby})
        return out

    def ranks_of_node(self, node: str) -> list[int]:
        agents = {r: self.state.agent_of(r) for r in self.state.slots}
        return sorted(r for r, a in agents.items() if a is not None and a.alive and a.node == node)

    def heartbeating(self, ranks: list[int]) -> bool:
        fresh = 3 * self.ctx.cfg.detect.heartbeat_interval_s if self.ctx.cfg.bench.heartbeats else 0.0
        now = time.monotonic()
        agents = [self.state.agent_of(r) for r in ranks]
        return bool(agents) and all(a is not None and a.alive and now - a.last_seen < fresh for a in agents)
