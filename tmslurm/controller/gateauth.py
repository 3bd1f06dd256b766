"""The gate's admission: its limits on clients, the judge of a connection's first line, its refusals.

Contract (on the gate's reader thread, :mod:`tmslurm.controller.gate`):
- :class:`GateLimits` is what a client may do before and after its first line (the gate and its
  relay side enforce them).
- :meth:`Admission.first` takes the first line of a connection (or of an agent behind a node
  relay) and returns the message it is (a :class:`~tmslurm.wire.messages.Hello`, a
  :class:`~tmslurm.wire.messages.RelayHello` or a request), or ``None`` once it has refused it.
- The line is authenticated before it is validated: a ``signed_notice`` by its Ed25519 signature
  (:class:`~tmslurm.core.signing.NoticeVerifier`; refused ones are journalled as ``notice_refused``),
  anything else by the run token, compared in constant time (``auth_refused``). A signed notice
  becomes a :class:`~tmslurm.wire.messages.NoticeRequest` from ``admin`` and nothing else. A line
  that is not a message is ``bad_message``.
- :meth:`Admission.refuse` is every refusal of the gate, first lines and agents' lines alike: one
  journal line (``what``, the error and the given fields), then an
  :class:`~tmslurm.wire.messages.ErrorReply` sent with
  :meth:`~tmslurm.wire.protocol.GateSide.send_now`, which never waits for the client (one that
  cannot take it at once does not get it). It raises nothing a client's bytes could cause.
- Every refusal goes to the channel it is given: for an agent behind a node relay, its own
  sub-channel (:class:`~tmslurm.wire.mux.SubChannel`), a refused signed notice included.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from tmslurm.controller.journal import Journal
from tmslurm.core.errors import ProtocolError
from tmslurm.core.signing import NoticeRefused, NoticeVerifier
from tmslurm.wire.messages import (
    BadMessage,
    ErrorReply,
    Hello,
    NoticeRequest,
    OneShot,
    RelayHello,
    SignedNotice,
    decode_first,
    token_of,
)
from tmslurm.wire.protocol import GateSide, parse_line, token_ok

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class GateLimits:
    auth_timeout_s: float = 5.0
    """An unauthenticated client must send its first line within this."""
    preauth_max_line: int = 16384
    """The first line may be at most this long."""
    max_unauthenticated: int = 32
    """Connections waiting for their first line at once; more are dropped."""
    max_relay_subs: int = 4096
    """Agents one node relay may carry at once; a hello beyond them is refused."""


class Admission:
    def __init__(self, token: str, verifier: NoticeVerifier | None, journal: Journal) -> None:
        self.token = token
        self.verifier = verifier
        self.journal = journal

    def first(self, line: bytes, ch: GateSide, peer: str) -> Hello | RelayHello | OneShot | None:
        """The authenticated, validated first message; or None (answered on ``ch`` and journalled)."""
        try:
            raw = parse_line(line)
        except ProtocolError as exc:
            self.refuse(ch, "bad_message", f"malformed request: {exc}", peer=peer)
            return None
        if raw.get("type") == "signed_notice":
            return self._signed(raw, ch, peer)
        if not token_ok(token_of(raw), self.token):
            log.warning("refused a %r request without a valid token", str(raw.get("type"))[:40])
            self.refuse(
                ch,
                "auth_refused",
                "refused: missing or wrong token (use the run's token file, or sign the notice with the admin key)",
                request=str(raw.get("type"))[:40],
                peer=peer,
            )
            return None
        try:
            first = decode_first(raw)
        except BadMessage as exc:
            self.refuse(ch, "bad_message", str(exc), peer=peer)
            return None
        if isinstance(first, SignedNotice):  # only a line typed signed_notice decodes to one: handled above
            return self._signed(raw, ch, peer)
        return first

    def _signed(self, raw: dict[str, Any], ch: GateSide, peer: str) -> NoticeRequest | None:
        try:
            notice = decode_first(raw)
            assert isinstance(notice, SignedNotice)
            if self.verifier is None:
                raise NoticeRefused("this run accepts no signed notices (security.admin_public_key_file is not set)")
            p = self.verifier.verify(notice)
        except BadMessage as exc:
            self.refuse(ch, "bad_message", str(exc), peer=peer)
            return None
        except NoticeRefused as exc:
            self.refuse(ch, "notice_refused", f"refused: {exc}", peer=peer)
            return None
        return NoticeRequest(
            type="notice", token="", event=p.event, node=p.node, deadline=p.deadline, reason=p.reason, source="admin"
        )

    def refuse(self, ch: GateSide, what: str, error: str, **fields: Any) -> None:
        """Journal ``what`` and answer ``error`` at once (never waiting)."""
        self.journal.write(what, error=error[:300], **fields)
        ch.send_now(ErrorReply(error=error[:4000]))  # the model's bound: a refusal never fails to build
        return None
