"""The load generator of ``bench control``: many simulated agents in one thread, over one selector.

Contract:
- :class:`LoadGen` connects one :class:`~tmslurm.bench.simagent.SimAgent` per worker rank and per
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
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from tmslurm.bench.simagent import Phase, Reply, SimAgent
from tmslurm.messages import (Abort, Aborted, Activate, BadMessage, Cancel, Decision, Heartbeat, Join, Joined, Msg,
                              Prepare, Prepared, Recover, Recovered, Switched, Vote, Welcome, decode_controller, encode)

log = logging.getLogger(__name__)
T = TypeVar("T")
HB_LINE = encode(Heartbeat(type="hb"))


@dataclass
class Stamp:
    first: float
    last: float
    count: int = 1

    def add(self, t: float) -> None:
        self.last = max(self.last, t)
        self.count += 1


def key_of(msg: Msg) -> int:
    """What a message is about: its step (decision, vote) or its epoch; -1 for the others."""
    if isinstance(msg, (Decision, Vote)):
        return msg.step
    if isinstance(msg, (Abort, Prepare, Join, Activate, Recover, Cancel, Prepared, Switched, Aborted, Recovered, Joined)):
        return msg.epoch
    return -1


@dataclass
class Recorder:
    sent: dict[tuple[str, int], Stamp] = field(default_factory=dict)
    recv: dict[tuple[str, int], Stamp] = field(default_factory=dict)

    @staticmethod
    def mark(table: dict[tuple[str, int], Stamp], msg: Msg, t: float) -> Stamp:
        key = (msg.type, key_of(msg))  # type: ignore[attr-defined]
        stamp = table.get(key)
        if stamp is None:
            stamp = table[key] = Stamp(t, t)
        else:
            stamp.add(t)
        return stamp


@dataclass(eq=False)
class Conn:
    agent: SimAgent
    sock: socket.socket
    rbuf: bytes = b""
    out: bytearray = field(default_factory=bytearray)
    welcomed: bool = False
    closed: bool = False
    connecting: bool = False
    vote_seq: int = 0
    sent_m: float = 0.0
    """When the last line went to the controller (monotonic)."""


class LoadGen:
    def __init__(self, host: str, port: int, agents: list[SimAgent], world: int, step_s: float, hb_s: float,
                 window: int = 16) -> None:
        self.addr = (host, port)
        self.world = world
        self.step_s = step_s
        self.hb_s = hb_s
        self.window = window
        self.sel = selectors.DefaultSelector()
        self.timers: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = itertools.count()
        self.commands: "queue.SimpleQueue[Callable[[], None]]" = queue.SimpleQueue()
        self.to_connect: deque[SimAgent] = deque(agents)
        self.total = len(agents)
        self.conns: list[Conn] = []
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
                    conn = key.data
                    if events & selectors.EVENT_WRITE:
                        self._connected(conn) if conn.connecting else self._flush(conn)
                    if events & selectors.EVENT_READ and not conn.closed:
                        self._read(conn)
                self._run_timers()
        except Exception as exc:
            self.error = repr(exc)
            raise
        finally:
            for conn in self.conns:
                if not conn.closed:
                    self._close(conn)

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
            agent = self.to_connect.popleft()
            self.t_first_connect = self.t_first_connect or time.monotonic()
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)  # never block the loop: a full accept backlog would stall every agent
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = Conn(agent, sock, connecting=True)
            self.conns.append(conn)
            self.pending += 1
            err = sock.connect_ex(self.addr)
            if err not in (0, errno.EINPROGRESS):
                self._lost(conn)
                continue
            self.sel.register(sock, selectors.EVENT_WRITE, conn)

    def _connected(self, conn: Conn) -> None:
        """A non-blocking connect finished: say hello, or count it as refused."""
        conn.connecting = False
        if conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
            self._lost(conn)
            return
        self.sel.modify(conn.sock, selectors.EVENT_READ, conn)
        self._send(conn, encode(conn.agent.hello()))

    def _read(self, conn: Conn) -> None:
        try:
            data = conn.sock.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._lost(conn)
            return
        lines = (conn.rbuf + data).split(b"\n")
        conn.rbuf = lines.pop()
        now = time.monotonic()
        for line in lines:
            msg = self._decode(line)
            if msg is not None and not conn.closed:
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
                self.pending -= 1
                self.admitted += 1
                if self.admitted == self.total:
                    self.t_admitted = now
                self._at(now + random.random() * self.hb_s, lambda: self._beat(conn))
                self._apply(conn, conn.agent.on_welcome(msg))
            return
        self._apply(conn, conn.agent.on_message(msg))

    def _lost(self, conn: Conn) -> None:
        """The controller closed this connection."""
        self._close(conn)
        if not conn.welcomed:
            self.pending -= 1
            if id(conn.agent) not in self._retried:  # dropped by the gate before authentication: one more try
                self._retried.add(id(conn.agent))
                self.retries += 1
                self.to_connect.append(conn.agent)
                conn.agent.phase = Phase.CONNECTING
            return
        if conn.agent.phase not in (Phase.CLOSED, Phase.DONE):
            self.fenced += 1
            if self.fenced <= 3:
                log.warning("the controller closed %s %d while it was %s", conn.agent.kind, conn.agent.ident,
                            conn.agent.phase.value)
        conn.agent.phase = Phase.CLOSED

    def _close(self, conn: Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        try:
            self.sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        if conn.out:
            try:
                conn.sock.setblocking(True)
                conn.sock.sendall(bytes(conn.out))
            except OSError:
                pass
        conn.sock.close()

    def _send(self, conn: Conn, data: bytes) -> None:
        if conn.closed:
            return
        conn.sent_m = time.monotonic()
        if conn.out:
            conn.out += data
            return
        try:
            n = conn.sock.send(data)
        except BlockingIOError:
            n = 0
        except OSError:
            return  # the read side sees the EOF
        if n < len(data):
            conn.out += data[n:]
            self.sel.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)

    def _flush(self, conn: Conn) -> None:
        try:
            n = conn.sock.send(conn.out)
        except BlockingIOError:
            return
        except OSError:
            conn.out.clear()
            n = 0
        del conn.out[:n]
        if not conn.out and not conn.closed:
            self.sel.modify(conn.sock, selectors.EVENT_READ, conn)

    # ---- the agents' actions ------------------------------------------------------------------
    def _apply(self, conn: Conn, reply: Reply) -> None:
        for msg in reply.send:
            self._send(conn, encode(msg))
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
        """As a real agent (:meth:`~tmslurm.runtime.link.Link._beat`): a heartbeat only after
        ``hb_s`` without any other line."""
        if conn.closed:
            return
        now = time.monotonic()
        if now - conn.sent_m >= self.hb_s:
            self._send(conn, HB_LINE)
            self.hb_sent += 1
        self._at(conn.sent_m + self.hb_s, lambda: self._beat(conn))

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
