"""The node relay: a node's agents reach the controller through one connection (:mod:`tmslurm.wire.mux`).

Contract:
- :class:`Relay` listens on the node's abstract unix socket (:func:`~tmslurm.wire.mux.relay_address`)
  and accepts local agents of its own user only (``SO_PEERCRED``; anyone else is closed at once).
  It numbers them 1, 2, ... (a number is never reused while the relay lives) and carries their
  lines to the controller over one TCP connection, opened when an agent arrives and none is open,
  whose first line is a :class:`~tmslurm.wire.messages.RelayHello` with the run token. The agents' own
  lines (their hello and its token included) travel unchanged: the controller authenticates and
  validates each agent as it would on a direct connection; the relay only saves connections,
  lines and heartbeats, and grants nothing.
- Up: a heartbeat line stops here (the subs heard since the last ``+`` frame go up every
  ``hb_s``, one line for the node); a vote is held and sent by column with the node's other votes
  of that step (:class:`~tmslurm.wire.mux.VoteHold`); any other line is sent as ``<k> <line>``
  after the held votes, so each agent's lines keep their order. A line over
  :data:`~tmslurm.wire.protocol.MAX_LINE` closes that agent.
- Down: ``@<k>,... <line>`` is written to each named agent still connected (a blocking write on a
  local socket); ``!<k>`` closes agent ``k``. An agent that closes is reported as ``-<k>``.
- When the controller's connection ends or cannot be opened, every local agent's connection is
  closed: each sees what a direct connection would show (EOF), and an agent that may rejoin a
  restarted controller reconnects through the relay, which then connects again.
- :meth:`run` is the relay's one thread; :meth:`stop` ends it. A bug is logged and ends the relay
  (its agents see EOF); nothing else raises out of :meth:`run`.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tmslurm.core.errors import TmslurmError
from tmslurm.wire.messages import Heartbeat, RelayHello
from tmslurm.wire.mux import HOLD_S, Close, VoteHold, is_vote, parse_down, relay_address, up_alive, up_gone, up_line
from tmslurm.wire.protocol import MAX_LINE, controller_address, encode_line, read_token, shutdown

log = logging.getLogger(__name__)
HB_LINE = encode_line(Heartbeat()).rstrip(b"\n")
"""An agent's heartbeat line as its link sends it (without the newline): it stops at the relay."""
READ_CHUNK = 1 << 16
CONNECT_S = 5.0


@dataclass(eq=False)
class _Agent:
    sock: socket.socket
    sub: int
    buf: bytearray = field(default_factory=bytearray)


class Relay:
    def __init__(self, run_dir: Path, node: str, hb_s: float, hold_s: float = HOLD_S) -> None:
        self.run_dir = Path(run_dir)
        self.node = node
        self.hb_s = hb_s
        self.hold = VoteHold(hold_s)
        self.sel = selectors.DefaultSelector()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(relay_address(self.run_dir, node))  # OSError if another relay of this run serves the node
        self.listener.listen(256)
        self.listener.setblocking(False)
        self.sel.register(self.listener, selectors.EVENT_READ, None)
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.sel.register(self.wake_r, selectors.EVENT_READ, "wake")
        self.agents: dict[int, _Agent] = {}
        self.next_sub = 1
        self.up: socket.socket | None = None
        self.up_buf = bytearray()
        self.out: list[bytes] = []
        """Frames for the controller, written once per round."""
        self.heard: set[int] = set()
        self.beat_at = time.monotonic() + hb_s
        self.sent_m = time.monotonic()
        self.stopped = False

    def drain(self, timeout_s: float) -> None:
        """Wait (up to ``timeout_s``) until every local agent has closed: after the run's ``finish``,
        what the controller sent them is delivered before the relay goes."""
        deadline = time.monotonic() + timeout_s
        while self.agents and not self.stopped and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self) -> None:
        self.stopped = True
        try:
            self.wake_w.send(b"x")
        except OSError:
            pass

    # ---- the loop -------------------------------------------------------------------------------
    def run(self) -> None:
        try:
            while not self.stopped:
                for key, _ in self.sel.select(self._timeout()):
                    self._ready(key)
                now = time.monotonic()
                self._queue(self.hold.due(now))
                if now >= self.beat_at:
                    self._beat(now)
                self._send_up()
        except Exception:
            log.exception("the node relay of %s failed; its agents are disconnected", self.node)
        finally:
            self._drop_up()
            for s in (self.listener, self.wake_r, self.wake_w):
                s.close()
            self.sel.close()

    def _timeout(self) -> float:
        due = [self.beat_at]
        if (held := self.hold.deadline()) is not None:
            due.append(held)
        return max(0.0, min(due) - time.monotonic())

    def _ready(self, key: selectors.SelectorKey) -> None:
        if key.data is None:
            self._accept()
        elif key.data == "wake":
            self.wake_r.recv(64)
        elif key.data == "up":
            self._read_up()
        else:
            self._read_agent(key.data)

    def _beat(self, now: float) -> None:
        """One ``+`` frame: the subs heard only through heartbeats, or the relay's own when idle."""
        heard, self.heard = sorted(self.heard), set()
        if self.up is not None and (heard or now - self.sent_m >= self.hb_s):
            self._queue([up_alive(heard)])
        self.beat_at = now + self.hb_s

    # ---- the controller's side --------------------------------------------------------------------
    def _connect_up(self) -> bool:
        try:
            addr = controller_address(self.run_dir, timeout_s=CONNECT_S)
            sock = socket.create_connection((addr["host"], addr["port"]), timeout=CONNECT_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(encode_line(RelayHello(token=read_token(self.run_dir), node=self.node)))
        except (OSError, TmslurmError, KeyError, TypeError, ValueError) as exc:
            log.warning("node relay %s cannot reach the controller: %s", self.node, exc)
            return False
        sock.settimeout(None)
        self.up = sock
        self.up_buf.clear()
        self.hold = VoteHold(self.hold.hold_s)
        self.sel.register(sock, selectors.EVENT_READ, "up")
        log.info("node relay %s connected to the controller", self.node)
        return True

    def _read_up(self) -> None:
        assert self.up is not None
        try:
            data = self.up.recv(READ_CHUNK)
        except OSError:
            data = b""
        if not data:
            log.warning(
                "node relay %s: the controller's connection closed; disconnecting %d agents",
                self.node,
                len(self.agents),
            )
            self._drop_up()
            return
        self.up_buf += data
        start = 0
        while (end := self.up_buf.find(b"\n", start)) >= 0:
            self._down(bytes(self.up_buf[start : end + 1]))
            start = end + 1
        del self.up_buf[:start]

    def _down(self, line: bytes) -> None:
        try:
            frame = parse_down(line)
        except Exception as exc:  # the controller's own error reply, or a bug: logged, never fatal
            log.error("node relay %s: not a relay frame from the controller: %s (%s)", self.node, line[:200], exc)
            return
        if isinstance(frame, Close):
            agent = self.agents.get(frame.sub)
            if agent is not None:
                self._gone(agent)
            return
        for k in frame.subs:
            agent = self.agents.get(k)
            if agent is not None:
                try:
                    agent.sock.sendall(frame.line)
                except OSError:
                    self._gone(agent)

    def _drop_up(self) -> None:
        """No controller: every agent is disconnected, as a direct connection would be."""
        for agent in list(self.agents.values()):
            self._close_agent(agent)
        self.agents.clear()
        self.out.clear()
        self.hold = VoteHold(self.hold.hold_s)
        if self.up is not None:
            self.sel.unregister(self.up)
            shutdown(self.up)
            self.up.close()
            self.up = None

    def _queue(self, frames: list[bytes]) -> None:
        self.out.extend(frames)

    def _send_up(self) -> None:
        if not self.out:
            return
        data, self.out = b"".join(self.out), []
        if self.up is None:
            return
        try:
            self.up.sendall(data)
            self.sent_m = time.monotonic()
        except OSError:
            self._drop_up()

    # ---- the agents' side -------------------------------------------------------------------------
    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("node relay %s: accept failed: %s", self.node, exc)
                return
            if not _same_user(sock) or (self.up is None and not self._connect_up()):
                sock.close()
                continue
            sock.setblocking(True)  # writes to a local agent block; reads happen only when select says so
            agent = _Agent(sock, self.next_sub)
            self.next_sub += 1
            self.agents[agent.sub] = agent
            self.sel.register(sock, selectors.EVENT_READ, agent)

    def _read_agent(self, agent: _Agent) -> None:
        try:
            data = agent.sock.recv(READ_CHUNK, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._gone(agent)
            return
        agent.buf += data
        start = 0
        while (end := agent.buf.find(b"\n", start)) >= 0:
            self._line(agent, bytes(agent.buf[start : end + 1]))
            start = end + 1
        del agent.buf[:start]
        if len(agent.buf) > MAX_LINE:
            log.error("node relay %s: agent %d sent a line over %d bytes; closing it", self.node, agent.sub, MAX_LINE)
            self._gone(agent)

    def _line(self, agent: _Agent, line: bytes) -> None:
        if agent.sub not in self.agents:
            return
        if len(line) > MAX_LINE:
            log.error("node relay %s: agent %d sent a line over %d bytes; closing it", self.node, agent.sub, MAX_LINE)
            self._gone(agent)
            return
        if line.rstrip(b"\n") == HB_LINE:
            self.heard.add(agent.sub)
            return
        self.heard.discard(agent.sub)  # this line proves it alive
        vote = _vote(line)
        if vote is not None:
            self._queue(self.hold.vote(agent.sub, vote, time.monotonic()))
        else:
            self._queue(self.hold.other() + [up_line(agent.sub, line)])

    def _gone(self, agent: _Agent) -> None:
        if self.agents.pop(agent.sub, None) is None:
            return
        self._close_agent(agent)
        self._queue(self.hold.gone(agent.sub) + [up_gone(agent.sub)])

    def _close_agent(self, agent: _Agent) -> None:
        try:
            self.sel.unregister(agent.sock)
        except (KeyError, ValueError):
            pass
        shutdown(agent.sock)
        agent.sock.close()


def _vote(line: bytes) -> dict | None:
    if b'"vote"' not in line:  # most lines are not votes: skip the parse
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if is_vote(obj) else None


def _same_user(sock: socket.socket) -> bool:
    try:
        _, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    except OSError:
        return False
    return uid == os.getuid()


def connect_local(run_dir: Path, node: str, timeout_s: float) -> socket.socket:
    """A connection to ``node``'s relay, waiting up to ``timeout_s`` for it to listen (the node's
    monitor starts it); TmslurmError when it does not."""
    deadline = time.monotonic() + timeout_s
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(relay_address(run_dir, node))
            return sock
        except OSError as exc:
            sock.close()
            if time.monotonic() > deadline:
                raise TmslurmError(
                    f"the node relay of {node} is not listening ({exc}): is the node's monitor "
                    "running? (runtime.relay=true needs detect.monitors=true)"
                ) from None
            time.sleep(0.05)


def start_relay(run_dir: Path, node: str, hb_s: float) -> Relay:
    """A relay for ``node`` running on its own thread; TmslurmError when it cannot listen."""
    try:
        relay = Relay(run_dir, node, hb_s)
    except OSError as exc:
        raise TmslurmError(
            f"cannot start the node relay of {node}: {exc} (is another monitor of this run on the node?)"
        ) from None
    threading.Thread(target=relay.run, name="node-relay", daemon=True).start()
    return relay
