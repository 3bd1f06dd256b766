"""One explicit run state: what the controller knows, built complete in its constructor.

Contract: :class:`RunState` holds every mutable fact of a run (epoch, step, :class:`Mode`, slots,
agents, votes, the current plan, pending notices, the step log, the reports collected at the end);
it is created once, complete, and only the controller's thread touches it. ``dropped_joins`` remembers
the joins a dropped plan left unconfirmed, so a late ``joined`` is recognised. :class:`Agent` is one
connected process as the controller sees it. Queries here never fail: an unknown rank or agent
id reads as "no agent" / "not alive".
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Any

from tmslurm.controller.plan_types import PlannedSwitch, Recovery
from tmslurm.core.notices import Notice
from tmslurm.wire.messages import Done, Started
from tmslurm.wire.protocol import LineChannel


class Mode(enum.Enum):
    STARTING = "starting"
    ADOPTING = "adopting"
    """A restarted controller waits for the live agents to rejoin (:mod:`tmslurm.controller.adoption`)."""
    RUNNING = "running"
    RECOVERING = "recovering"
    CHECKPOINTING = "checkpointing"
    DRAINING = "draining"
    FINISHED = "finished"

    @property
    def ending(self) -> bool:
        return self in (Mode.DRAINING, Mode.FINISHED)


def agent_id(kind: str, ident: int, pid: int, conn: int) -> str:
    """An agent's id: ``<kind><id>.<pid>#<connection>`` (a rejoin is a new connection of the same process)."""
    return f"{kind}{ident}.{pid}#{conn}"


def process_of(aid: str) -> str:
    """The process an agent id names, whichever connection it came on: the id without ``#<connection>``."""
    return aid.split("#", 1)[0]


def spawn_key(aid: str) -> tuple[str, int] | None:
    """The (kind, id) an agent was spawned as (``worker3.4242#7`` -> ``("worker", 3)``), None if not an agent id."""
    m = re.fullmatch(r"(worker|standby)(\d+)\.\d+(?:#\d+)?", aid)
    return (m.group(1), int(m.group(2))) if m else None


def found_gone(journal: list[dict[str, Any]]) -> set[tuple[str, int]]:
    """The (kind, id) whose latest process the journal says was lost (its node lost, fenced, hung)
    after it came up: a supervisor may still list one as alive (a powered-off node's srun lingers)."""
    gone: set[tuple[str, int]] = set()
    for e in journal:
        aids = e.get("agents") if e.get("type") == "node_lost" else [e.get("agent")]
        keys = {k for a in aids or [] if isinstance(a, str) and (k := spawn_key(a)) is not None}
        if e.get("type") == "agent_up":
            gone -= keys
        elif e.get("type") in ("node_lost", "fenced", "hung"):
            gone |= keys
    return gone


@dataclass
class Agent:
    aid: str
    kind: str
    ident: int
    pid: int
    """As the agent reported it: for logs only, never signalled."""
    node: str
    channel: LineChannel
    """A :class:`~tmslurm.wire.protocol.GateChannel`, or a :class:`~tmslurm.wire.mux.SubChannel` behind a node relay."""
    last_seen: float
    host: str | None = None
    rank: int | None = None
    alive: bool = True
    expected_exit: bool = False
    roles: dict[str, dict[str, Any]] = field(default_factory=dict)
    busy: bool = False
    starting: bool = False
    """Between its first hello and its ``started`` (a rank) or first ``ready`` (a standby): it imports,
    builds its runner and groups, and on a loaded host may not get the CPU to heartbeat for seconds.
    Its silence is then allowed ``runtime.connect_timeout_s``; a rejoin after a controller restart is
    not starting."""

    @property
    def idle_standby(self) -> bool:
        return self.kind == "standby" and self.alive and self.rank is None


class JobEnd(enum.Enum):
    """Why the main job is ending, as its signal says."""

    TIME_LIMIT = "time_limit"
    """SIGUSR1, slurm.signal_lead_s before the time limit: checkpoint, then slurm.on_limit."""
    SIGTERM = "sigterm"
    """Preempted (PreemptMode=REQUEUE: Slurm requeues it), cancelled, or past its limit: checkpoint
    within the grace time and leave the rest to Slurm."""


@dataclass
class CheckpointThen:
    """Checkpoint at the next step boundary, then ``restart`` from it (a planned event with no warm
    standby), ``requeue`` away from ``node`` (the batch host must leave) or ``end`` (the main job is
    ending: see :class:`JobEnd`)."""

    action: str
    reason: str
    t: float
    ranks: list[int] = field(default_factory=list)
    node: str | None = None
    checkpoint_step: int | None = None
    end: JobEnd | None = None
    """For ``end``: which signal announced it."""


@dataclass
class RunState:
    world: int
    step: int = 0
    resume_step: int = 0
    start_step: int = 0
    """Where this incarnation of the run began: 0, or the checkpoint it resumed from."""
    epoch: int = 0
    epochs: int = 0
    mode: Mode = Mode.STARTING
    incarnation: int = 0
    agents: dict[str, Agent] = field(default_factory=dict)
    conn_agent: dict[int, str] = field(default_factory=dict)
    slots: dict[int, str] = field(default_factory=dict)
    expected: set[tuple[str, int]] = field(default_factory=set)
    """(kind, ident) spawned by us and not yet connected: the only hellos accepted."""
    standbys_started: int = 0
    votes: dict[int, Any] = field(default_factory=dict)
    vote_t: dict[int, float] = field(default_factory=dict)
    """When each rank's vote in ``votes`` arrived (monotonic); read only for ranks in ``votes``."""
    step_log: list[dict[str, Any]] = field(default_factory=list)
    retiring: set[str] = field(default_factory=set)
    """Standby agents whose spare allocation is being renewed (:mod:`tmslurm.controller.renewal`)."""
    plan: PlannedSwitch | Recovery | None = None
    pending_notices: list[Notice] = field(default_factory=list)
    retry_notices: bool = False
    """Set when a plan ends or a standby warms up: the loop then retries a pending notice."""
    release_after_check: dict[int, list[str]] = field(default_factory=dict)
    """Nodes a shadowed switch emptied, by its epoch, given back once its new rank's check is reported
    (the leaver sends its fingerprint from there after the switch; giving the node back kills it)."""
    dropped_joins: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Joiner agent id -> (epoch, rank) of a dropped plan it never reported ``joined`` for: it may
    have finished that join anyway (its ``joined`` still in flight), see ``Recoveries.late_join``."""
    fired: set[int] = field(default_factory=set)
    fault_t: dict[int, float] = field(default_factory=dict)
    done: dict[int, Done] = field(default_factory=dict)
    started: dict[int, Started] = field(default_factory=dict)
    restart_t: float | None = None
    replica_mismatch: list[int] = field(default_factory=list)
    comm_error_since: float | None = None
    hold_since: float | None = None
    stop_requested: bool = False
    stop_checkpoint: bool = False
    """A stop asked for (``tmslurm stop``): the final commit carries a checkpoint, so that
    ``train.resume_from`` goes on from the step the run stopped at."""
    stopped_at: int | None = None
    """The step of that checkpoint (the steps committed), once the final commit carried it."""
    checkpoint_then: CheckpointThen | None = None
    requeued: bool = False
    failed_reason: str | None = None

    def new_epoch(self) -> int:
        """A fresh epoch, strictly above every one handed out so far."""
        self.epochs = max(self.epochs, self.epoch) + 1
        return self.epochs

    def agent_of(self, rank: int) -> Agent | None:
        return self.agents.get(self.slots.get(rank, ""))

    def owns_slot(self, agent: Agent, rank: int) -> bool:
        return self.slots.get(rank) == agent.aid

    def rank_alive(self, rank: int) -> bool:
        agent = self.agent_of(rank)
        return agent is not None and agent.alive and not agent.expected_exit

    def who(self, agent: Agent) -> str:
        """How a plan's waiting set names an agent: r<rank> for a slot owner, else its agent id."""
        return f"r{agent.rank}" if agent.rank is not None and self.owns_slot(agent, agent.rank) else agent.aid

    def standbys(self) -> list[Agent]:
        return [a for a in self.agents.values() if a.kind == "standby"]
