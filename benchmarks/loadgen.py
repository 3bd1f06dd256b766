"""The load generator of ``bench control``: many simulated agents in one thread, over one selector.

Contract:
- :class:`LoadGen` connects one :class:`~benchmarks.simagent.SimAgent` per worker rank and per
  standby to a real controller over loopback TCP, at most ``window`` hellos waiting for their
  ``welcome`` at once (the gate drops connections beyond ``GateLimits.max_unauthenticated``), and
  then plays every agent's part: a heartbeat after ``hb_s`` without another line (each agent at its own phase), a vote
  ``step_s`` after each decision, the replies of the reply logic, the state hand-overs between a
  leaver or source and its joiner, and the recovery barrier. Everything runs on the thread that
  calls :meth:`LoadGen.run`; other threads use :meth:`call` / :meth:`query` / :meth:`stop`.
- :attr:`LoadGen.rec` stamps every message sent and received, by type and step (decision, vote)
  or epoch (the rest): first and last time (monotonic) and count. :attr:`last_complete` is the
  highest step whose decision every one of the ``world`` slot owners received.
- Failure behaviour: a controller line that does not decode is counted in ``bad_lines`` and
  dropped; a connection the controller closes before ``welcome`` is retried once (``retries``);
  one it closes later while the agent still works is counted in ``fenced``. Nothing raises out of
  :meth:`run` but a bug, which sets :attr:`error` before it propagates.
"""

from __future__ import annotations

import errno
import heapq
import itertools
import json
import logging
import queue
import random
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from benchmarks.loadrec import ANC_SIZE, SO_TIMESTAMPNS, Recorder, arrival_m
from benchmarks.simagent import Phase, Reply, SimAgent
from tmslurm.core.errors import ProtocolError
from tmslurm.wire.messages import (
    Abort,
    BadMessage,
    Decision,
    Heartbeat,
    RelayHello,
    Vote,
    Welcome,
    decode_controller,
    encode,
)
from tmslurm.wire.mux import HOLD_S, Close, VoteHold, parse_down, up_alive, up_gone, up_line

log = logging.getLogger(__name__)
T = TypeVar("T")
HB_LINE = encode(Heartbeat(type="hb"))


@dataclass(eq=False)
class Pipe:
    """One TCP connection to the controller: one agent's own, or a simulated node relay's carrying
    its node's agents as subs (:mod:`tmslurm.wire.mux`)."""

    sock: socket.socket
    relay: str | None = None
    """The node, for a relay's connection."""
    hold: VoteHold = field(default_factory=lambda: VoteHold(HOLD_S))
    """A relay's vote aggregation, as the real relay's."""
    subs: dict[int, Conn] = field(default_factory=dict)
    rbuf: bytes = b""
    out: bytearray = field(default_factory=bytearray)
    connecting: bool = True
    closed: bool = False
    sent_m: float = 0.0
    waiting: bool = True
    """Counted in the generator's window of connections not yet admitted (until the first
    ``welcome`` on it: the gate has read its first line then)."""


@dataclass(eq=False)
class Conn:
    agent: SimAgent
    pipe: Pipe
    sub: int = 0
    """Its number behind a relay; 0 on its own connection."""
    welcomed: bool = False
    closed: bool = False
    vote_seq: int = 0
    sent_m: float = 0.0
    """When the last line went to the controller (monotonic)."""


class LoadGen:
    def __init__(
        self,
        host: str,
        port: int,
        agents: list[SimAgent],
        world: int,
        step_s: float,
        hb_s: float,
        window: int = 16,
        relay: bool = False,
    ) -> None:
        self.addr = (host, port)
        self.world = world
        self.step_s = step_s
        self.hb_s = hb_s
        self.window = window
        self.relay = relay
        """Each node's agents talk through one simulated node relay (one connection per node)."""
        self.sel = selectors.DefaultSelector()
        self.timers: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = itertools.count()
        self.commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.to_connect: deque[list[SimAgent]] = deque(_groups(agents) if relay else [[a] for a in agents])
        self.total = len(agents)
        self.conns: list[Conn] = []
        self.holding: set[Pipe] = set()
        """Relay pipes holding votes (sent when complete or after ``HOLD_S``)."""
        self.dirty: set[Pipe] = set()
        """Relay pipes with lines to send: a relay sends what it read in one round as one write."""
        self.pending = 0
        self.admitted = 0
        self.t_first_connect: float | None = None
        self.t_admitted: float | None = None
        self.rec = Recorder()
        self.last_complete = -1
        self.switch_step: dict[int, int] = {}
        """Epoch of a planned switch -> the step whose decision carried it."""
        self.abort_step: dict[int, int] = {}
        """Epoch of an abort -> the step it aborted (redone after the recovery)."""
        self.barriers: dict[int, list[Conn]] = {}
        self.given: dict[str, int] = {}
        self.takers: dict[str, Conn] = {}
        self.hb_sent = 0
        self.late_max_s = 0.0
        """How late a timer (a heartbeat, a vote) fired at worst: the generator's own lag."""
        self.bad_lines = 0
        self.retries = 0
        self.fenced = 0
        self.error: str | None = None
        self._cache: dict[bytes, Any] = {}
        self._retried: set[int] = set()
        self._stopped = threading.Event()

    # ---- other threads ------------------------------------------------------------------------
    def call(self, fn: Callable[[], None]) -> None:
        self.commands.put(fn)

    def query(self, fn: Callable[[], T], timeout: float = 30.0) -> T:
        """Run ``fn`` on the loop's thread and return its result (consistent reads of the records)."""
        fut: Future[T] = Future()
        self.call(lambda: fut.set_result(fn()))
        return fut.result(timeout)

    def kill(self, rank: int) -> tuple[float, int]:
        """Close the connection of the agent serving ``rank`` as a dying process would; when it closed,
        and the step it was at (a decision for that step already on its socket is lost with it)."""

        def close() -> tuple[float, int]:
            conn = next(c for c in self.conns if c.agent.rank == rank and not c.closed)
            conn.agent.phase = Phase.CLOSED
            self._close(conn)
            self._send_dirty()
            return time.monotonic(), conn.agent.step

        return self.query(close)

    def stop(self) -> None:
        self._stopped.set()

    # ---- the loop -----------------------------------------------------------------------------
    def run(self) -> None:
        try:
            while not self._stopped.is_set():
                self._connect_more()
                while not self.commands.empty():
                    self.commands.get()()
                wait = min(0.02, max(0.0, self.timers[0][0] - time.monotonic())) if self.timers else 0.02
                for key, events in self.sel.select(wait):
                    pipe = key.data
                    if events & selectors.EVENT_WRITE:
                        self._connected(pipe) if pipe.connecting else self._flush(pipe)
                    if events & selectors.EVENT_READ and not pipe.closed:
                        self._read(pipe)
                self._run_timers()
                self._release_held()
                self._send_dirty()
        except Exception as exc:
            self.error = repr(exc)
            raise
        finally:
            for conn in self.conns:
                if not conn.closed:
                    self._close(conn)
            self._send_dirty()

    def _at(self, t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self.timers, (t, next(self.seq), fn))

    def _run_timers(self) -> None:
        now = time.monotonic()
        while self.timers and self.timers[0][0] <= now:
            t, _, fn = heapq.heappop(self.timers)
            self.late_max_s = max(self.late_max_s, now - t)
            fn()

    # ---- connections --------------------------------------------------------------------------
    def _connect_more(self) -> None:
        while self.to_connect and self.pending < self.window:
            agents = self.to_connect.popleft()
            self.t_first_connect = self.t_first_connect or time.monotonic()
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)  # never block the loop: a full accept backlog would stall every agent
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            pipe = Pipe(sock, relay=agents[0].node if self.relay else None)
            for k, agent in enumerate(agents, start=1):
                conn = Conn(agent, pipe, sub=k if self.relay else 0)
                pipe.subs[conn.sub] = conn
                self.conns.append(conn)
            self.pending += 1
            err = sock.connect_ex(self.addr)
            if err not in (0, errno.EINPROGRESS):
                self._pipe_lost(pipe)
                continue
            self.sel.register(sock, selectors.EVENT_WRITE, pipe)

    def _connected(self, pipe: Pipe) -> None:
        """A non-blocking connect finished: say hello (a relay's, then each sub's), or count it as refused."""
        pipe.connecting = False
        if pipe.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
            self._pipe_lost(pipe)
            return
        self.sel.modify(pipe.sock, selectors.EVENT_READ, pipe)
        if pipe.relay is not None:
            token = next(iter(pipe.subs.values())).agent.token
            self._write(pipe, encode(RelayHello(type="relay", token=token, node=pipe.relay)))
            self._at(time.monotonic() + random.random() * self.hb_s, lambda: self._relay_beat(pipe))
        for conn in pipe.subs.values():
            self._send(conn, encode(conn.agent.hello()))

    def _read(self, pipe: Pipe) -> None:
        try:
            data, anc, _, _ = pipe.sock.recvmsg(1 << 16, ANC_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data, anc = b"", []
        if not data:
            self._pipe_lost(pipe)
            return
        lines = (pipe.rbuf + data).split(b"\n")
        pipe.rbuf = lines.pop()
        now = arrival_m(anc)
        for line in lines:
            if pipe.relay is None:
                msg = self._decode(line)
                conn = pipe.subs[0]
                if msg is not None and not conn.closed:
                    self._received(conn, msg, now)
            else:
                self._frame(pipe, line, now)

    def _frame(self, pipe: Pipe, line: bytes, now: float) -> None:
        try:
            frame = parse_down(line)
        except ProtocolError as exc:
            self.bad_lines += 1
            log.error("bad relay frame from the controller: %s", exc)
            return
        if isinstance(frame, Close):
            conn = pipe.subs.get(frame.sub)
            if conn is not None and not conn.closed:
                self._lost(conn)
            return
        msg = self._decode(frame.line.rstrip(b"\n"))
        for k in frame.subs:
            conn = pipe.subs.get(k)
            if msg is not None and conn is not None and not conn.closed:
                self._received(conn, msg, now)

    def _decode(self, line: bytes) -> Any:
        """The typed message of a line; identical lines (a broadcast) are decoded once."""
        msg = self._cache.get(line)
        if msg is None:
            try:
                msg = decode_controller(json.loads(line))
            except (ValueError, BadMessage) as exc:
                self.bad_lines += 1
                log.error("bad line from the controller: %s", str(exc)[:200])
                return None
            if len(self._cache) > 256:
                self._cache.clear()
            self._cache[line] = msg
        return msg

    def _received(self, conn: Conn, msg: Any, now: float) -> None:
        stamp = Recorder.mark(self.rec.recv, msg, now)
        if isinstance(msg, Decision):
            if msg.switch is not None:
                self.switch_step[msg.switch.epoch] = msg.step
            if stamp.count == self.world:
                self.last_complete = max(self.last_complete, msg.step)
        elif isinstance(msg, Abort):
            self.abort_step[msg.epoch] = msg.step
        if not conn.welcomed:
            if isinstance(msg, Welcome):
                conn.welcomed = True
                self._admitted(conn.pipe)
                self.admitted += 1
                if self.admitted == self.total:
                    self.t_admitted = now
                if conn.pipe.relay is None:  # behind a relay, the relay's frames are the heartbeats
                    self._at(now + random.random() * self.hb_s, lambda: self._beat(conn))
                self._apply(conn, conn.agent.on_welcome(msg))
            return
        self._apply(conn, conn.agent.on_message(msg))

    def _pipe_lost(self, pipe: Pipe) -> None:
        """The controller closed this connection (or it never opened): every agent on it is lost."""
        pipe.connecting = False
        self._admitted(pipe)
        conns = list(pipe.subs.values())
        if pipe.relay is not None and not any(c.welcomed for c in conns) and id(pipe) not in self._retried:
            self._retried.add(id(pipe))  # dropped by the gate before authentication: one more try
            self.retries += 1
            for c in conns:
                c.closed = True
            self.conns = [c for c in self.conns if c.pipe is not pipe]
            self.to_connect.append([c.agent for c in conns])
        for conn in conns:
            if not conn.closed:
                self._lost(conn)
        self._close_pipe(pipe)

    def _admitted(self, pipe: Pipe) -> None:
        if pipe.waiting:
            pipe.waiting = False
            self.pending -= 1

    def _lost(self, conn: Conn) -> None:
        """The controller closed this agent's connection."""
        self._close(conn)
        if not conn.welcomed:
            self._admitted(conn.pipe)
            if (
                conn.pipe.relay is None and id(conn.agent) not in self._retried
            ):  # dropped before authentication: one more try
                self._retried.add(id(conn.agent))
                self.retries += 1
                self.to_connect.append([conn.agent])
                conn.agent.phase = Phase.CONNECTING
            return
        if conn.agent.phase not in (Phase.CLOSED, Phase.DONE):
            self.fenced += 1
            if self.fenced <= 3:
                log.warning(
                    "the controller closed %s %d while it was %s",
                    conn.agent.kind,
                    conn.agent.ident,
                    conn.agent.phase.value,
                )
        conn.agent.phase = Phase.CLOSED

    def _close(self, conn: Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        pipe = conn.pipe
        if pipe.relay is None:
            self._close_pipe(pipe)
        elif not pipe.closed:
            for frame in pipe.hold.gone(conn.sub):
                self._write(pipe, frame)
            self._write(pipe, up_gone(conn.sub))

    def _close_pipe(self, pipe: Pipe) -> None:
        if pipe.closed:
            return
        pipe.closed = True
        self.dirty.discard(pipe)
        try:
            self.sel.unregister(pipe.sock)
        except (KeyError, ValueError):
            pass
        if pipe.out:
            try:
                pipe.sock.setblocking(True)
                pipe.sock.sendall(bytes(pipe.out))
            except OSError:
                pass
        pipe.sock.close()

    def _send(self, conn: Conn, data: bytes, vote: dict[str, Any] | None = None) -> None:
        """One line of ``conn``'s agent (behind a relay: framed, a vote held as the real relay holds
        it, and sent with the rest of the round)."""
        if conn.closed:
            return
        pipe = conn.pipe
        conn.sent_m = time.monotonic()
        if pipe.relay is None:
            self._write(pipe, data)
            self._send_now(pipe)
        elif vote is not None:
            for frame in pipe.hold.vote(conn.sub, vote, conn.sent_m):
                self._write(pipe, frame)
            if pipe.hold.held:
                self.holding.add(pipe)
            else:  # a real relay sends at the end of its round, which holds only its own node's lines
                self._send_now(pipe)
        else:
            for frame in pipe.hold.other():
                self._write(pipe, frame)
            self._write(pipe, up_line(conn.sub, data))
            self._send_now(pipe)

    def _write(self, pipe: Pipe, data: bytes) -> None:
        if not pipe.closed:
            pipe.sent_m = time.monotonic()
            pipe.out += data
            self.dirty.add(pipe)

    def _release_held(self) -> None:
        now = time.monotonic()
        for pipe in list(self.holding):
            for frame in pipe.hold.due(now):
                self._write(pipe, frame)
            if not pipe.hold.held:
                self.holding.discard(pipe)

    def _send_dirty(self) -> None:
        while self.dirty:
            self._send_now(self.dirty.pop())

    def _send_now(self, pipe: Pipe) -> None:
        self.dirty.discard(pipe)
        if pipe.closed or pipe.connecting or not pipe.out:
            return
        try:
            n = pipe.sock.send(pipe.out)
        except BlockingIOError:
            n = 0
        except OSError:
            return  # the read side sees the EOF
        del pipe.out[:n]
        if pipe.out:
            self.sel.modify(pipe.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, pipe)

    def _flush(self, pipe: Pipe) -> None:
        try:
            n = pipe.sock.send(pipe.out)
        except BlockingIOError:
            return
        except OSError:
            pipe.out.clear()
            n = 0
        del pipe.out[:n]
        if not pipe.out and not pipe.closed:
            self.sel.modify(pipe.sock, selectors.EVENT_READ, pipe)

    # ---- the agents' actions ------------------------------------------------------------------
    def _apply(self, conn: Conn, reply: Reply) -> None:
        for msg in reply.send:
            vote = msg.model_dump() if isinstance(msg, Vote) and conn.pipe.relay is not None else None
            self._send(conn, encode(msg), vote)
        now = time.monotonic()
        for msg in reply.send:
            Recorder.mark(self.rec.sent, msg, now)
        if reply.give is not None:
            self._give(*reply.give)
        if reply.take is not None:
            self._take(conn, reply.take)
        if reply.barrier is not None:
            self._arrive(conn, reply.barrier)
        if reply.vote_after_step:
            conn.vote_seq += 1
            seq = conn.vote_seq
            self._at(now + self.step_s, lambda: self._vote(conn, seq))
        if reply.close:
            self._close(conn)

    def _vote(self, conn: Conn, seq: int) -> None:
        if not conn.closed and seq == conn.vote_seq and conn.agent.phase is Phase.COMPUTING:
            self._apply(conn, conn.agent.vote())

    def _beat(self, conn: Conn) -> None:
        """As a real agent (:meth:`~tmslurm.agent.link.Link._beat`): a heartbeat only after
        ``hb_s`` without any other line."""
        if conn.closed:
            return
        now = time.monotonic()
        if now - conn.sent_m >= self.hb_s:
            self._send(conn, HB_LINE)
            self.hb_sent += 1
        self._at(conn.sent_m + self.hb_s, lambda: self._beat(conn))

    def _relay_beat(self, pipe: Pipe) -> None:
        """As a real relay (:mod:`tmslurm.agent.relay`): one ``+`` frame per interval for its live subs."""
        if pipe.closed:
            return
        now = time.monotonic()
        idle = [k for k, c in pipe.subs.items() if c.welcomed and not c.closed and now - c.sent_m >= self.hb_s]
        if idle or now - pipe.sent_m >= self.hb_s:  # as an agent's heartbeat: only for subs that sent nothing else
            self._write(pipe, up_alive(idle))
            self.hb_sent += 1
        self._at(now + self.hb_s, lambda: self._relay_beat(pipe))

    def _give(self, xfer: str, step: int) -> None:
        taker = self.takers.pop(xfer, None)
        if taker is None:
            self.given[xfer] = step
        elif not taker.closed:
            self._apply(taker, taker.agent.on_state(step))

    def _take(self, conn: Conn, xfer: str) -> None:
        if xfer in self.given:
            self._apply(conn, conn.agent.on_state(self.given.pop(xfer)))
        else:
            self.takers[xfer] = conn

    def _arrive(self, conn: Conn, epoch: int) -> None:
        """The recovery's first collective: nobody computes until every slot owner arrived."""
        waiting = self.barriers.setdefault(epoch, [])
        waiting.append(conn)
        if len(waiting) >= self.world:
            del self.barriers[epoch]
            for c in waiting:
                if not c.closed:
                    self._apply(c, c.agent.released())


def _groups(agents: list[SimAgent]) -> list[list[SimAgent]]:
    """The agents by node, in order of first appearance: one relay each."""
    nodes: dict[str, list[SimAgent]] = {}
    for a in agents:
        nodes.setdefault(a.node, []).append(a)
    return list(nodes.values())
