"""What the controller's queue carries: one frozen dataclass per kind of item.

Contract:
- Every change to a run reaches the controller's thread as one of these (:data:`Item`), put by
  :meth:`~tmslurm.controller.context.Context.submit` from any thread; the controller dispatches on
  the item's type through one table (:meth:`tmslurm.controller.loop.Controller.handle`), as it
  dispatches an agent's message on the message's type. Each kind has exactly one handler there.
- From the gate (:mod:`tmslurm.controller.gate`, :mod:`tmslurm.controller.gaterelay`), already
  authenticated and validated, in the order read per connection: :class:`HelloIn`,
  :class:`RequestIn`, :class:`MessageIn`, :class:`Disconnected`, :class:`VotesIn` (a node relay's
  votes); the items of one ``select`` round come as one :class:`Batch` when there are several (one
  queue hand-off per round: at a thousand agents the hand-offs were a quarter of the controller's
  time). A request is never inside a batch: the gate hands it over on its own, after the round's
  earlier items.
- From elsewhere: :class:`NoticeIn` (the Slurm watcher, an injected drain), :class:`FaultAt` and
  :class:`Released` (results of the cluster hooks, which never wait on the cluster themselves).
- ``conn`` is the gate's number of an agent's connection, unique per connection (and per agent
  behind a relay); the hello's item names it first. ``ch`` is the channel the controller answers
  on (and closes). ``label`` is the item's name in the journal (``handler_error``).
- Plain data: frozen (a field is never reassigned; the list of a ``Batch`` or a ``VotesIn`` is
  the gate's, handed over whole and never touched by it again), ``slots`` (the ones built per
  message stay small and quick to build), no behaviour, nothing raised.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, get_args

from tmslurm.core.notices import Notice
from tmslurm.wire.messages import FaultSpec, Hello, Msg, NodeVotes, NoticeRequest, StatusRequest, StopRequest
from tmslurm.wire.protocol import GateSide


@dataclass(frozen=True, slots=True)
class HelloIn:
    """An agent's (or a node monitor's) hello on connection ``conn``."""

    label: ClassVar[str] = "hello"
    hello: Hello
    conn: int
    ch: GateSide


@dataclass(frozen=True, slots=True)
class RequestIn:
    """A one-shot request (a signed notice arrives as its :class:`NoticeRequest`);
    answered on ``ch``, which is then closed."""

    label: ClassVar[str] = "request"
    request: NoticeRequest | StatusRequest | StopRequest
    ch: GateSide


@dataclass(frozen=True, slots=True, init=False)
class MessageIn:
    """An agent's (or a node monitor's) message after its hello (heartbeats are not queued)."""

    label: ClassVar[str] = "msg"
    conn: int
    msg: Msg

    def __init__(self, conn: int, msg: Msg) -> None:
        # One per agent message, built on the gate's thread: setting the slots directly costs about
        # half of the generated frozen __init__ (object.__setattr__ per field), a third of a microsecond.
        _set_conn(self, conn)
        _set_msg(self, msg)


_set_conn = MessageIn.__dict__["conn"].__set__
_set_msg = MessageIn.__dict__["msg"].__set__


@dataclass(frozen=True, slots=True)
class Disconnected:
    """Connection ``conn`` ended (EOF, reset, a close by the controller, or its relay's)."""

    label: ClassVar[str] = "disconnect"
    conn: int


@dataclass(frozen=True, slots=True)
class VotesIn:
    """A node relay's votes for one step: ``conns[i]`` sent row ``i`` of ``votes`` (0: refused in the frame)."""

    label: ClassVar[str] = "votes"
    conns: list[int]
    votes: NodeVotes


@dataclass(frozen=True, slots=True)
class NoticeIn:
    """A notice from another thread (the Slurm watcher) or an injected drain."""

    label: ClassVar[str] = "notice"
    notice: Notice


@dataclass(frozen=True, slots=True)
class FaultAt:
    """An injected fault the cluster raised (the failure lab's power-off, partition, throttle,
    slowlink) happened on ``nodes`` (all at once) at ``t``."""

    label: ClassVar[str] = "fault_at"
    fault: FaultSpec
    nodes: tuple[str, ...]
    t: float


@dataclass(frozen=True, slots=True)
class Released:
    """The cluster hooks gave ``node`` back."""

    label: ClassVar[str] = "released"
    node: str


@dataclass(frozen=True, slots=True)
class Batch:
    """The gate's items of one ``select`` round, in order (never a request, never a batch)."""

    label: ClassVar[str] = "batch"
    items: list[Item]


Item = HelloIn | RequestIn | MessageIn | Disconnected | VotesIn | NoticeIn | FaultAt | Released | Batch
"""Every kind of queue item."""

ITEM_TYPES: tuple[type, ...] = get_args(Item)
"""The same as a tuple of classes (what the dispatch table must cover)."""
