"""The gate's side of node relays (:mod:`tmslurm.wire.mux`): a relay's connection carries many agents.

Contract: :class:`RelayFrames` is the part of :class:`~tmslurm.controller.gate.Gate` that reads a
node relay's frames, on the gate's reader thread. Each agent behind a relay (a :class:`Sub`) is
treated as if it had its own connection: its first line must be a ``hello`` with the run token
(anything else is refused and that agent alone is closed, ``!k``), then each line is validated and
queued as a :class:`~tmslurm.controller.items.MessageIn` under its own connection number; ``-k``
queues its :class:`~tmslurm.controller.items.Disconnected`; ``+k,...`` counts as a line from each
(``touch``). A vote frame is validated in one call and queued as one
:class:`~tmslurm.controller.items.VotesIn` (conn 0 for an agent refused in it; the controller
counts it as a line from each when it handles it, instead of one ``touch`` each here). A frame
that does not parse or validate gets an ``error`` reply on the relay's connection, is journalled
(``bad_message``) and changes nothing. At most ``GateLimits.max_relay_subs`` agents ride one relay.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tmslurm.controller.gateauth import Admission, GateLimits
from tmslurm.controller.items import Disconnected, HelloIn, Item, VotesIn
from tmslurm.core.errors import ProtocolError
from tmslurm.wire.messages import BadMessage, Hello, decode_votes
from tmslurm.wire.mux import Alive, Gone, SubChannel, Votes, parse_up
from tmslurm.wire.protocol import GateSide


@dataclass(eq=False)
class Sub:
    """An agent behind a node relay (:mod:`tmslurm.wire.mux`)."""

    ch: SubChannel
    conn: int = 0
    """The agent's number once its hello is queued; 0 before."""
    dead: bool = False
    """Refused: its lines are ignored until the relay says it is gone."""


class RelayFrames:
    """Mixed into the gate: the relay frames' handling (it keeps no state of its own)."""

    limits: GateLimits
    admission: Admission
    conns: Iterator[int]
    touch: Callable[[int], None]
    _emit: Callable[[Item], None]
    _agent_line: Callable[[int, GateSide, bytes], None]

    def _frame(self, c: Any, line: bytes) -> None:
        try:
            frame = parse_up(line)
        except ProtocolError as exc:
            self.admission.refuse(c.ch, "bad_message", f"malformed relay frame: {exc}", peer=c.peer)
            return
        if isinstance(frame, Alive):
            for k in frame.subs:
                sub = c.subs.get(k)
                if sub is not None and sub.conn:
                    self.touch(sub.conn)
        elif isinstance(frame, Votes):
            self._votes(c, frame)
        elif isinstance(frame, Gone):
            sub = c.subs.pop(frame.sub, None)
            if sub is not None and sub.conn:
                self._emit(Disconnected(sub.conn))
        else:
            sub = c.subs.get(frame.sub)
            if sub is None:
                sub = self._new_sub(c, frame.sub)
            if sub.conn:
                self._agent_line(sub.conn, sub.ch, frame.line)
            elif not sub.dead:
                self._sub_first(c, sub, frame.line)

    def _votes(self, c: Any, frame: Votes) -> None:
        """One step's votes of a node's agents, by column, validated in one call; a bad frame is
        answered on the relay's connection and changes nothing."""
        try:
            votes = decode_votes(json.loads(frame.payload))
        except (ValueError, RecursionError, BadMessage) as exc:
            self.admission.refuse(c.ch, "bad_message", f"malformed relay frame: {str(exc)[:200]}", peer=c.peer)
            return
        if len(votes.rank) != len(frame.subs):
            self.admission.refuse(
                c.ch, "bad_message", "malformed relay frame: a vote frame names one sub per rank", peer=c.peer
            )
            return
        conns = []
        for k in frame.subs:
            sub = c.subs.get(k) or self._new_sub(c, k)
            if not sub.conn:  # a vote before its hello: refused as a first line without a token is
                if not sub.dead:
                    self.admission.refuse(
                        sub.ch, "auth_refused", "refused: an agent's first line must be its hello", peer=c.peer
                    )
                    self._kill_sub(sub)
                conns.append(0)
                continue
            conns.append(sub.conn)
        self._emit(VotesIn(conns, votes))

    def _new_sub(self, c: Any, k: int) -> Sub:
        sub = c.subs[k] = Sub(SubChannel(c.ch, k))
        if len(c.subs) > self.limits.max_relay_subs:
            self.admission.refuse(
                sub.ch,
                "bad_message",
                f"refused: a relay may carry at most {self.limits.max_relay_subs} agents",
                peer=c.peer,
            )
            self._kill_sub(sub)
        return sub

    def _sub_first(self, c: Any, sub: Sub, line: bytes) -> None:
        """An agent's first line through a relay: authenticated like a direct one; only a hello may come this way."""
        if len(line) > self.limits.preauth_max_line:
            self.admission.refuse(
                sub.ch,
                "bad_message",
                f"malformed request: line longer than {self.limits.preauth_max_line} bytes",
                peer=c.peer,
            )
            self._kill_sub(sub)
            return
        first = self.admission.first(line, sub.ch, c.peer)
        if isinstance(first, Hello):
            sub.conn = next(self.conns)
            self._emit(HelloIn(first, sub.conn, sub.ch))
            return
        if first is not None:
            self.admission.refuse(
                sub.ch,
                "bad_message",
                "refused: only an agent's hello travels through a node relay; send requests to the controller directly",
                peer=c.peer,
            )
        self._kill_sub(sub)

    @staticmethod
    def _kill_sub(sub: Sub) -> None:
        sub.dead = True
        sub.ch.close()
