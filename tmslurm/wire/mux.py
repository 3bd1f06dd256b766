"""The node relay's framing: many agents' lines over one connection to the controller.

Contract:
- A node relay (:mod:`tmslurm.agent.relay`) opens one TCP connection to the controller, sends a
  :class:`~tmslurm.wire.messages.RelayHello` (authenticated by the run token) and from then on speaks
  frames, one per line. Each local agent is a *sub* with a number ``k`` (1.. per relay connection)
  that the relay chose; the agents' own lines (hello included, with its token) travel unchanged.
- Relay -> controller: ``<k> <line>`` (a line of sub ``k``), ``V<k>,<k>,... <node votes>`` (the
  votes of these subs for one step and epoch as one :class:`~tmslurm.wire.messages.NodeVotes`, by
  column, in the subs' order: one frame per node and step, validated by the controller in one
  call; a relay forwards a vote it cannot read as a plain line, so the controller answers that
  agent), ``-<k>`` (sub ``k`` closed) and
  ``+<k>,<k>,...`` (these subs were heard since the last such frame; an empty list is the relay's
  own heartbeat). Agents' heartbeats stop at the relay and become these frames: one line per node
  and interval instead of one per agent.
- :class:`VoteHold` is when a relay sends: it holds a step's votes until every sub that voted for
  the step before has voted for this one (or is gone), or ``hold_s`` passed, and sends them before
  any other line, so each agent's lines keep their order. Holding never changes a decision (the
  controller commits only when every vote is in); at worst a vote reaches it ``hold_s`` later.
- Controller -> relay: ``@<k>,<k>,... <line>`` (deliver ``line`` to each of these subs; a decision
  goes to a node's ranks as one frame) and ``!<k>`` (close sub ``k``).
- :func:`parse_up` and :func:`parse_down` split one frame (without or with its newline) and raise
  :class:`~tmslurm.core.errors.ProtocolError` on anything else; they never raise another error.
  :class:`SubChannel` is the controller's channel to one sub: a
  :class:`~tmslurm.wire.protocol.GateSide` like a :class:`~tmslurm.wire.protocol.GateChannel`,
  through the relay's connection.
- :func:`up_votes` builds its frame's JSON body from the held votes' decoded dicts, not through a
  :class:`~tmslurm.wire.messages.NodeVotes` model: it runs on the relay for every step of every node
  (and in the load generator), and the controller validates the frame in one call anyway.
- Why a hand-made prefix and not a JSON envelope: the line inside is the agent's own bytes, which
  the gate parses and validates exactly as it would on a direct connection; an envelope would make
  the relay and the controller decode and re-encode every message once more.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tmslurm.core.errors import ProtocolError
from tmslurm.wire.protocol import GateChannel, GateSide

MAX_SUB = 1 << 20
HOLD_S = 0.01
"""How long a relay holds a step's votes at most, waiting for the rest of its node's."""
"""Sub numbers are 1..MAX_SUB."""


@dataclass(frozen=True)
class Line:
    """``<k> <line>``: a line of sub ``k``."""

    sub: int
    line: bytes


@dataclass(frozen=True)
class Votes:
    """``V<k>,... <node votes>``: the votes of these subs (one JSON object by column, same order)."""

    subs: tuple[int, ...]
    payload: bytes


@dataclass(frozen=True)
class Gone:
    """``-<k>``: sub ``k`` closed its connection to the relay."""

    sub: int


@dataclass(frozen=True)
class Alive:
    """``+<k>,...``: these subs were heard since the relay's last such frame."""

    subs: tuple[int, ...]


@dataclass(frozen=True)
class Deliver:
    """``@<k>,... <line>``: the line for each of these subs."""

    subs: tuple[int, ...]
    line: bytes


@dataclass(frozen=True)
class Close:
    """``!<k>``: close sub ``k``."""

    sub: int


def _sub(text: bytes) -> int:
    if not text.isdigit() or len(text) > 7:
        raise ProtocolError(f"bad sub number {text[:20]!r}")
    k = int(text)
    if not 1 <= k <= MAX_SUB:
        raise ProtocolError(f"sub number {k} is outside 1..{MAX_SUB}")
    return k


def _subs(text: bytes) -> tuple[int, ...]:
    if not text:
        return ()
    if not text.replace(b",", b"").isdigit():  # digits and commas only (int() would take "+1", " 1", "1_0")
        raise ProtocolError(f"bad sub list {text[:40]!r}")
    try:
        subs = tuple(map(int, text.split(b",")))
    except ValueError:  # an empty item
        raise ProtocolError(f"bad sub list {text[:40]!r}") from None
    if min(subs) < 1 or max(subs) > MAX_SUB:
        raise ProtocolError(f"a sub number is outside 1..{MAX_SUB}: {text[:40]!r}")
    return subs


def parse_up(frame: bytes) -> Line | Votes | Gone | Alive:
    """One relay -> controller frame."""
    frame = frame.rstrip(b"\n")
    if frame[:1] == b"V":
        head, sep, rest = frame[1:].partition(b" ")
        if not sep or not head:
            raise ProtocolError(f"a vote frame names no sub or no votes: {frame[:60]!r}")
        return Votes(_subs(head), rest)
    if frame[:1] == b"-":
        return Gone(_sub(frame[1:]))
    if frame[:1] == b"+":
        return Alive(_subs(frame[1:]))
    head, sep, rest = frame.partition(b" ")
    if not sep:
        raise ProtocolError(f"not a relay frame: {frame[:60]!r}")
    return Line(_sub(head), rest + b"\n")


def parse_down(frame: bytes) -> Deliver | Close:
    """One controller -> relay frame."""
    frame = frame.rstrip(b"\n")
    if frame[:1] == b"!":
        return Close(_sub(frame[1:]))
    if frame[:1] != b"@":
        raise ProtocolError(f"not a relay frame: {frame[:60]!r}")
    head, sep, rest = frame[1:].partition(b" ")
    if not sep or not head:
        raise ProtocolError(f"a delivery names no sub or no line: {frame[:60]!r}")
    return Deliver(_subs(head), rest + b"\n")


def up_line(sub: int, line: bytes) -> bytes:
    return b"%d %s" % (sub, line if line.endswith(b"\n") else line + b"\n")


COLUMNS = ("rank", "loss", "dt", "peak_rss_mb", "digest", "busy", "ckpt")


def up_votes(subs: list[int], votes: list[dict[str, Any]]) -> bytes:
    """The frame of these subs' votes (decoded ``vote`` objects of one step and epoch)."""
    first = votes[0]
    body = {
        "type": "votes",
        "step": first["step"],
        "epoch": first["epoch"],
        **{c: [v.get(c) for v in votes] for c in COLUMNS},
    }
    return b"V" + b",".join(b"%d" % k for k in subs) + b" " + json.dumps(body, separators=(",", ":")).encode() + b"\n"


def is_vote(obj: Any) -> bool:
    """A decoded line a relay may aggregate: a vote whose every field a :class:`~tmslurm.wire.messages.NodeVotes`
    would accept, and no other field. Anything else is forwarded as it is, so the controller judges
    it and answers that agent alone (one bad vote must not spoil its node's frame)."""
    if not (isinstance(obj, dict) and obj.get("type") == "vote" and set(obj) <= VOTE_KEYS and REQUIRED <= set(obj)):
        return False
    loss, digest, busy, ckpt = obj.get("loss"), obj.get("digest"), obj.get("busy"), obj.get("ckpt")
    return (
        all(_count(obj[k]) for k in ("step", "epoch", "rank"))
        and _amount(obj["dt"])
        and _amount(obj["peak_rss_mb"])
        and (busy is None or _amount(busy))
        and (ckpt is None or _amount(ckpt))
        and (loss is None or type(loss) in (int, float))
        and (digest is None or (type(digest) is str and 1 <= len(digest) <= 128))
    )


def _count(x: Any) -> bool:
    return type(x) is int and 0 <= x <= 2**31


def _amount(x: Any) -> bool:
    return type(x) in (int, float) and math.isfinite(x) and 0.0 <= x <= 1e9


VOTE_KEYS = {"type", "step", "epoch", "rank", "loss", "dt", "peak_rss_mb", "digest", "busy", "ckpt"}
REQUIRED = {"step", "epoch", "rank", "dt", "peak_rss_mb"}


def up_gone(sub: int) -> bytes:
    return b"-%d\n" % sub


def up_alive(subs: list[int]) -> bytes:
    return b"+" + b",".join(b"%d" % k for k in subs) + b"\n"


def deliver(subs: list[int], line: bytes) -> bytes:
    """The frame that hands ``line`` (one encoded line) to each of ``subs``."""
    return b"@" + b",".join(b"%d" % k for k in subs) + b" " + line


def close_frame(sub: int) -> bytes:
    return b"!%d\n" % sub


def relay_address(run_dir: Path, node: str) -> str:
    """The abstract unix socket name of ``node``'s relay for this run (an abstract name has no file
    to clean up and no path-length limit; it is private to the node's network namespace)."""
    digest = hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]
    return f"\0tmslurm-relay-{digest}-{node}"


class VoteHold:
    """A relay's vote aggregation (pure: the caller passes the clock and sends what it returns)."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self.held: dict[int, dict[str, Any]] = {}
        self.key: tuple[Any, Any] = (-1, -1)
        """The step and epoch of the held votes."""
        self.since = 0.0
        self.voters: dict[int, set[int]] = {}
        """Step -> the subs that voted for it (the last two steps)."""

    def vote(self, sub: int, vote: dict[str, Any], now: float) -> list[bytes]:
        """Sub ``sub`` sent ``vote`` (see :func:`is_vote`): the frames to send now (maybe none)."""
        key = (vote["step"], vote["epoch"])
        out = self.flush() if self.held and (key != self.key or sub in self.held) else []
        if not self.held:
            self.key, self.since = key, now
        self.held[sub] = vote
        step = vote["step"]
        if isinstance(step, int):
            self.voters.setdefault(step, set()).add(sub)
            for old in [s for s in self.voters if s < step - 1]:
                del self.voters[old]
        return out + (self.flush() if self._complete() else [])

    def other(self) -> list[bytes]:
        """Any other line is about to go: the held votes go first."""
        return self.flush()

    def gone(self, sub: int) -> list[bytes]:
        for subs in self.voters.values():
            subs.discard(sub)
        if sub in self.held:
            return self.flush()
        return self.flush() if self.held and self._complete() else []

    def due(self, now: float) -> list[bytes]:
        """Send what was held for ``hold_s``."""
        return self.flush() if self.held and now - self.since >= self.hold_s else []

    def deadline(self) -> float | None:
        return self.since + self.hold_s if self.held else None

    def flush(self) -> list[bytes]:
        if not self.held:
            return []
        subs = sorted(self.held)
        frame = up_votes(subs, [self.held[k] for k in subs])
        self.held = {}
        return [frame]

    def _complete(self) -> bool:
        step = self.key[0]
        before = self.voters.get(step - 1) if isinstance(step, int) else None
        return before is not None and before <= set(self.held)


class SubChannel(GateSide):
    """The controller's channel to one agent behind a relay: sends go through the relay's
    connection with the sub's prefix; ``close()`` tells the relay to close that agent's socket."""

    def __init__(self, relay: GateChannel, sub: int) -> None:
        self.relay = relay
        self.sub = sub
        self.closed = False

    def send_line(self, data: bytes) -> None:
        if self.closed:
            raise OSError("the controller closed this agent's channel")
        self.relay.send_line(deliver([self.sub], data))

    def send_now_line(self, data: bytes) -> bool:
        return self.relay.send_now_line(deliver([self.sub], data))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.relay.try_send_line(close_frame(self.sub))
