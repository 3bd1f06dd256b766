"""Deliver an admin notice (``tmslurm notify``) to every tmslurm run that uses a node.

Contract: finds the runs (``--run-dir`` given, or every directory under ``--runs-root`` with a live
``controller.json``), validates the deadline (:func:`tmslurm.notices.parse_deadline`), and sends each
run an authenticated ``notice`` request: with ``--admin-key-file`` the cluster admin key, else the
run's own token (or ``--token``). A run answers ``unknown node`` when the node is not one of its
nodes; that run is skipped. Raises :class:`~tmslurm.errors.NoticeError` when no run uses the node
(unknown node), :class:`~tmslurm.errors.AuthError` when a run refused the key.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from tmslurm.errors import AuthError, NoticeError, TmslurmError
from tmslurm.notices import parse_deadline
from tmslurm.runtime.protocol import request


def find_runs(args: argparse.Namespace) -> list[Path]:
    if args.run_dir:
        return [Path(d) for d in args.run_dir]
    root = Path(args.runs_root)
    return sorted(p.parent for p in root.glob("*/controller.json") if not (p.parent / "summary.json").exists())


def _key(args: argparse.Namespace, run_dir: Path) -> str | None:
    if args.admin_key_file:
        try:
            return Path(args.admin_key_file).read_text().strip()
        except OSError as exc:
            raise AuthError(f"cannot read the admin key {args.admin_key_file}: {exc}") from None
    return args.token


def notify(args: argparse.Namespace) -> list[str]:
    if args.node is None and args.rank is None:
        raise NoticeError("give --node NODE (or --rank R with --run-dir)")
    deadline = parse_deadline(args.deadline, time.time()) if args.deadline else None
    runs = find_runs(args)
    if not runs:
        raise NoticeError(f"no live tmslurm run found (looked under {args.runs_root}); pass --run-dir")
    out, refused, unknown = [], [], []
    for run_dir in runs:
        msg = {"type": "notice", "event": args.event, "node": args.node, "rank": args.rank,
               "deadline": deadline, "reason": args.reason, "source": "admin"}
        try:
            reply = request(run_dir, msg, token=_key(args, run_dir))
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
