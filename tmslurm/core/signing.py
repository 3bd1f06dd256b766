"""Admin notices signed with Ed25519: the cluster admin signs, every run verifies, nobody shares a secret.

Contract:
- The admin holds the private key (root-only, mode 0600); every run reads the public key
  (world-readable) named by ``security.admin_public_key_file``. :func:`generate_keypair` writes both.
- :func:`sign` signs a :class:`~tmslurm.wire.messages.SignedPayload` (run, node, event, deadline,
  timestamp, nonce, reason) over its canonical JSON; :func:`signed_notice` builds a fresh one.
- :class:`NoticeVerifier` accepts a :class:`~tmslurm.wire.messages.SignedNotice` only when the signature
  is valid for the public key, the payload names this run, its timestamp is within ``max_age_s`` of
  now, and its nonce was not seen before (nonces are remembered for ``2 * max_age_s``). Anything
  else raises :class:`NoticeRefused` with the reason; nothing else is raised. A signed notice can
  only notify: it never authenticates ``hello``, ``stop`` or ``status``.
"""

from __future__ import annotations

import base64
import json
import math
import os
import secrets
import time
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from tmslurm.core.errors import AuthError
from tmslurm.wire.messages import NoticeEvent, SignedNotice, SignedPayload


class NoticeRefused(AuthError):
    """A signed notice that is forged, stale, replayed, or for another run."""


def canonical(payload: SignedPayload) -> bytes:
    return json.dumps(payload.model_dump(mode="json"), sort_keys=True, separators=(",", ":")).encode()


def generate_keypair(private_path: Path, public_path: Path) -> None:
    """Write a new Ed25519 key pair: the private key 0600 (O_EXCL), the public key 0644."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    pub = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    fd = os.open(public_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(pub)


def load_private_key(path: Path) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise AuthError(f"cannot read the admin private key {path}: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise AuthError(f"{path} is not an Ed25519 private key (make one with: tmslurm keygen)")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(Path(path).read_bytes())
    except (OSError, ValueError, TypeError) as exc:
        raise AuthError(f"cannot read the admin public key {path}: {exc}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise AuthError(f"{path} is not an Ed25519 public key")
    return key


def sign(key: Ed25519PrivateKey, payload: SignedPayload) -> SignedNotice:
    sig = base64.b64encode(key.sign(canonical(payload))).decode()
    return SignedNotice(type="signed_notice", payload=payload, signature=sig)


def signed_notice(
    key: Ed25519PrivateKey,
    run: str,
    node: str,
    event: NoticeEvent,
    deadline: float | None = None,
    reason: str = "",
    now: float | None = None,
) -> SignedNotice:
    """A fresh signed notice for ``run`` (its run directory's name)."""
    payload = SignedPayload(
        run=run,
        node=node,
        event=event,
        deadline=deadline,
        reason=reason,
        timestamp=float(time.time() if now is None else now),
        nonce=secrets.token_hex(16),
    )
    return sign(key, payload)


class NoticeVerifier:
    def __init__(self, public_key: Ed25519PublicKey, run: str, max_age_s: float) -> None:
        self.public_key = public_key
        self.run = run
        self.max_age_s = max_age_s
        self.seen: dict[str, float] = {}

    def verify(self, notice: SignedNotice, now: float | None = None) -> SignedPayload:
        now = time.time() if now is None else now
        p = notice.payload
        try:
            self.public_key.verify(base64.b64decode(notice.signature, validate=True), canonical(p))
        except (InvalidSignature, ValueError):
            raise NoticeRefused("bad signature") from None
        if p.run != self.run:
            raise NoticeRefused(f"signed for run {p.run!r}, this is {self.run!r}")
        if not math.isfinite(p.timestamp) or abs(now - p.timestamp) > self.max_age_s:
            raise NoticeRefused(f"stale: signed {now - p.timestamp:.0f}s ago (limit {self.max_age_s:.0f}s)")
        self._forget(now)
        if p.nonce in self.seen:
            raise NoticeRefused("replayed: this nonce was already used")
        self.seen[p.nonce] = p.timestamp
        return p

    def _forget(self, now: float) -> None:
        for nonce in [n for n, t in self.seen.items() if now - t > 2 * self.max_age_s]:
            del self.seen[nonce]
