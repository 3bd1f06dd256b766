"""Deliver an admin notice (``tmslurm notify``) to every tmslurm run that uses a node.

Contract: finds the runs (``--run-dir`` given, or every directory under ``--runs-root``, in name
order: :func:`tmslurm.cli.notify_targets.survey`), vets each one on its own
(:func:`tmslurm.cli.notify_targets.vet`: a missing file, an unreadable or empty directory, a
finished run, an untrusted one, a bad ``controller.json`` or token is a skip with its reason),
validates the deadline (:func:`tmslurm.core.notices.parse_deadline`) and sends each vetted run one
notice: signed with the admin's Ed25519 private key (``--private-key-file``; one signature per run,
naming the run, with a fresh timestamp and nonce), or else authenticated by the run's own token
(``--token`` or ``RUN_DIR/token``, which only the run's owner and root can read). Nothing is sent to
a skipped run. A connection try is bounded by :data:`CONNECT_TIMEOUT_S` and the answer by
``--timeout``; a run that does not answer is reported, and delivery to the others goes on. A run
answers ``unknown node`` when the node is not one of its nodes: it needs no notice.

:func:`notify` raises only for bad arguments (:class:`~tmslurm.core.errors.NoticeError`); what
each run did is in the :class:`Delivery` it returns, whose :meth:`Delivery.problem` is the error to
report, if any: :class:`Undelivered` (exit 1) when some runs accepted the notice but a live run did
not get it; when none accepted, :class:`~tmslurm.core.errors.AuthError` if a run refused the
signature or token, else an error with exit 3 (not reachable) or 2 (bad input, no live run, or no
run uses the node).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tmslurm.cli.notify_targets import FINISHED, Skip, Target, survey, vet
from tmslurm.core.errors import AuthError, NoticeError, TmslurmError
from tmslurm.core.notices import Notice, parse_deadline
from tmslurm.wire.messages import NoticeEvent, NoticeRequest
from tmslurm.wire.protocol import ReadTimeout, exchange

CONNECT_TIMEOUT_S = 2.0
"""The bound on one connection try to a run's controller: an address that never answers costs this
much, once (measured: 2.0 s on 127.0.0.1 with a full accept queue)."""


class Undelivered(NoticeError):
    """A live run did not get the notice; ``status`` is the exit status that says so."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(kw_only=True)
class Delivery:
    """What happened at each run directory, in the order they were tried."""

    where: str
    """The runs looked at, for messages: the runs root, or the run directories given."""
    lines: list[str] = field(default_factory=list)
    """One line per run directory (finished runs under a runs root share one line)."""
    accepted: list[str] = field(default_factory=list)
    """The runs that accepted the notice."""
    unknown: list[str] = field(default_factory=list)
    """The runs that answered they do not use the node (they need no notice)."""
    failed: list[str] = field(default_factory=list)
    """The live runs that did not get the notice: skipped, not reachable, refused, or an error."""
    refused: list[str] = field(default_factory=list)
    """Those of ``failed`` that refused the signature or the token."""
    idle: list[str] = field(default_factory=list)
    """The directories that hold no live run (empty, not running, finished, an alias)."""

    def problem(self) -> TmslurmError | None:
        """None when every live run that uses the node got the notice, else what to report."""
        if self.accepted:
            if not self.failed:
                return None
            n = len(self.failed)
            return Undelivered(
                f"{n} live run{'s' if n > 1 else ''} did not get the notice (the lines above say why): "
                + "; ".join(self.failed),
                status=1,
            )
        if self.refused:
            return AuthError("; ".join(self.failed))
        if self.failed:
            msg = "no run accepted the notice: " + "; ".join(self.failed)
            return Undelivered(msg, status=3 if "unreachable" in msg or "not running" in msg else 2)
        if self.unknown:
            return NoticeError("no run accepted the notice: " + "; ".join(self.unknown))
        return NoticeError(f"no live tmslurm run found (looked under {self.where}); pass --run-dir")

    def shown(self) -> list[str]:
        """The lines to print before :meth:`problem`'s error: all of them once a run accepted,
        else only those the error does not repeat."""
        return self.lines if self.accepted else self.idle


def notify(args: argparse.Namespace) -> Delivery:
    if args.node is None and args.rank is None:
        raise NoticeError("give --node NODE (or --rank R with --run-dir)")
    if args.private_key_file and args.node is None:
        raise NoticeError("a signed notice names a node: give --node")
    now = time.time()
    notice = Notice(
        kind=args.event,
        node=args.node,
        rank=args.rank,
        source="admin",
        reason=args.reason,
        deadline=parse_deadline(args.deadline, now) if args.deadline else None,
        time=now,
    )
    key = _private_key(args)
    read_token = key is None and args.token is None  # RUN_DIR/token is read
    if args.run_dir:
        found, aliases = [Path(d) for d in args.run_dir], list[Skip]()
        out = Delivery(where=", ".join(args.run_dir))
    else:
        found, aliases = survey(Path(args.runs_root))
        out = Delivery(where=str(args.runs_root))
    finished = 0
    for skip in aliases:
        _record(out, f"{skip.run_dir}: skipped, {skip.why}", out.idle)
    for run_dir in found:
        target = vet(run_dir, read_token=read_token, named=bool(args.run_dir))
        if isinstance(target, Skip):
            if target.why == FINISHED and not target.live:
                finished += 1
            else:
                _record(out, f"{run_dir}: skipped, {target.why}", out.failed if target.live else out.idle)
            continue
        _deliver(out, target, notice, args, key)
    if finished:
        _record(out, f"{args.runs_root}: {finished} finished run{'s' if finished > 1 else ''} skipped", out.idle)
    return out


def _record(out: Delivery, line: str, bucket: list[str]) -> None:
    out.lines.append(line)
    bucket.append(line)


def _deliver(out: Delivery, target: Target, notice: Notice, args: argparse.Namespace, key: Any) -> None:
    """Send the notice to one vetted run and record what it answered."""
    run_dir = target.run_dir
    msg = _message(notice, args.token if args.token is not None else target.token, run_dir, key)
    try:
        reply = exchange(
            {"host": target.host, "port": target.port},
            msg,
            args.timeout,
            connect_s=min(CONNECT_TIMEOUT_S, args.timeout),
        )
    except ReadTimeout:
        why = f"the controller at {target.host}:{target.port} took the connection but gave no answer"
        _record(out, f"{run_dir}: not reachable ({why} within {args.timeout:g} s)", out.failed)
        return
    except (TmslurmError, OSError) as exc:  # OSError: the connection broke while sending
        _record(out, f"{run_dir}: not reachable ({exc})", out.failed)
        return
    error = str(reply.get("error"))
    if reply.get("ok"):
        _record(out, f"{run_dir}: notice accepted ({args.event} {args.node or f'rank {args.rank}'})", out.accepted)
    elif error.startswith("unknown node"):
        _record(out, f"{run_dir}: {error}", out.unknown)
    else:
        _record(out, f"{run_dir}: {error}", out.failed)
        if "refused" in error:
            out.refused.append(f"{run_dir}: {error}")


def _private_key(args: argparse.Namespace) -> Any:
    if not args.private_key_file:
        return None
    from tmslurm.core.signing import load_private_key

    return load_private_key(Path(args.private_key_file))


def _message(notice: Notice, token: str | None, run_dir: Path, key: Any) -> Any:
    """The notice as a signed notice (with a key) or as a request carrying the run's token."""
    event = _event(notice.kind)
    if key is not None:
        from tmslurm.core.signing import signed_notice

        if notice.node is None:
            raise NoticeError("a signed notice names a node: give --node")
        return signed_notice(key, run_dir.resolve().name, notice.node, event, notice.deadline, notice.reason)
    return NoticeRequest(
        type="notice",
        token=token or "",
        event=event,
        node=notice.node,
        rank=notice.rank,
        deadline=notice.deadline,
        reason=notice.reason,
    )


def _event(kind: str) -> NoticeEvent:
    """A notice's kind (already checked by :class:`Notice`) as the wire's event type."""
    if kind == "maintenance":
        return "maintenance"
    if kind == "failure":
        return "failure"
    raise NoticeError(f"unknown notice kind {kind!r}; valid: 'maintenance', 'failure'")
