"""A simulated agent for ``bench control``: the real agent protocol, no torch, no process groups.

Contract:
- :class:`SimAgent` is the reply logic of one worker or standby, as a pure state machine: it is
  fed the typed controller messages (:mod:`tmslurm.wire.messages`) one by one and returns a
  :class:`Reply` saying what to send and what the driver must do next (vote after the step time,
  wait at the collective barrier of a recovery, hand a state over, wait for one, close). It does
  no I/O and reads no clock, so it is unit-tested against recorded controller messages.
- It answers as :mod:`tmslurm.agent.worker` and :mod:`tmslurm.agent.standby` do: a worker
  sends ``started`` and ``groups`` after its ``welcome``, one ``vote`` per step and waits for that
  step's ``decision``; ``prepare`` -> ``prepared``; a decision carrying a switch -> ``switched``
  (stayer) or ``left`` then close (leaver); ``abort`` -> ``aborted`` with per-group op counts;
  ``recover`` -> ``recovered`` (a state source hands its step over first); ``final`` -> ``done``;
  ``finish`` -> close. A standby reports ``ready`` per shape class; ``join`` (planned: ``prepared``,
  and ``shadow_ready`` at once when asked to shadow, since it holds no state; then ``activate``;
  recovery: at once) receives the state and reports ``joined``, then is the
  worker of that rank.
- What is *not* simulated: group builds and state transfers take no time (``phase1_s``,
  ``build_s``, ``transfer_s`` are 0) and a recovery's "collective" is a barrier in the load
  generator (a recovered rank votes only once every slot owner recovered or joined, as the real
  all-reduce would make it wait). A message the real agent would ignore is ignored.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field
from typing import Any

from tmslurm.core.topology import Layout
from tmslurm.wire.messages import (
    Abort,
    Aborted,
    Activate,
    Cancel,
    Decision,
    Done,
    Finish,
    Groups,
    Hello,
    Join,
    Joined,
    Left,
    Msg,
    OpStatus,
    Prepare,
    Prepared,
    Ready,
    Recover,
    Recovered,
    ShadowReady,
    Started,
    Switched,
    Vote,
    Welcome,
)

log = logging.getLogger(__name__)
DIGEST = "sim"
"""Every replica of a shard reports the same digest: the run ends with equal replicas."""


class Phase(enum.Enum):
    CONNECTING = "connecting"
    COMPUTING = "computing"
    """A vote is due after the step time."""
    VOTED = "voted"
    RECOVERING = "recovering"
    POOL = "pool"
    JOINING = "joining"
    DONE = "done"
    CLOSED = "closed"


@dataclass
class Reply:
    send: list[Msg] = field(default_factory=list)
    vote_after_step: bool = False
    """Start computing the (next or redone) step: the driver calls :meth:`SimAgent.vote` after the step time."""
    barrier: int | None = None
    """Wait at the recovery barrier of this epoch, then compute (the driver calls :meth:`SimAgent.released`)."""
    give: tuple[str, int] | None = None
    """Hand the state (its step) over through this transfer group name."""
    take: str | None = None
    """Wait for the state handed over through this transfer group (then :meth:`SimAgent.on_state`)."""
    close: bool = False


@dataclass
class SimAgent:
    kind: str
    ident: int
    node: str
    layout: Layout
    token: str
    rank: int | None = None
    epoch: int = 0
    step: int = 0
    seen_abort: int = -1
    phase: Phase = Phase.CONNECTING
    prepared: set[int] = field(default_factory=set)
    joining: Join | None = None

    def __post_init__(self) -> None:
        if self.kind == "worker":
            self.rank = self.ident

    def hello(self) -> Hello:
        return Hello(
            type="hello",
            token=self.token,
            kind="worker" if self.kind == "worker" else "standby",
            id=self.ident,
            pid=0,
            node=self.node,
            host=self.node,
        )

    # ---- inputs -------------------------------------------------------------------------------
    def on_welcome(self, msg: Welcome) -> Reply:
        self.epoch, self.step = msg.epoch, msg.resume_step
        if self.rank is None:
            self.phase = Phase.POOL
            return Reply(send=[self._ready(c.name, list(c.stages)) for c in self.layout.shape_classes])
        self.phase = Phase.COMPUTING
        started = Started(type="started", rank=self.rank, step=self.step, groups_s=0.0, ckpt_load_s=0.0)
        return Reply(send=[started, self._groups()], vote_after_step=True)

    def on_message(self, msg: Any) -> Reply:
        """One controller message (typed); the agent's reaction."""
        if isinstance(msg, Finish):
            self.phase = Phase.CLOSED
            return Reply(close=True)
        if self.rank is None or self.phase is Phase.JOINING:
            return self._as_standby(msg)
        return self._as_worker(msg)

    def vote(self) -> Reply:
        """The step time passed: vote for the current step and wait for its decision."""
        assert self.rank is not None
        self.phase = Phase.VOTED
        return Reply(
            send=[
                Vote(type="vote", step=self.step, epoch=self.epoch, rank=self.rank, loss=1.0, dt=0.0, peak_rss_mb=0.0)
            ]
        )

    def released(self) -> Reply:
        """Every slot owner recovered: redo the step."""
        self.phase = Phase.COMPUTING
        return Reply(vote_after_step=True)

    def on_state(self, step: int) -> Reply:
        """The state a joiner waited for arrived: it is the worker of its rank from now on."""
        join = self.joining
        assert join is not None
        self.rank, self.epoch, self.step, self.joining = join.rank, join.epoch, step, None
        joined = Joined(
            type="joined",
            epoch=join.epoch,
            rank=join.rank,
            joiner=self.ident,
            step=step,
            transfer_s=0.0,
            phase1_s=0.0,
            bytes=0,
            rss_mb=0.0,
        )
        if join.activate:  # a recovery: wait for the others, as the first collective would
            self.phase = Phase.RECOVERING
            return Reply(send=[joined, self._groups()], barrier=join.epoch)
        self.phase = Phase.COMPUTING
        return Reply(send=[joined, self._groups()], vote_after_step=True)

    # ---- a worker -----------------------------------------------------------------------------
    def _as_worker(self, msg: Any) -> Reply:
        if isinstance(msg, Decision):
            return self._decision(msg) if self.phase is Phase.VOTED and msg.step == self.step else Reply()
        if isinstance(msg, Prepare):
            assert self.rank is not None  # a worker has its rank
            self.prepared.add(msg.epoch)
            return Reply(send=[Prepared(type="prepared", epoch=msg.epoch, rank=self.rank, phase1_s=0.0)])
        if isinstance(msg, Cancel):
            self.prepared.discard(msg.epoch)
            return Reply()
        if isinstance(msg, Abort):
            return self._abort(msg)
        if isinstance(msg, Recover) and self.phase is Phase.RECOVERING and msg.epoch == self.seen_abort:
            return self._recover(msg)
        return Reply()

    def _decision(self, msg: Decision) -> Reply:
        assert self.rank is not None
        self.step += 1
        if msg.final:
            self.phase = Phase.DONE
            shard = self.layout.shard(self.rank)
            return Reply(
                send=[
                    Done(
                        type="done",
                        rank=self.rank,
                        stage=self.layout.coord(self.rank).stage,
                        shard=shard,
                        digest=f"{DIGEST}{shard}",
                        state_digest=f"{DIGEST}{shard}",
                        step=self.step,
                    )
                ]
            )
        send: list[Msg] = []
        if msg.switch is not None and msg.switch.epoch in self.prepared:
            self.prepared.discard(msg.switch.epoch)
            if any(m.rank == self.rank for m in msg.switch.moves):
                self.phase = Phase.CLOSED
                left = Left(type="left", rank=self.rank, step=self.step, transfer_s=0.0, phase2_s=0.0, bytes=0)
                return Reply(send=[left], give=(f"xfer/r{self.rank}", self.step), close=True)
            send.append(Switched(type="switched", epoch=msg.switch.epoch, rank=self.rank, phase2_s=0.0))
        self.epoch = msg.epoch
        self.phase = Phase.COMPUTING
        return Reply(send=send, vote_after_step=True)

    def _abort(self, msg: Abort) -> Reply:
        assert self.rank is not None
        if msg.epoch <= self.seen_abort or self.phase in (Phase.DONE, Phase.CLOSED):
            return Reply()
        self.seen_abort = msg.epoch
        self.phase = Phase.RECOVERING
        return Reply(
            send=[Aborted(type="aborted", epoch=msg.epoch, rank=self.rank, step=self.step, status=self._status())]
        )

    def _recover(self, msg: Recover) -> Reply:
        assert self.rank is not None
        xfers = sorted(msg.pairs)
        self.epoch = msg.epoch
        recovered = Recovered(
            type="recovered", epoch=msg.epoch, rank=self.rank, build_s=0.0, transfer_s=0.0 if xfers else None
        )
        return Reply(send=[recovered, self._groups()], barrier=msg.epoch, give=(xfers[0], self.step) if xfers else None)

    # ---- a standby ----------------------------------------------------------------------------
    def _as_standby(self, msg: Any) -> Reply:
        if isinstance(msg, Join) and self.phase is Phase.POOL:
            self.joining, self.phase = msg, Phase.JOINING
            if msg.activate:
                return Reply(take=msg.xfer)
            prepared = Prepared(type="prepared", epoch=msg.epoch, rank=msg.rank, joiner=self.ident, phase1_s=0.0)
            if msg.shadow:  # a simulated shadow holds no state: caught up at once
                return Reply(send=[prepared, ShadowReady(epoch=msg.epoch, rank=msg.rank, step=0, catchup_s=0.0)])
            return Reply(send=[prepared])
        join = self.joining
        if join is None:
            return Reply()
        if isinstance(msg, Activate) and msg.epoch == join.epoch:
            return Reply(take=join.xfer)
        if isinstance(msg, Cancel) and msg.epoch == join.epoch:
            self.joining, self.phase = None, Phase.POOL
        return Reply()

    # ---- reports ------------------------------------------------------------------------------
    def _ready(self, role: str, stages: list[int]) -> Ready:
        return Ready(
            type="ready", role=role, stages=stages, warmup_s=0.0, rss_mb=0.0, role_rss_mb=0.0, sandbox_sends_skipped=0
        )

    def _group_names(self) -> list[str]:
        assert self.rank is not None
        names = [self.layout.dp_group(self.rank), self.layout.pp_prev(self.rank), self.layout.pp_next(self.rank)]
        return [n for n in names if n is not None]

    def _groups(self) -> Groups:
        assert self.rank is not None
        gens = {n: self.epoch for n in self._group_names()}
        return Groups(
            type="groups",
            rank=self.rank,
            step=self.step,
            epoch=self.epoch,
            ids={n: 0 for n in gens},
            gens=gens,
            peak_rss_mb=0.0,
        )

    def _status(self) -> dict[str, OpStatus]:
        """Clean op counts (equal on every member: no group is dirty beyond the affected ones)."""
        return {n: OpStatus(sent=0, recv=0, coll=0, pending=0, gen=0) for n in self._group_names()}
