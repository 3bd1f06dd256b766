"""What every controller collaborator shares: config, layout, run directory, journal, outbox, state.

Contract: one :class:`Context` is built by the controller before its collaborators and handed to
each. Sending (:meth:`Context.send_rank`, :meth:`Context.broadcast`, :meth:`Context.send_to`)
goes to alive agents only and never raises: a broken connection is the disconnect handler's
business. :meth:`Context.submit` queues an item (:mod:`tmslurm.controller.items`) for the
controller's thread from any thread. :meth:`Context.pending_faults` are the config's injected faults
not yet fired, as the :class:`~tmslurm.wire.messages.FaultSpec` a worker's ``welcome`` carries.
"""

from __future__ import annotations

import queue
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

from tmslurm.controller.events import EventLog
from tmslurm.controller.hooks import ClusterHooks
from tmslurm.controller.items import Item
from tmslurm.controller.journal import Journal
from tmslurm.controller.spawner import Spawner
from tmslurm.controller.state import Agent, RunState
from tmslurm.core.config import RunConfig, fault_amount, fault_ranks
from tmslurm.core.rundir import RunDir
from tmslurm.core.topology import Layout
from tmslurm.wire.messages import FaultSpec, Join, Msg
from tmslurm.wire.mux import SubChannel, deliver
from tmslurm.wire.protocol import GateChannel, encode_line

M = TypeVar("M", bound=Msg)


@dataclass
class Context:
    cfg: RunConfig
    layout: Layout
    rundir: RunDir
    journal: Journal
    events: EventLog
    spawner: Spawner
    hooks: ClusterHooks
    state: RunState
    queue: queue.Queue[Item]

    def submit(self, item: Item) -> None:
        self.queue.put(item)

    def send_rank(self, rank: int, msg: Msg) -> None:
        agent = self.state.agent_of(rank)
        if agent is not None and agent.alive:
            agent.channel.try_send(msg)

    def broadcast(self, msg: Msg) -> None:
        """``msg`` to every rank's slot owner, encoded once (a decision goes to every rank each step);
        the ranks behind one node relay get it as one frame (:mod:`tmslurm.wire.mux`)."""
        agents = self.state.agents
        self._fan_out(encode_line(msg), (agents.get(aid) for aid in self.state.slots.values()))

    def send_all(self, msg: Msg) -> None:
        """``msg`` to every alive worker and standby (monitors are the node watch's),
        encoded once, one frame per relay."""
        self._fan_out(encode_line(msg), iter(list(self.state.agents.values())))

    @staticmethod
    def _fan_out(line: bytes, agents: Iterable[Agent | None]) -> None:
        relayed: dict[GateChannel, list[int]] = {}
        for agent in agents:
            if agent is None or not agent.alive:
                continue
            ch = agent.channel
            if isinstance(ch, SubChannel):  # behind a node relay: one frame per relay, not per agent
                if not ch.closed:
                    relayed.setdefault(ch.relay, []).append(ch.sub)
            else:
                ch.try_send_line(line)
        for relay, subs in relayed.items():
            relay.try_send_line(deliver(subs, line))

    def send_to(self, key: int | str, msg: Msg) -> None:
        """``key`` is a rank (its slot owner) or an agent id."""
        if isinstance(key, int):
            self.send_rank(key, msg)
        elif key in self.state.agents and self.state.agents[key].alive:
            self.state.agents[key].channel.try_send(msg)

    def with_join_faults(self, msgs: dict[int | str, M]) -> dict[int | str, M]:
        """Each ``join`` carries the injected ``when: join`` faults of its rank that are due and not yet fired."""

        def due(m: Join) -> list[FaultSpec]:
            return [
                f for f in self.pending_faults() if f.when == "join" and m.rank in f.ranks and f.step <= self.state.step
            ]

        return {k: m.model_copy(update={"faults": due(m)}) if isinstance(m, Join) else m for k, m in msgs.items()}

    def pending_faults(self) -> list[FaultSpec]:
        """The config's injected faults not yet fired, with their index."""
        return [
            FaultSpec(
                index=i,
                step=f.step,
                kind=f.kind,
                rank=fault_ranks(f)[0],
                ranks=fault_ranks(f),
                amount=fault_amount(f),
                when=f.when,
            )
            for i, f in enumerate(self.cfg.faults)
            if i not in self.state.fired
        ]
