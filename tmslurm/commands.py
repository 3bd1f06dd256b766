"""The ``tmslurm`` command: ``status``, ``notify``, ``report``.

Contract: every sub-command prints a readable result (or ``--json``) and exits 0, or prints one
``error:`` line and exits non-zero: 2 for bad input (unknown node, bad deadline, wrong token),
3 when the run's controller cannot be reached. ``notify`` signs with the cluster admin's Ed25519
private key (``--private-key-file``) or authenticates with the run's token (``RUN_DIR/token``, or
``--token``). ``keygen`` writes a new admin key pair.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tmslurm.errors import TmslurmError
from tmslurm.rundir import RunDir


def _status(args: argparse.Namespace) -> int:
    from tmslurm.wire.protocol import request

    run_dir = Path(args.run_dir)
    try:
        status = request(run_dir, {"type": "status"}, token=args.token)["status"]
    except TmslurmError:
        summary = RunDir(run_dir).summary
        if not summary.is_file():
            raise
        status = json.loads(summary.read_text())
        status.setdefault("mode", "finished")
        status["step"] = status.get("steps")
        status["loss"] = status.get("loss_last")
        status["step_time_s"] = status.get("median_step_s")
    if args.json:
        print(json.dumps(status, indent=1, default=str))
        return 0
    print(format_status(status))
    return 0


def format_status(st: dict[str, Any]) -> str:
    lines = [f"run {st.get('run_dir', st.get('run_id'))}  mode={st.get('mode')}  step={st.get('step')}/{st.get('steps', '?')}"
             f"  step_time={st.get('step_time_s') or 0:.3f}s  loss={st.get('loss') or 0:.4f}"]
    if st.get("main_job_id"):
        lines.append(f"main job {st['main_job_id']} (incarnation {st.get('incarnation', 0)})  "
                     f"spares {', '.join(map(str, st.get('spare_job_ids', []))) or '-'}")
    for r in st.get("ranks", []):
        lines.append(f"  rank {r['rank']:>3}  {r.get('role', ''):<6}  node {r.get('node')}  {'' if r.get('alive', True) else '(dead)'}")
    for s in st.get("standbys", []):
        lines.append(f"  standby {s.get('id')}  node {s.get('node')}  warm roles: {', '.join(s.get('roles', [])) or '-'}")
    for ev in st.get("events", []):
        down = ev.get("downtime_s")
        parts = " ".join(f"{k[:-2]}={ev[k]:.3f}s" for k in ("detect_s", "pick_s", "phase1_s", "phase2_s", "transfer_s", "first_step_s")
                         if isinstance(ev.get(k), (int, float)))
        lines.append(f"  event {ev.get('kind')} ranks={ev.get('ranks')} node={ev.get('node')} "
                     f"downtime={'?' if down is None else f'{down:.3f}s'} {parts}")
    return "\n".join(lines)


def _notify(args: argparse.Namespace) -> int:
    from tmslurm.notify import notify

    results = notify(args)
    for line in results:
        print(line)
    return 0


def _keygen(args: argparse.Namespace) -> int:
    from tmslurm.signing import generate_keypair

    try:
        generate_keypair(Path(args.private), Path(args.public))
    except OSError as exc:
        raise TmslurmError(f"cannot write the key pair: {exc}") from None
    print(f"private key {args.private} (0600), public key {args.public} (0644)")
    return 0


def _report(args: argparse.Namespace) -> int:
    from tmslurm.report import write_report

    kwargs = {k: v for k, v in (("downtime_json", args.downtime_json), ("scaling_json", args.scaling_json)) if v}
    path = write_report(Path(args.run_dir), Path(args.out) if args.out else None, **kwargs)
    print(f"report written to {path}")
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="tmslurm", description="tmslurm user and admin commands")
    sub = ap.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("status", help="show a run: jobs, ranks, standbys, step, events")
    st.add_argument("run_dir")
    st.add_argument("--json", action="store_true")
    st.add_argument("--token", default=None)
    st.set_defaults(fn=_status)
    no = sub.add_parser("notify", help="deliver a maintenance or failure notice (admin hook)")
    no.add_argument("--node", default=None, help="the node that must leave or has failed")
    no.add_argument("--rank", type=int, default=None, help="a training rank instead of a node (needs --run-dir)")
    no.add_argument("--event", required=True, choices=["maintenance", "failure"])
    no.add_argument("--deadline", default=None, help="ISO time, +90s/+5m/+1h, now, or epoch seconds")
    no.add_argument("--reason", default="")
    no.add_argument("--run-dir", action="append", default=None, help="run directory (repeatable); default: every run under --runs-root")
    no.add_argument("--runs-root", default="runs", help="where to look for runs using the node")
    no.add_argument("--token", default=None, help="the run token (default: RUN_DIR/token)")
    no.add_argument("--private-key-file", default=None,
                    help="the cluster admin's Ed25519 private key: sign the notice (instead of run tokens)")
    no.set_defaults(fn=_notify)
    kg = sub.add_parser("keygen", help="write a new admin key pair for signed notices (private 0600, public 0644)")
    kg.add_argument("--private", required=True, help="private key file to create (keep it root-only)")
    kg.add_argument("--public", required=True, help="public key file to create (runs read it: runtime.admin_public_key_file)")
    kg.set_defaults(fn=_keygen)
    rp = sub.add_parser("report", help="write a markdown report with plots for a run")
    rp.add_argument("run_dir")
    rp.add_argument("--out", default=None)
    rp.add_argument("--downtime-json", default=None)
    rp.add_argument("--scaling-json", default=None)
    rp.set_defaults(fn=_report)
    return ap


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except TmslurmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3 if "unreachable" in str(exc) or "not running" in str(exc) else 2
