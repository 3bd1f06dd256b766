"""The agent/control protocol transport: newline-delimited JSON over TCP, authenticated by the run's token.

Contract: the first message on every connection carries ``token`` (or, for a signed admin notice,
a signature); the controller compares it in constant time with the run token (``<run_dir>/token``,
mode 0600, created with O_EXCL) and refuses the connection otherwise.

Every channel is a :class:`LineChannel`: one primitive, :meth:`LineChannel.send_line` (one line
already encoded by :func:`encode_line`; raises ``OSError`` when it cannot), under which
:meth:`~LineChannel.send` (a :class:`~tmslurm.wire.messages.Msg` model), :meth:`~LineChannel.try_send`
and :meth:`~LineChannel.try_send_line` (``False`` instead of ``OSError``) are implemented once. Three
implement it: :class:`Channel` (a direct connection with its own reader: an agent's, a client's),
:class:`GateChannel` (the controller's side of a connection its gate reads) and
:class:`~tmslurm.wire.mux.SubChannel` (the controller's side of one agent behind a node relay). The
last two are a :class:`GateSide`, which adds :meth:`GateSide.send_now` (a reply that never waits
for the peer). A socket channel sends whole lines under a lock (safe from several threads).

:meth:`Channel.recv` returns ``None`` on EOF and raises :class:`~tmslurm.core.errors.ProtocolError` on a
line that is not a JSON object with a string ``type``, :class:`LineTooLong` on a line over its limit
(the rest of that line is discarded, so the stream stays in sync) and :class:`ReadTimeout` when the
socket's timeout passes. The gate reads a :class:`GateChannel`'s socket itself, with
:func:`parse_line` for each line. What the fields mean and which are valid is
:mod:`tmslurm.wire.messages`' business.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import socket
import threading
import time
from pathlib import Path
from typing import Any

from tmslurm.core.errors import AuthError, ProtocolError, TmslurmError
from tmslurm.core.rundir import RunDir
from tmslurm.wire.messages import Msg

MAX_LINE = 1 << 20
MSG_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)
REPLY_LOCK_S = 0.1
"""How long :meth:`GateChannel.send_now` waits for a send in progress before giving up."""


class LineTooLong(ProtocolError):
    """A line longer than the channel's limit."""


class ReadTimeout(ProtocolError):
    """No complete line within the socket's timeout."""


def encode_line(msg: Msg | dict[str, Any]) -> bytes:
    """A :class:`~tmslurm.wire.messages.Msg` (or, for a raw line such as a client's untyped request,
    a dict) as one JSON line."""
    if hasattr(msg, "model_dump"):
        msg = msg.model_dump(mode="json")
    return (json.dumps(msg, separators=(",", ":")) + "\n").encode()


def parse_line(line: bytes) -> dict[str, Any]:
    """One received line as a JSON object with a string ``type``; :class:`ProtocolError` otherwise."""
    try:
        msg = json.loads(line)
    except (ValueError, RecursionError):
        raise ProtocolError(f"not JSON: {line[:120]!r}") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
        raise ProtocolError(f"a message must be a JSON object with a string 'type': {line[:120]!r}")
    return msg


class LineChannel:
    """What every channel is: sends built once on :meth:`send_line`, the one primitive an
    implementation provides (with :meth:`close`). Not an ``abc.ABC``: the controller's fan-out tests
    ``isinstance`` per agent and per decision, and ``ABCMeta``'s check costs several times a plain one."""

    closed: bool

    def send_line(self, data: bytes) -> None:
        """Send one line already encoded by :func:`encode_line` (a broadcast encodes once);
        ``OSError`` when it cannot."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def send(self, msg: Msg) -> None:
        """Send a message model as one line."""
        self.send_line(encode_line(msg))

    def try_send_line(self, data: bytes) -> bool:
        try:
            self.send_line(data)
            return True
        except OSError:
            return False

    def try_send(self, msg: Msg) -> bool:
        return self.try_send_line(encode_line(msg))


class GateSide(LineChannel):
    """The controller's side of a connection its gate reads (:mod:`tmslurm.controller.gate`): a
    :class:`GateChannel` or a relay's :class:`~tmslurm.wire.mux.SubChannel`. Adds the gate's own
    replies, which never wait for the peer, on :meth:`send_now_line`."""

    def send_now_line(self, data: bytes) -> bool:
        """Send one encoded line without waiting for the peer; False when it did not go out whole."""
        raise NotImplementedError

    def send_now(self, msg: Msg) -> bool:
        """:meth:`send_now_line` of a message model."""
        return self.send_now_line(encode_line(msg))


class SocketChannel(LineChannel):
    """A channel over its own socket: whole lines under a lock, so several threads may send."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._lock = threading.Lock()
        self.closed = False

    def send_line(self, data: bytes) -> None:
        with self._lock:
            self.sock.sendall(data)

    def close(self) -> None:
        self.closed = True
        shutdown(self.sock)
        self.sock.close()


class Channel(SocketChannel):
    """A direct connection with its own reader (an agent's, a client's)."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(sock)
        self._rfile = sock.makefile("rb")

    def recv(self, max_line: int = MAX_LINE) -> dict[str, Any] | None:
        line = self._readline(max_line)
        if not line:
            return None
        if not line.endswith(b"\n") and len(line) >= max_line:
            self._discard_rest(max_line)
            raise LineTooLong(f"line longer than {max_line} bytes")
        return parse_line(line)

    def _readline(self, limit: int) -> bytes:
        try:
            return self._rfile.readline(limit)
        except TimeoutError:
            raise ReadTimeout("no complete line in time") from None
        except (OSError, ValueError):
            return b""

    def _discard_rest(self, chunk: int) -> None:
        while True:
            part = self._readline(chunk)
            if not part or part.endswith(b"\n"):
                return


class GateChannel(SocketChannel, GateSide):
    """A channel whose socket the controller's gate reads (:mod:`tmslurm.controller.gate`): it sends
    like :class:`Channel` and has no reader of its own. ``close()`` shuts the connection down at
    once; the socket is freed once the gate has stopped reading it too (:meth:`done_reading`), so the
    gate never reads a descriptor closed, and perhaps reused, under it.
    """

    def __init__(self, sock: socket.socket) -> None:  # no makefile: the gate reads the socket itself
        super().__init__(sock)
        self._state = threading.Lock()
        self._reading = True

    def close(self) -> None:
        with self._state:
            self.closed = True
            free = not self._reading
        shutdown(self.sock)
        if free:
            self.sock.close()

    def done_reading(self) -> None:
        """The gate reads no more: free the socket if the controller has closed it too."""
        with self._state:
            self._reading = False
            free = self.closed
        if free:
            self.sock.close()

    def send_now_line(self, data: bytes) -> bool:
        """Send one line without waiting for the peer; a partly sent line shuts the connection down."""
        if not self._lock.acquire(timeout=REPLY_LOCK_S):
            return False
        try:
            sent = self.sock.send(data, MSG_DONTWAIT)
        except OSError:  # would block (the peer reads nothing), or it is gone
            sent = 0
        finally:
            self._lock.release()
        if 0 < sent < len(data):  # the line is cut: nothing after it could be read right
            shutdown(self.sock)
        return sent == len(data)


def shutdown(sock: socket.socket) -> None:
    """Shut both directions down (the peer and any reader see EOF); errors are ignored."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def connect(host: str, port: int, timeout_s: float = 10.0, *, attempt_s: float = 5.0) -> Channel:
    """Connect to ``host:port``, trying again until ``timeout_s`` has passed (``0``: one try); each
    try waits at most ``attempt_s`` for an answer. :class:`TmslurmError` (``unreachable``) when none
    succeeded."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=attempt_s)
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return Channel(sock)
        except OSError as exc:
            if time.monotonic() >= deadline:
                why = f"no answer within {attempt_s:g} s" if isinstance(exc, TimeoutError) else str(exc)
                raise TmslurmError(
                    f"controller at {host}:{port} is unreachable: {why}. "
                    "Is the run still alive? (tmslurm status RUN_DIR)"
                ) from None
            time.sleep(0.1)


def write_token(run_dir: Path) -> str:
    token = secrets.token_hex(16)
    path = RunDir(Path(run_dir)).token
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise TmslurmError(f"{path} exists: a run was started in {run_dir} before; pass run_dir=<new dir>") from None
    with os.fdopen(fd, "w") as f:
        f.write(token)
    return token


def read_token(run_dir: Path) -> str:
    try:
        return RunDir(Path(run_dir)).token.read_text().strip()
    except OSError as exc:
        raise AuthError(f"cannot read the run token {Path(run_dir) / 'token'}: {exc}") from None


def token_ok(given: Any, expected: str) -> bool:
    return isinstance(given, str) and hmac.compare_digest(given.encode(), expected.encode())


def controller_address(run_dir: Path, timeout_s: float = 60.0) -> dict[str, Any]:
    """Wait for ``<run_dir>/controller.json`` and return it (host, port, store_port)."""
    path = RunDir(Path(run_dir)).controller
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            if time.monotonic() > deadline:
                raise TmslurmError(
                    f"{path} did not appear within {timeout_s:.0f}s: the controller is not running"
                ) from None
            time.sleep(0.05)


def request(run_dir: Path, msg: dict[str, Any], token: str | None = None, timeout_s: float = 10.0) -> dict[str, Any]:
    """One authenticated request/reply to a run's controller (used by the CLI and admin hooks)."""
    return exchange(
        controller_address(run_dir, timeout_s=1.0),
        {**msg, "token": token if token is not None else read_token(run_dir)},
        timeout_s,
    )


def exchange(
    addr: dict[str, Any], msg: Msg | dict[str, Any], timeout_s: float = 10.0, *, connect_s: float | None = None
) -> dict[str, Any]:
    """Send one first line to the controller at ``addr`` and return its one reply. ``msg`` may be a
    raw dict (:func:`request`'s untyped CLI requests): the controller validates whatever comes.
    ``connect_s``: one connection try bounded by it, instead of trying for ``timeout_s``."""
    if connect_s is None:
        ch = connect(addr["host"], addr["port"], timeout_s)
    else:
        ch = connect(addr["host"], addr["port"], 0.0, attempt_s=connect_s)
    try:
        ch.sock.settimeout(timeout_s)
        ch.send_line(encode_line(msg))
        reply = ch.recv()
    finally:
        ch.close()
    if reply is None:
        raise TmslurmError("the controller closed the connection without answering")
    return reply
