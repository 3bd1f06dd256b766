"""The controller's front door: accepts connections, authenticates, validates, and queues typed items.

Contract:
- One reader thread (``ctl-gate``) serves every connection: a :mod:`selectors` loop (epoll on
  Linux) over the listening socket and all connections, so the controller's thread count does not
  grow with the number of agents. It reads only what a socket says is there (never blocks on a
  client) and splits each connection's bytes into lines itself.
- Before authentication a connection gets ``limits.auth_timeout_s`` from its accept to send one
  line of at most ``limits.preauth_max_line`` bytes, and at most ``limits.max_unauthenticated``
  connections wait at once; an oversize, slow or surplus client is dropped and journalled
  (``preauth_dropped``), after its slot is free.
- The first line is authenticated, then validated, by :class:`~tmslurm.controller.gateauth.Admission`
  (the run token, or a signed notice's signature).
- Every later line is decoded into a typed message (:mod:`tmslurm.wire.messages`). A line that is not
  one (an agent's line over :data:`~tmslurm.wire.protocol.MAX_LINE` included) gets an ``error`` reply
  and a ``bad_message`` journal line; the connection stays open for an agent and is closed for a
  one-shot request. Nothing a client sends raises out of this module.
- Items handed to ``submit`` (in the order read per connection): ``HelloIn``, ``RequestIn``,
  ``MessageIn``, ``Disconnected`` (:mod:`tmslurm.controller.items`). The items of one ``select``
  round are handed over together, as one ``Batch`` when there are several (one queue hand-off per
  round instead of one per line: at a thousand agents the hand-offs were a quarter of the
  controller's time). ``conn`` is a number unique per connection, so a second client can never speak for another's.
  ``touch(conn)`` is called for every line read from an agent (heartbeats included; they are not
  queued). ``ch`` is a :class:`~tmslurm.wire.protocol.GateChannel`: the controller sends on it (blocking, from its own
  thread) and closes it; the gate keeps reading an agent's connection until EOF, so a ``close()``
  by the controller ends in one ``disconnect``. A request's connection is not read after its line.
- The gate's own error replies never wait for a client (:meth:`~tmslurm.controller.gateauth.Admission.refuse`):
  one that cannot be sent at once is skipped, and a connection whose line went out only in part is
  shut down (it reads as EOF).
- A connection whose first line is a node relay's ``relay`` (run token) carries many agents
  (:mod:`tmslurm.wire.mux`); each is authenticated, validated and queued as if it had its own
  connection (:mod:`tmslurm.controller.gaterelay`), and a node's votes come as one ``VotesIn``.
- After :meth:`Gate.close_requests` (the run is ending) a one-shot request is answered with an
  ``error`` by the gate itself and never queued; agents' lines still flow. After :meth:`Gate.stop`
  nothing more is accepted or read; agents' channels stay usable for sending until the controller
  closes them.
"""

from __future__ import annotations

import itertools
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tmslurm.controller.gateauth import Admission, GateLimits
from tmslurm.controller.gaterelay import RelayFrames, Sub
from tmslurm.controller.items import Batch, Disconnected, HelloIn, Item, MessageIn, RequestIn
from tmslurm.controller.journal import Journal
from tmslurm.core.errors import ProtocolError
from tmslurm.core.signing import NoticeVerifier
from tmslurm.wire.messages import BadMessage, ErrorReply, Hello, OneShot, RelayHello, decode_agent
from tmslurm.wire.protocol import MAX_LINE, MSG_DONTWAIT, GateChannel, GateSide, parse_line, shutdown

log = logging.getLogger(__name__)

READ_CHUNK = 1 << 16
ACCEPT_BATCH = 64
ACCEPT_BACKOFF_S = 0.5
STOP_JOIN_S = 5.0
DRAIN_MAX = 1 << 20
RELAY_PREFIX = 16
"""A relay's frame may exceed an agent's line limit by its sub prefix."""
_WAKE = "wake"


@dataclass(eq=False)
class _Conn:
    ch: GateChannel
    peer: str
    deadline: float
    """Monotonic time by which the first line must be complete."""
    conn: int = 0
    """The agent's number once its hello is queued; 0 before."""
    buf: bytearray = field(default_factory=bytearray)
    skipping: bool = False
    """Discarding the rest of an over-long line."""
    reading: bool = True
    relay: bool = False
    """A node relay's connection: its lines are frames of its subs."""
    subs: dict[int, Sub] = field(default_factory=dict)


class Gate(RelayFrames):
    def __init__(
        self,
        server: socket.socket,
        token: str,
        verifier: NoticeVerifier | None,
        journal: Journal,
        submit: Callable[[Item], None],
        touch: Callable[[int], None],
        limits: GateLimits,
    ) -> None:
        self.server = server
        self.admission = Admission(token, verifier, journal)
        self.journal = journal
        self.submit = submit
        self.touch = touch
        self.limits = limits
        self.conns = itertools.count(1)
        self.stopped = threading.Event()
        self.requests_lock = threading.Lock()
        self.requests_closed: str | None = None
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._pending: dict[_Conn, None] = {}  # unauthenticated, oldest (earliest deadline) first
        self._accept_paused_until: float | None = None
        self._thread: threading.Thread | None = None
        self._round: list[Item] = []
        """Items read in this select round, handed over together by :meth:`_flush`."""

    def start(self) -> None:
        self.server.setblocking(False)
        self._wake_r.setblocking(False)
        self._sel.register(self.server, selectors.EVENT_READ, None)
        self._sel.register(self._wake_r, selectors.EVENT_READ, _WAKE)
        self._thread = threading.Thread(target=self._run, name="ctl-gate", daemon=True)
        self._thread.start()

    def close_requests(self, why: str) -> None:
        """From now on answer one-shot requests with ``why``; none is queued after this returns."""
        with self.requests_lock:
            self.requests_closed = why

    def stop(self) -> None:
        """Accept and read nothing more; the listening socket is closed when this returns."""
        self.stopped.set()
        thread = self._thread
        if thread is None:
            self._close_all()
            return
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if thread is not threading.current_thread():
            thread.join(STOP_JOIN_S)
            if thread.is_alive():
                log.warning("the gate's reader did not stop within %.0f s; closing its listening socket", STOP_JOIN_S)
                _close(self.server)

    # ---- the loop -------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self.stopped.is_set():
                for key, _ in self._sel.select(self._timeout()):
                    self._ready(key)
                self._flush()
                self._expire(time.monotonic())
        except Exception:  # a bug, not a client: nothing more is read, loudly
            log.exception("the gate's reader failed; it reads no more connections")
        finally:
            self._close_all()

    def _timeout(self) -> float | None:
        due = [next(iter(self._pending)).deadline] if self._pending else []
        if self._accept_paused_until is not None:
            due.append(self._accept_paused_until)
        return max(0.0, min(due) - time.monotonic()) if due else None

    def _ready(self, key: selectors.SelectorKey) -> None:
        if key.data is None:
            self._accept()
        elif key.data is _WAKE:
            _drain(self._wake_r)
        elif key.data.reading:  # not a stale event of a connection let go earlier in this round
            c: _Conn = key.data
            try:
                self._read(c)
            except Exception:  # a bug on one connection must not end the others
                log.exception("the gate failed on a connection from %s; closing it", c.peer)
                shutdown(c.ch.sock)
                self._let_go(c)

    def _emit(self, item: Item) -> None:
        self._round.append(item)

    def _flush(self) -> None:
        if self._round:
            items, self._round = self._round, []
            self.submit(items[0] if len(items) == 1 else Batch(items))

    def _expire(self, now: float) -> None:
        while self._pending and (c := next(iter(self._pending))).deadline <= now:
            self._drop(c, "no complete line in time")
        if self._accept_paused_until is not None and now >= self._accept_paused_until:
            self._accept_paused_until = None
            self._sel.register(self.server, selectors.EVENT_READ, None)

    def _close_all(self) -> None:
        conns = [k.data for k in (self._sel.get_map() or {}).values() if isinstance(k.data, _Conn)]
        self._sel.close()
        for s in (self.server, self._wake_r, self._wake_w):
            _close(s)
        for c in conns:  # an agent's channel is the controller's to close; an unauthenticated one is ours
            c.reading = False
            if not c.conn:  # a relay's too (its subs' channels then fail to send)
                c.ch.close()
            c.ch.done_reading()

    # ---- connections ----------------------------------------------------------------------------
    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, peer = self.server.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:  # out of file descriptors, most likely: pause instead of spinning
                log.warning("accept failed (%s); accepting again in %.1f s", exc, ACCEPT_BACKOFF_S)
                self._sel.unregister(self.server)
                self._accept_paused_until = time.monotonic() + ACCEPT_BACKOFF_S
                return
            self._admit(sock, str(peer))

    def _admit(self, sock: socket.socket, peer: str) -> None:
        if len(self._pending) >= self.limits.max_unauthenticated:
            self.journal.write("preauth_dropped", peer=peer, why="too many unauthenticated connections")
            _close(sock)
            return
        sock.setblocking(True)  # the controller's sends block; the gate's reads never wait (MSG_DONTWAIT)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        c = _Conn(GateChannel(sock), peer, time.monotonic() + self.limits.auth_timeout_s)
        self._pending[c] = None
        self._sel.register(sock, selectors.EVENT_READ, c)

    def _read(self, c: _Conn) -> None:
        try:
            data = c.ch.sock.recv(READ_CHUNK, MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # reset, or shut down by the controller
            data = b""
        if not data:
            self._eof(c)
        elif c.conn or c.relay:
            self._agent_bytes(c, data)
        else:
            self._first_bytes(c, data)

    def _eof(self, c: _Conn) -> None:
        if c.buf and not c.skipping:  # a last line without its newline counts, as readline() would have it
            rest = bytes(c.buf)
            c.buf.clear()
            if c.conn or c.relay:
                self._line(c, rest)
            else:
                self._first_line(c, rest)
        self._let_go(c)

    def _let_go(self, c: _Conn) -> None:
        """Read no more of ``c``: an agent's socket stays the controller's to close (``disconnect``)."""
        if not c.reading:
            return
        if c.relay:  # every agent behind it is disconnected; the relay's channel is ours
            for sub in c.subs.values():
                if sub.conn:
                    self._emit(Disconnected(sub.conn))
            c.subs.clear()
            self._end(c)
            self.journal.write("relay_gone", peer=c.peer)
            return
        if not c.conn:
            self._end(c)
            return
        self._unregister(c)
        c.ch.done_reading()
        self._emit(Disconnected(c.conn))

    def _unregister(self, c: _Conn) -> None:
        c.reading = False
        self._pending.pop(c, None)
        self._sel.unregister(c.ch.sock)

    def _end(self, c: _Conn) -> None:
        """Close a connection the controller never got (what it sent already is read first: a FIN, not a reset)."""
        self._unregister(c)
        _drain(c.ch.sock, DRAIN_MAX)
        c.ch.close()
        c.ch.done_reading()

    def _drop(self, c: _Conn, why: str) -> None:
        self._end(c)  # the slot is free before the journal says so
        self.journal.write("preauth_dropped", peer=c.peer, why=why)

    # ---- the first line -------------------------------------------------------------------------
    def _first_bytes(self, c: _Conn, data: bytes) -> None:
        c.buf += data
        limit = self.limits.preauth_max_line
        end = c.buf.find(b"\n", 0, limit)
        if end < 0:
            if len(c.buf) >= limit:
                self._drop(c, f"line longer than {limit} bytes")
            return
        line = bytes(c.buf[: end + 1])
        del c.buf[: end + 1]
        self._first_line(c, line)

    def _first_line(self, c: _Conn, line: bytes) -> None:
        self._pending.pop(c, None)
        first = self.admission.first(line, c.ch, c.peer)
        if first is None:
            self._end(c)
        elif isinstance(first, (Hello, RelayHello)):
            if isinstance(first, Hello):
                c.conn = next(self.conns)
                self._emit(HelloIn(first, c.conn, c.ch))
            else:
                c.relay = True
                self.journal.write("relay", node=first.node, peer=c.peer)
            if c.buf:  # lines that came with the hello
                rest = bytes(c.buf)
                c.buf.clear()
                self._agent_bytes(c, rest)
        else:
            self._hand_over(c, first)

    def _hand_over(self, c: _Conn, request: OneShot) -> None:
        self._unregister(c)
        c.ch.done_reading()
        self._flush()  # what was read before it stays before it
        with self.requests_lock:
            why = self.requests_closed
            if why is None:
                self.submit(RequestIn(request, c.ch))
        if why is not None:
            c.ch.send_now(ErrorReply(error=why, ending=True))
            c.ch.close()

    # ---- an agent's lines -----------------------------------------------------------------------
    def _agent_bytes(self, c: _Conn, data: bytes) -> None:
        buf = c.buf
        buf += data
        start = 0
        limit = MAX_LINE + RELAY_PREFIX if c.relay else MAX_LINE
        while (end := buf.find(b"\n", start)) >= 0:
            line = bytes(buf[start : end + 1])
            start = end + 1
            if c.skipping:  # the tail of an over-long line, already answered
                c.skipping = False
            elif len(line) > limit:
                self._too_long(c)
            else:
                self._line(c, line)
        del buf[:start]
        if c.skipping:
            buf.clear()
        elif len(buf) >= limit:
            self._too_long(c)
            c.skipping = True
            buf.clear()

    def _too_long(self, c: _Conn) -> None:
        self.admission.refuse(c.ch, "bad_message", f"malformed message: line longer than {MAX_LINE} bytes", conn=c.conn)

    def _line(self, c: _Conn, line: bytes) -> None:
        if c.relay:
            self._frame(c, line)
        else:
            self._agent_line(c.conn, c.ch, line)

    def _agent_line(self, conn: int, ch: GateSide, line: bytes) -> None:
        try:
            raw = parse_line(line)
        except ProtocolError as exc:
            self.admission.refuse(ch, "bad_message", f"malformed message: {exc}", conn=conn)
            return
        self.touch(conn)
        self._agent_obj(conn, ch, raw)

    def _agent_obj(self, conn: int, ch: GateSide, raw: dict[str, object]) -> None:
        try:
            msg = decode_agent(raw)
        except BadMessage as exc:
            self.admission.refuse(ch, "bad_message", str(exc), conn=conn)
            return
        if msg.type != "hb":
            self._round.append(MessageIn(conn, msg))  # what _emit does, without its call: once per message


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass


def _drain(sock: socket.socket, most: int = 1 << 16) -> None:
    """Read and discard what is there (at most about ``most`` bytes) without waiting."""
    try:
        while most > 0 and (n := len(sock.recv(READ_CHUNK, MSG_DONTWAIT))):
            most -= n
    except OSError:
        pass
