"""The controller's front door: accepts connections, authenticates, validates, and queues typed items.

Contract:
- Before authentication a connection gets ``limits.auth_timeout_s`` to send one line of at most
  ``limits.preauth_max_line`` bytes, and at most ``limits.max_unauthenticated`` connections wait at
  once; an oversize, slow or surplus client is dropped and journalled (``preauth_dropped``).
- The first line is authenticated before it is validated: a ``signed_notice`` by its Ed25519
  signature (:class:`~tmslurm.signing.NoticeVerifier`; refused ones are journalled as
  ``notice_refused``), anything else by the run token (``auth_refused``). A signed notice becomes a
  notice request and nothing else.
- Every line is then decoded into a typed message (:mod:`tmslurm.messages`). A line that is not
  one gets an ``error`` reply and a ``bad_message`` journal line; the connection stays open for an
  agent and is closed for a one-shot request. Nothing a client sends raises out of this module.
- Items handed to ``submit`` (in the order read per connection): ``("hello", Hello, (conn, ch))``,
  ``("request", Request, ch)``, ``("msg", conn, message)``, ``("disconnect", conn, None)``.
  ``conn`` is a number unique per connection, so a second client can never speak for another's.
  ``touch(conn)`` is called for every line read from an agent (heartbeats included).
- After :meth:`Gate.close_requests` (the run is ending) a one-shot request is answered with an
  ``error`` by the gate itself and never queued; agents' lines still flow.
"""

from __future__ import annotations

import itertools
import logging
import socket
import threading
from dataclasses import dataclass
from typing import Any, Callable

from tmslurm.errors import ProtocolError
from tmslurm.messages import BadMessage, Hello, NoticeRequest, SignedNotice, decode_agent, decode_first, token_of
from tmslurm.runtime.journal import Journal
from tmslurm.runtime.protocol import Channel, LineTooLong, ReadTimeout, token_ok
from tmslurm.signing import NoticeRefused, NoticeVerifier

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class GateLimits:
    auth_timeout_s: float = 5.0
    """An unauthenticated client must send its first line within this."""
    preauth_max_line: int = 16384
    """The first line may be at most this long."""
    max_unauthenticated: int = 32
    """Connections waiting for their first line at once; more are dropped."""


@dataclass(frozen=True)
class _Dropped:
    """An oversize or slow first line: the connection is closed without an answer."""

    why: str


class Gate:
    def __init__(self, server: socket.socket, token: str, verifier: NoticeVerifier | None, journal: Journal,
                 submit: Callable[[tuple[str, Any, Any]], None], touch: Callable[[int], None], limits: GateLimits) -> None:
        self.server = server
        self.token = token
        self.verifier = verifier
        self.journal = journal
        self.submit = submit
        self.touch = touch
        self.limits = limits
        self.preauth = threading.BoundedSemaphore(limits.max_unauthenticated)
        self.verify_lock = threading.Lock()
        self.conns = itertools.count(1)
        self.stopped = threading.Event()
        self.requests_lock = threading.Lock()
        self.requests_closed: str | None = None

    def start(self) -> None:
        threading.Thread(target=self._accept, name="ctl-accept", daemon=True).start()

    def close_requests(self, why: str) -> None:
        """From now on answer one-shot requests with ``why``; none is queued after this returns."""
        with self.requests_lock:
            self.requests_closed = why

    def stop(self) -> None:
        self.stopped.set()
        self.server.close()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                sock, peer = self.server.accept()
            except OSError:
                return
            if not self.preauth.acquire(blocking=False):
                self.journal.write("preauth_dropped", peer=str(peer), why="too many unauthenticated connections")
                _close(sock)
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(Channel(sock), str(peer)), daemon=True).start()

    def _serve(self, ch: Channel, peer: str) -> None:
        try:
            first = self._first_line(ch, peer)
        finally:
            self.preauth.release()
        if isinstance(first, _Dropped):  # journalled after the slot is free: the journal never runs ahead of it
            self.journal.write("preauth_dropped", peer=peer, why=first.why)
            first = None
        if first is None:
            ch.close()
            return
        if isinstance(first, Hello):
            conn = next(self.conns)
            ch.sock.settimeout(None)
            self.submit(("hello", first, (conn, ch)))
            self._read_agent(conn, ch)
        else:
            with self.requests_lock:
                why = self.requests_closed
                if why is None:
                    self.submit(("request", first, ch))
            if why is not None:
                ch.try_send({"type": "error", "error": why})
                ch.close()

    def _first_line(self, ch: Channel, peer: str) -> Any:
        """The authenticated, validated first message; None (answered and journalled); or _Dropped."""
        ch.sock.settimeout(self.limits.auth_timeout_s)
        try:
            raw = ch.recv(self.limits.preauth_max_line)
        except (LineTooLong, ReadTimeout) as exc:
            return _Dropped(str(exc))
        except ProtocolError as exc:
            return self._refuse(ch, "bad_message", f"malformed request: {exc}", peer=peer)
        if raw is None:
            return None
        if raw.get("type") == "signed_notice":
            return self._signed(ch, raw, peer)
        if not token_ok(token_of(raw), self.token):
            log.warning("refused a %r request without a valid token", str(raw.get("type"))[:40])
            return self._refuse(ch, "auth_refused", "refused: missing or wrong token (use the run's token file, "
                                "or sign the notice with the admin key)", request=str(raw.get("type"))[:40], peer=peer)
        try:
            return decode_first(raw)
        except BadMessage as exc:
            return self._refuse(ch, "bad_message", str(exc), peer=peer)

    def _signed(self, ch: Channel, raw: dict[str, Any], peer: str) -> NoticeRequest | None:
        try:
            notice = decode_first(raw)
            assert isinstance(notice, SignedNotice)
            if self.verifier is None:
                raise NoticeRefused("this run accepts no signed notices (runtime.admin_public_key_file is not set)")
            with self.verify_lock:
                p = self.verifier.verify(notice)
        except BadMessage as exc:
            return self._refuse(ch, "bad_message", str(exc), peer=peer)
        except NoticeRefused as exc:
            return self._refuse(ch, "notice_refused", f"refused: {exc}", peer=peer)
        return NoticeRequest(type="notice", token="", event=p.event, node=p.node, deadline=p.deadline,
                             reason=p.reason, source="admin")

    def _refuse(self, ch: Channel, what: str, error: str, **fields: Any) -> None:
        self.journal.write(what, error=error[:300], **fields)
        ch.try_send({"type": "error", "error": error})
        return None

    def _read_agent(self, conn: int, ch: Channel) -> None:
        while True:
            try:
                raw = ch.recv()
            except ProtocolError as exc:
                self._refuse(ch, "bad_message", f"malformed message: {exc}", conn=conn)
                continue
            if raw is None:
                self.submit(("disconnect", conn, None))
                return
            self.touch(conn)
            try:
                msg = decode_agent(raw)
            except BadMessage as exc:
                self._refuse(ch, "bad_message", str(exc), conn=conn)
                continue
            if msg.type != "hb":
                self.submit(("msg", conn, msg))


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass
