"""Deliver an admin notice (``tmslurm notify``) to every tmslurm run that uses a node.

Contract: finds the runs (``--run-dir`` given, or every directory under ``--runs-root`` with a live
``controller.json``), skips a run that lacks a file the notice needs (:func:`missing_file` names it:
the run directory, ``controller.json``, or the ``token`` when neither ``--token`` nor a key is given),
keeps only runs it can trust (:func:`trusted_run`: ``controller.json`` is a
plain file owned by the run directory's owner, and neither is writable by group or others; a run
whose token file is read must also own it), validates the deadline
(:func:`tmslurm.core.notices.parse_deadline`) and sends each run one notice: signed with the admin's
Ed25519 private key (``--private-key-file``; one signature per run, naming the run, with a fresh
timestamp and nonce), or else authenticated by the run's own token (``--token`` or
``RUN_DIR/token``, which only the run's owner and root can read). Nothing is sent to a run that
failed the check. A run answers ``unknown node`` when the node is not one of its nodes; that run is
skipped. Raises :class:`~tmslurm.core.errors.NoticeError` when no run uses the node (unknown node),
:class:`~tmslurm.core.errors.AuthError` when a run refused the signature or the token.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

from tmslurm.core.errors import AuthError, NoticeError, TmslurmError
from tmslurm.core.notices import Notice, parse_deadline
from tmslurm.core.rundir import RunDir
from tmslurm.wire.messages import NoticeEvent, NoticeRequest
from tmslurm.wire.protocol import exchange, read_token


def find_runs(args: argparse.Namespace) -> list[Path]:
    if args.run_dir:
        return [Path(d) for d in args.run_dir]
    root = Path(args.runs_root)
    dirs = [RunDir(p) for p in sorted(root.iterdir()) if p.is_dir()] if root.is_dir() else []
    return [d.path for d in dirs if d.controller.exists() and not d.summary.exists()]


def missing_file(run_dir: Path, with_token: bool) -> str | None:
    """None when the files a notice needs are there, else which one is missing and what that means."""
    rd = RunDir(run_dir)
    if not run_dir.is_dir():
        return f"{run_dir} does not exist (no such run directory)"
    if not rd.controller.exists():
        return f"{rd.controller} does not exist (the run's controller is not running, or the run ended)"
    if with_token and not rd.token.exists():
        return f"{rd.token} does not exist (pass --token, or sign with --private-key-file)"
    return None


def trusted_run(run_dir: Path, with_token: bool) -> str | None:
    """None when ``run_dir``'s controller.json can be trusted, else why not."""
    try:
        rd = RunDir(run_dir)
        d, c = os.lstat(run_dir), os.lstat(rd.controller)
        t = os.lstat(rd.token) if with_token else None
    except OSError as exc:
        return f"cannot inspect the run: {exc.strerror}"
    if not stat.S_ISREG(c.st_mode) or (t is not None and not stat.S_ISREG(t.st_mode)):
        return "controller.json or token is not a plain file"
    if c.st_uid != d.st_uid or (t is not None and t.st_uid != d.st_uid):
        return "controller.json or token is not owned by the run directory's owner"
    if (c.st_mode | d.st_mode) & (stat.S_IWGRP | stat.S_IWOTH):
        return "the run directory or controller.json is writable by others"
    return None


def notify(args: argparse.Namespace) -> list[str]:
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
    runs = find_runs(args)
    if not runs:
        raise NoticeError(f"no live tmslurm run found (looked under {args.runs_root}); pass --run-dir")
    out, refused, unknown = [], [], []
    with_token = key is None and args.token is None  # RUN_DIR/token is read
    for run_dir in runs:
        missing = missing_file(run_dir, with_token)
        if missing is not None:
            out.append(f"{run_dir}: skipped, {missing}")
            continue
        why = trusted_run(run_dir, with_token)
        if why is not None:
            out.append(f"{run_dir}: skipped, not trusted ({why})")
            continue
        try:
            reply = exchange(_address(run_dir), _message(notice, args.token, run_dir, key))
        except TmslurmError as exc:
            out.append(f"{run_dir}: not reachable ({exc})")
            continue
        if reply.get("ok"):
            out.append(f"{run_dir}: notice accepted ({args.event} {args.node or f'rank {args.rank}'})")
        elif "refused" in str(reply.get("error")):
            refused.append(f"{run_dir}: {reply['error']}")
        else:
            unknown.append(f"{run_dir}: {reply.get('error')}")
    if refused and not any("accepted" in o for o in out):
        raise AuthError("; ".join(refused))
    if not any("accepted" in o for o in out):
        raise NoticeError("no run accepted the notice: " + ("; ".join(unknown + out) or "none"))
    return out + refused


def _private_key(args: argparse.Namespace) -> Any:
    if not args.private_key_file:
        return None
    from tmslurm.core.signing import load_private_key

    return load_private_key(Path(args.private_key_file))


def _address(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads(RunDir(run_dir).controller.read_text())
    except (OSError, ValueError) as exc:
        raise TmslurmError(f"cannot read {run_dir / 'controller.json'}: {exc}") from None


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
        token=token if token is not None else read_token(run_dir),
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
