"""Every message of the control protocol as a typed, validated structure (pydantic 2).

Contract:
- Three families: :data:`AgentMessage` (an agent to the controller, after its ``hello``),
  :data:`FirstMessage` (the first line of any connection: ``hello`` or a one-shot request) and
  :data:`ControllerMessage` (the controller to an agent or a requester).
- Every model forbids unknown fields and is strict: an ``int`` field refuses ``"3"``, ``3.0`` and
  ``true``; counters (rank, step, epoch, ...) are in ``0..2**31``; durations are finite and
  ``>= 0``; strings are bounded. A ``type`` that names no message is refused too.
- :func:`decode_agent`, :func:`decode_first` and :func:`decode_controller` take the decoded JSON
  object and return the typed message, or raise :class:`BadMessage` (a
  :class:`~tmslurm.core.errors.ProtocolError`) with one line naming the first bad fields. They raise
  nothing else, whatever the input. :func:`encode` turns a message into one JSON line.
- A sender builds every message as its model (agents, monitors and relays send nothing else); each
  model's ``type`` is its default, so ``Vote(step=..., ...)`` is a whole vote. A received line
  without a ``type`` is still refused.

Why pydantic and not msgspec: pydantic 2 validates in compiled code (a vote decodes in a few
microseconds), it is already a common dependency of ML stacks, and its strict mode plus tagged
unions give exactly the "refuse anything not declared" rule we need; msgspec would be faster still
but adds a dependency for no gain at the message rates of one controller.
"""

from __future__ import annotations

import json
from itertools import repeat
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from tmslurm.core.errors import ProtocolError

MAX_COUNT = 2**31
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
AnyInt = Annotated[int, Field(ge=-MAX_COUNT, le=2**63)]
Seconds = Annotated[float, Field(ge=0.0, le=1e9, allow_inf_nan=False)]
Epoch = Annotated[float, Field(ge=0.0, le=1e11, allow_inf_nan=False)]
MiB = Annotated[float, Field(ge=0.0, le=1e9, allow_inf_nan=False)]
Name = Annotated[str, Field(min_length=1, max_length=256)]
Text = Annotated[str, Field(max_length=4000)]
Token = Annotated[str, Field(max_length=256)]
Digest = Annotated[str, Field(min_length=1, max_length=128)]
Port = Annotated[int, Field(ge=1, le=65535)]


class BadMessage(ProtocolError):
    """A message that is not one of the protocol's, or has a bad field."""


class Msg(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


AgentKind = Literal["worker", "standby", "monitor"]
"""What a process says it is in its hello."""

NoticeEvent = Literal["maintenance", "failure"]
"""A notice's event: planned (``maintenance``) or not (``failure``)."""


# ---- first line of a connection -----------------------------------------------------------------
class Hello(Msg):
    type: Literal["hello"] = "hello"
    token: Token
    kind: AgentKind
    id: Count
    pid: AnyInt = 0
    """Reported for logs only: the controller never signals it."""
    node: Name
    host: Name | None = None
    rejoin: Rejoin | None = None
    """Set when an agent that outlived its controller reconnects to the restarted one."""


class StatusRequest(Msg):
    type: Literal["status"] = "status"
    token: Token


class StopRequest(Msg):
    type: Literal["stop"]
    token: Token


class NoticeRequest(Msg):
    """A notice authenticated by the run token (the run's owner)."""

    type: Literal["notice"]
    token: Token
    event: NoticeEvent
    node: Name | None = None
    rank: Count | None = None
    deadline: Epoch | None = None
    reason: Text = ""
    source: Literal["admin", "fault", "controller"] = "admin"


class SignedPayload(Msg):
    """What the cluster admin signs: one node, one event, fresh (timestamp) and once (nonce)."""

    run: Name
    node: Name
    event: NoticeEvent
    deadline: Epoch | None = None
    timestamp: Epoch
    nonce: Annotated[str, Field(min_length=16, max_length=128)]
    reason: Text = ""


class SignedNotice(Msg):
    """A notice signed with the admin's Ed25519 key; it can do nothing but notify."""

    type: Literal["signed_notice"]
    payload: SignedPayload
    signature: Annotated[str, Field(min_length=1, max_length=256)]


class RelayHello(Msg):
    """The first line of a node relay's connection (:mod:`tmslurm.wire.mux`): frames follow."""

    type: Literal["relay"] = "relay"
    token: Token
    node: Name


FirstMessage = Annotated[
    Hello | RelayHello | StatusRequest | StopRequest | NoticeRequest | SignedNotice, Field(discriminator="type")
]
Request = StatusRequest | StopRequest | NoticeRequest | SignedNotice
OneShot = StatusRequest | StopRequest | NoticeRequest
"""A request as the controller handles it: a signed notice, once verified, is a NoticeRequest."""


# ---- agent -> controller ------------------------------------------------------------------------
class Heartbeat(Msg):
    type: Literal["hb"] = "hb"


class Started(Msg):
    type: Literal["started"] = "started"
    rank: Count
    step: Count
    groups_s: Seconds
    ckpt_load_s: Seconds


class Groups(Msg):
    type: Literal["groups"] = "groups"
    rank: Count
    step: Count
    epoch: Count
    ids: dict[Name, AnyInt]
    gens: dict[Name, Count]
    peak_rss_mb: MiB


class _StepReport(Msg):
    """What a rank reports about a step it computed (a vote, or progress while votes are off)."""

    step: Count
    epoch: Count
    rank: Count
    loss: float | None = None
    dt: Seconds
    peak_rss_mb: MiB
    digest: Digest | None = None
    busy: Seconds | None = None
    """``dt`` less the time spent waiting for communication: what says which rank is slow."""
    ckpt: Seconds | None = None
    """Seconds the rank's step loop spent saving a checkpoint after its previous vote (the checkpoint's
    stall of the step loop); None when it saved none."""


class Vote(_StepReport):
    type: Literal["vote"] = "vote"


class StepVote(NamedTuple):
    """One rank's row of a :class:`NodeVotes`, with a vote's fields (what the commit reads)."""

    rank: int
    step: int
    epoch: int
    loss: float | None
    dt: float
    peak_rss_mb: float
    digest: str | None
    busy: float | None
    ckpt: float | None


MAX_NODE_VOTES = 4096


class NodeVotes(Msg):
    """The votes of one node's ranks for one step, by column: what a node relay sends instead of
    one ``vote`` per rank (:mod:`tmslurm.wire.mux`), validated in one call."""

    type: Literal["votes"]
    step: Count
    epoch: Count
    rank: Annotated[list[Count], Field(min_length=1, max_length=MAX_NODE_VOTES)]
    loss: list[float | None]
    dt: list[Seconds]
    peak_rss_mb: list[MiB]
    digest: list[Digest | None]
    busy: list[Seconds | None]
    ckpt: list[Seconds | None]

    @model_validator(mode="after")
    def _columns(self) -> NodeVotes:
        n = len(self.rank)
        if (
            not len(self.loss)
            == len(self.dt)
            == len(self.peak_rss_mb)
            == len(self.digest)
            == len(self.busy)
            == len(self.ckpt)
            == n
        ):
            raise ValueError("every column must have one entry per rank")
        return self

    def rows(self) -> list[StepVote]:
        new = tuple.__new__  # what StepVote._make does, without a Python call per row
        n = len(self.rank)
        return [
            new(StepVote, t)
            for t in zip(
                self.rank,
                repeat(self.step, n),
                repeat(self.epoch, n),
                self.loss,
                self.dt,
                self.peak_rss_mb,
                self.digest,
                self.busy,
                self.ckpt,
            )
        ]


class Progress(_StepReport):
    type: Literal["progress"] = "progress"


class Prepared(Msg):
    type: Literal["prepared"] = "prepared"
    epoch: Count
    rank: Count
    phase1_s: Seconds | None = None
    error: Text | None = None
    joiner: Count | None = None


class Switched(Msg):
    type: Literal["switched"] = "switched"
    epoch: Count
    rank: Count
    phase2_s: Seconds


class Left(Msg):
    type: Literal["left"] = "left"
    rank: Count
    step: Count
    transfer_s: Seconds
    phase2_s: Seconds
    bytes: Annotated[int, Field(ge=0, le=2**50)]
    """State bytes sent in the pause (0 with a live shadow)."""
    shadowed: bool = False
    """A live shadow followed this rank (comm/shadow.py); the new rank reports the comparison
    (``shadow_checked``)."""
    shadow_steps: Count = 0
    """Committed steps the shadow followed."""
    shadow_wait_s: Seconds = 0.0
    """Total time this rank waited for its shadow sends before optimizer steps."""
    apply_s: Seconds = 0.0
    """Its optimizer update of the step the switch rode on (work every step does)."""


class ShadowReady(Msg):
    """A standby holds the leaver's state (``START`` received): from now on it follows step by step."""

    type: Literal["shadow_ready"] = "shadow_ready"
    epoch: Count
    rank: Count
    step: Count
    catchup_s: Seconds


class ShadowChecked(Msg):
    """A rank that took its slot from a live shadow compared its state with the leaver's behind its
    first step (agent/shadowcheck.py), before voting for that step."""

    type: Literal["shadow_checked"] = "shadow_checked"
    epoch: Count
    """The switch's epoch."""
    rank: Count
    step: Count
    """The first step after the switch (not committed before this message)."""
    matched: bool
    verify_s: Seconds
    """The comparison's own seconds, behind the first step."""
    wait_s: Seconds
    """How long the first step's vote waited for the comparison (a part of the pause)."""
    bytes: Annotated[int, Field(ge=0, le=2**50)] = 0
    """The leaver's whole state, received on a mismatch (0 when equal)."""
    transfer_s: Seconds = 0.0


class OpStatus(Msg):
    sent: Count
    recv: Count
    coll: Count
    pending: Count
    gen: Count


class Aborted(Msg):
    type: Literal["aborted"] = "aborted"
    epoch: Count
    rank: Count
    step: Count
    status: dict[Name, OpStatus]


class Recovered(Msg):
    type: Literal["recovered"] = "recovered"
    epoch: Count
    rank: Count
    build_s: Seconds
    transfer_s: Seconds | None = None


class CommErrorReport(Msg):
    type: Literal["comm_error"] = "comm_error"
    rank: Count
    step: Count
    epoch: Count
    error: Text


class FaultFired(Msg):
    type: Literal["fault"] = "fault"
    index: Annotated[int, Field(ge=0, le=10_000)]
    rank: Count
    step: Count
    kind: Name


Millis = Annotated[float, Field(ge=0, le=1e9)]


class BuddyCost(Msg):
    """Per committed step of one process, in ms: the buddy swap plus the wait for the ward's optimizer
    step (which overlaps the next all-gather): the buddy's part of the critical path."""

    n: Count
    mean_ms: Millis
    p50_ms: Millis
    p90_ms: Millis
    max_ms: Millis

    @classmethod
    def of(cls, seconds: list[float]) -> BuddyCost | None:
        if not seconds:
            return None
        ms = sorted(x * 1e3 for x in seconds)
        return cls(
            n=len(ms),
            mean_ms=sum(ms) / len(ms),
            p50_ms=ms[len(ms) // 2],
            p90_ms=ms[int(0.9 * (len(ms) - 1))],
            max_ms=ms[-1],
        )


class Done(Msg):
    type: Literal["done"] = "done"
    rank: Count
    stage: Count
    shard: Count | None = None
    """(stage, tp) shard index; None means the stage (tp = 1)."""
    digest: Digest
    state_digest: Digest
    step: Count
    state_bytes: Annotated[int, Field(ge=0, le=2**50)] = 0
    """Bytes of parameters and optimizer state the rank holds."""
    optimizer_bytes: Annotated[int, Field(ge=0, le=2**50)] = 0
    """Bytes of optimizer state the rank holds (at parallel.zero=1: its slice and its buddy's)."""
    slice: Count | None = None
    """At parallel.zero=1: the data-parallel rank whose optimizer slice ``state_digest`` covers."""
    ward_digest: Digest | None = None
    """At parallel.zero=1: the digest of the buddy's slice as this rank holds it."""
    buddy: BuddyCost | None = None
    """At parallel.zero=1: what the buddy copy cost this process per committed step (swap + wait for the ward)."""

    @property
    def shard_index(self) -> int:
        """The (stage, tp) shard this report is for (the stage when ``shard`` is absent)."""
        return self.stage if self.shard is None else self.shard


class Ready(Msg):
    type: Literal["ready"] = "ready"
    role: Name
    """A shape class of the layout: only, first, last, middle or middle-<n>b."""
    warm: bool = True
    """False: listed beyond standby.max_classes; a join builds this class in the pause."""
    stages: list[Count] = []
    warmup_s: Seconds
    rss_mb: MiB
    """The standby's resident set after this class is warm (with the arena, storage for one class)."""
    peak_rss_mb: MiB = 0.0
    """Its high-water mark so far (warm-up builds a class before it is bound to the arena)."""
    arena_mb: MiB = 0.0
    """The shared arena's size (0 without one)."""
    role_rss_mb: Annotated[float, Field(ge=-1e9, le=1e9, allow_inf_nan=False)]
    sandbox_sends_skipped: Count


class Joined(Msg):
    type: Literal["joined"] = "joined"
    epoch: Count
    rank: Count
    joiner: Count
    step: Count
    transfer_s: Seconds
    phase1_s: Seconds
    bytes: Annotated[int, Field(ge=0, le=2**50)]
    rss_mb: MiB
    joiner_warm: bool = True
    """The runner was warm (no module build or compile in the pause)."""
    warm_reason: Text | None = None
    shadowed: bool = False
    """It followed the leaver as a live shadow; ``bytes`` is then what moved in the pause."""
    shadow_steps: Count = 0
    shadow_catchup_s: Seconds | None = None
    """Receiving and loading the leaver's state in the background (not in the pause)."""
    apply_s: Seconds = 0.0
    """A shadow's optimizer update of the step the switch rode on (0 without a shadow)."""


class JoinFailed(Msg):
    type: Literal["join_failed"] = "join_failed"
    epoch: Count
    rank: Count
    error: Text


class Exited(Msg):
    """A node monitor saw a process it was told to watch exit (pidfd), whether or not a socket closed."""

    type: Literal["exited"] = "exited"
    agent: Name
    pid: AnyInt


class Stopped(Msg):
    """A node monitor saw a process it watches stay stopped (SIGSTOP, state T) for this long."""

    type: Literal["stopped"] = "stopped"
    agent: Name
    pid: AnyInt
    stopped_s: Seconds


class SinkAt(Msg):
    """A node monitor's link-probe sink listens here (:mod:`tmslurm.agent.linkprobe`)."""

    type: Literal["sink"] = "sink"
    host: Name
    port: Port


class Probed(Msg):
    """A node monitor's answer to :class:`ProbeLink` ``seq``: the seconds it took, or why there are none."""

    type: Literal["probed"] = "probed"
    seq: Count
    seconds: Seconds | None = None
    error: Text = ""
    timed_out: bool = False
    """No seconds because the bytes took longer than the probe's timeout (a slow link, not a cut one)."""


AgentMessage = Annotated[
    Heartbeat
    | Started
    | Groups
    | Vote
    | Progress
    | Prepared
    | Switched
    | Left
    | ShadowReady
    | ShadowChecked
    | Aborted
    | Recovered
    | CommErrorReport
    | FaultFired
    | Done
    | Ready
    | Joined
    | JoinFailed
    | Exited
    | Stopped
    | SinkAt
    | Probed,
    Field(discriminator="type"),
]


# ---- controller -> agent / requester ------------------------------------------------------------
class FaultSpec(Msg):
    index: Count
    step: Count
    kind: Name
    rank: Count
    """The first rank hit (for a report); ``ranks`` are all of them."""
    ranks: Annotated[list[Count], Field(min_length=1, max_length=MAX_NODE_VOTES)]
    amount: Annotated[str, Field(max_length=32)]
    when: Name


class Address(Msg):
    host: Name
    port: Annotated[int, Field(ge=1, le=65535)]
    store_port: Annotated[int, Field(ge=1, le=65535)]


class Welcome(Msg):
    type: Literal["welcome"] = "welcome"
    config: dict[str, Any]
    epoch: Count
    generation: Count
    resume_step: Count
    faults: list[FaultSpec]
    address: Address


class MoveSpec(Msg):
    rank: Count
    joiner: Name


class SwitchSpec(Msg):
    epoch: Count
    moves: list[MoveSpec]


class Decision(Msg):
    type: Literal["decision"] = "decision"
    step: Count
    decision: Literal["commit"] = "commit"
    epoch: Count
    switch: SwitchSpec | None = None
    checkpoint: bool = False
    final: bool = False


class Rejoin(Msg):
    """Where a live agent stands, told to a restarted controller (:mod:`tmslurm.controller.adoption`)."""

    rank: Count | None
    """The slot it serves (a joined standby serves one too); None for an idle standby or a monitor."""
    epoch: Count
    decision: Decision | None
    """The last decision it received (applied or about to be), None before the first."""
    vote: Vote | None
    """Its vote still waiting for a decision, if any (the dead controller may never have read it)."""
    in_plan: bool
    """It is inside a planned switch or a recovery (prepared groups, a join, an abort)."""
    prepared: Annotated[list[Count], Field(max_length=64)] = []
    """The epochs of planned switches it prepared for (phase 1) and has not applied: a worker's
    prepared groups, a standby's join not yet activated."""
    aborting: bool = False
    """It saw an abort newer than its epoch (a recovery was under way)."""
    step: Count | None = None
    """The step a rank computes next (a joiner that received no decision yet is placed by it)."""

    @property
    def leaving(self) -> bool:
        """Its last decision moved the slot it serves to a joiner (a planned switch): it hands its
        state over and exits, so it serves that slot no longer."""
        d = self.decision
        return (
            self.rank is not None
            and d is not None
            and d.switch is not None
            and any(m.rank == self.rank for m in d.switch.moves)
        )


class Abort(Msg):
    type: Literal["abort"] = "abort"
    epoch: Count
    step: Count


Pair = Annotated[list[Count], Field(min_length=2, max_length=2)]


class Prepare(Msg):
    type: Literal["prepare"] = "prepare"
    epoch: Count
    groups: dict[Name, Count]
    pairs: dict[Name, Pair]
    shadow: bool = False
    """A leaver (its ``xfer`` pair is listed) feeds a live shadow (comm/shadow.py)."""


class Join(Msg):
    type: Literal["join"] = "join"
    epoch: Count
    rank: Count
    groups: dict[Name, Count]
    xfer: Name
    activate: bool
    shadow: bool = False
    """Follow the leaver as a live shadow until the switch."""
    faults: list[FaultSpec] = []
    """Injected ``when: join`` faults of this rank that are due (tests): the joiner fires them while
    it receives the state."""


class Activate(Msg):
    type: Literal["activate"] = "activate"
    epoch: Count


class Recover(Msg):
    type: Literal["recover"] = "recover"
    epoch: Count
    groups: dict[Name, Count]
    pairs: dict[Name, Pair]
    hold: bool = False
    """Redo the step only after ``resume`` for this epoch: the rank sends no state, and the
    recovery's transfers run alone (``runtime.redo_overlap=false``)."""


class Resume(Msg):
    """The recovery of ``epoch`` finished (every transfer done): a held rank redoes its step."""

    type: Literal["resume"] = "resume"
    epoch: Count


class Cancel(Msg):
    type: Literal["cancel"] = "cancel"
    epoch: Count


class Finish(Msg):
    type: Literal["finish"] = "finish"


class Watch(Msg):
    """To a node monitor: watch this agent's process (the pid it reported; watched, never signalled)."""

    type: Literal["watch"] = "watch"
    agent: Name
    pid: AnyInt


class ProbeLink(Msg):
    """To a node monitor: send ``nbytes`` to the link-probe sink at host:port and say how long it took."""

    type: Literal["probe"] = "probe"
    seq: Count
    host: Name
    port: Port
    nbytes: Annotated[int, Field(ge=1, le=64 << 20)]


class Beat(Msg):
    """The controller is alive (sent every ``runtime.controller_lost_s`` / 5)."""

    type: Literal["beat"] = "beat"


class ErrorReply(Msg):
    type: Literal["error"] = "error"
    error: Text
    ending: bool = False
    """The run is ending and takes no more requests: its summary.json follows (or the next allocation)."""


class OkReply(Msg):
    type: Literal["ok"] = "ok"
    ok: bool = True
    accepted: dict[str, Any] | None = None
    stopping_after_step: Count | None = None


class StatusReply(Msg):
    type: Literal["status"] = "status"
    ok: bool = True
    status: dict[str, Any]


ControllerMessage = Annotated[
    Welcome
    | Decision
    | Abort
    | Prepare
    | Join
    | Activate
    | Recover
    | Resume
    | Cancel
    | Finish
    | Beat
    | Watch
    | ProbeLink
    | ErrorReply
    | OkReply
    | StatusReply,
    Field(discriminator="type"),
]

Hello.model_rebuild()  # its ``rejoin`` names Rejoin, defined after it
_AGENT: TypeAdapter[Any] = TypeAdapter(AgentMessage)
_FIRST: TypeAdapter[Any] = TypeAdapter(FirstMessage)
_CONTROLLER: TypeAdapter[Any] = TypeAdapter(ControllerMessage)
_VOTES: TypeAdapter[Any] = TypeAdapter(NodeVotes)


def _decode(adapter: TypeAdapter[Any], obj: Any, family: str) -> Any:
    try:
        return adapter.validate_python(obj)
    except ValidationError as exc:
        raise BadMessage(f"bad {family} message: {_describe(exc)}") from None
    except (TypeError, ValueError, RecursionError) as exc:  # pathological input: still one clear line
        raise BadMessage(f"bad {family} message: {type(exc).__name__}") from None


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False, include_input=False)[:3]:
        where = ".".join(str(p) for p in err["loc"]) or "message"
        parts.append(f"{where[:80]}: {err['msg'][:240]}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")


def decode_votes(obj: Any) -> NodeVotes:
    """A node relay's :class:`NodeVotes`; BadMessage otherwise."""
    return _decode(_VOTES, obj, "relay")


def decode_agent(obj: Any) -> Any:
    """An agent's message (any type but ``hello``), typed; BadMessage otherwise."""
    return _decode(_AGENT, obj, "agent")


def decode_first(obj: Any) -> Hello | RelayHello | Request:
    """The first line of a connection: ``hello``, a relay's hello or a request; BadMessage otherwise."""
    return _decode(_FIRST, obj, "first")


def decode_controller(obj: Any) -> Any:
    """A controller's message as an agent or requester reads it; BadMessage otherwise."""
    return _decode(_CONTROLLER, obj, "controller")


def encode(msg: Msg) -> bytes:
    """One line of JSON (no ``None`` optional fields dropped: the receiver validates them)."""
    return (json.dumps(msg.model_dump(mode="json"), separators=(",", ":"), allow_nan=True) + "\n").encode()


def token_of(obj: Any) -> Any:
    """The ``token`` field of a raw first message, or None (read before validation, for auth)."""
    return obj.get("token") if isinstance(obj, dict) else None
