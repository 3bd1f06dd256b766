"""The ``tmslurm`` command: ``status``, ``stop``, ``notify``, ``report``.

``status RUN_DIR`` (or ``status --job JOBID``: any Slurm job of the run, resolved by
:func:`tmslurm.slurm.runtag.resolve_job`) prints the run once (:mod:`tmslurm.cli.status_view`), or with
``--watch`` refreshes a live view every ``--interval`` seconds until the run finishes or Ctrl-C
(exit 0 both ways; an unreachable controller is shown and retried). A directory that holds neither
``config.json`` nor ``summary.json`` is not a tmslurm run: that is bad input (exit 2).

``stop RUN_DIR`` (or ``stop --job JOBID``) asks the run's controller to end the run: it checkpoints
with its next step commit, cancels its spare jobs and writes its summary (``stopped``: the checkpoint
step), so ``train.resume_from=RUN_DIR`` goes on exactly from there. It returns once the controller
accepted (exit 0); a run that has already finished is bad input (exit 2), one whose controller does
not answer exits 3.

Contract: every sub-command prints a readable result (or ``--json``) and exits 0, or prints one
``error:`` line and exits non-zero: 2 for bad input (unknown node, bad deadline, wrong token),
3 when the run's controller cannot be reached; ``notify`` exits 1 when some runs accepted the notice but
a live run did not get it (each run's line says why). ``notify`` signs with the cluster admin's Ed25519
private key (``--private-key-file``) or authenticates with the run's token (``RUN_DIR/token``, or
``--token``). ``keygen`` writes a new admin key pair.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

from tmslurm.cli.guard import USAGE_ERROR, guarded
from tmslurm.core.errors import TmslurmError
from tmslurm.core.rundir import RunDir


def _status(args: argparse.Namespace) -> int:
    from tmslurm.cli.run_status import RunStatus, fetch
    from tmslurm.cli.status_view import Watch, format_status

    run_dir = _run_dir_of(args)
    if args.watch:
        if args.json:
            raise TmslurmError("--watch and --json do not combine: --json prints one status")
        watch = Watch(
            lambda: RunStatus.from_dict(fetch(run_dir, args.token, timeout_s=5.0)),
            sys.stdout,
            interval_s=args.interval,
            tty=sys.stdout.isatty(),
        )
        # Ctrl-C ends the watch (exit 0) even where SIGINT came in ignored: a shell without job control
        # starts background commands so, and Python then installs no KeyboardInterrupt handler
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            return watch.run()
        except BrokenPipeError:  # its reader went away (| head): the watch is over
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
            return 0
    status = fetch(run_dir, args.token)
    if args.json:
        print(json.dumps(status, indent=1, default=str))
        return 0
    print(format_status(RunStatus.from_dict(status)))
    return 0


def _run_dir_of(args: argparse.Namespace) -> Path:
    """RUN_DIR, or the run directory of Slurm job ``--job`` (exactly one of them)."""
    if (args.run_dir is None) == (args.job is None):
        raise TmslurmError("give a run directory or --job JOBID (one of them)")
    if args.job is not None:
        from tmslurm.slurm.client import CliSlurmClient
        from tmslurm.slurm.runtag import resolve_job

        return resolve_job(CliSlurmClient(), args.job)
    path = Path(args.run_dir)
    if not path.is_dir():
        raise TmslurmError(f"{path} is not a run directory (no such directory)")
    rd = RunDir(path)
    if not (rd.config.is_file() or rd.summary.is_file()):
        raise TmslurmError(
            f"{path} is not a tmslurm run (it has no config.json or summary.json). "
            "Fix: pass the directory tmslurm-launch made (runs/<time>, or the run_dir= it was given), or --job JOBID"
        )
    return path


def _stop(args: argparse.Namespace) -> int:
    from tmslurm.wire.protocol import request

    run_dir = _run_dir_of(args)
    if RunDir(run_dir).summary.is_file():
        raise TmslurmError(f"{run_dir} has already finished (it has a summary.json): there is nothing to stop")
    if not RunDir(run_dir).controller.is_file():
        raise TmslurmError(
            f"{run_dir} has no controller.json: the run's controller is not running (it has not started yet, "
            "or it died: resume with train.resume_from)"
        )
    reply = request(run_dir, {"type": "stop"}, args.token)
    if not reply.get("ok"):
        raise TmslurmError(f"{run_dir}: the controller refused the stop: {reply.get('error')}")
    print(
        f"{run_dir}: stop accepted at step {reply.get('stopping_after_step')}: the run checkpoints with its next step "
        "commit, cancels its spare jobs and writes its summary (tmslurm status shows it). "
        f"Resume with train.resume_from={run_dir}"
    )
    return 0


def _notify(args: argparse.Namespace) -> int:
    from tmslurm.cli.notify import notify

    delivery = notify(args)
    for line in delivery.shown():
        print(line, flush=True)
    problem = delivery.problem()
    if problem is not None:
        raise problem
    return 0


def _keygen(args: argparse.Namespace) -> int:
    from tmslurm.core.signing import generate_keypair

    try:
        generate_keypair(Path(args.private), Path(args.public))
    except OSError as exc:
        raise TmslurmError(f"cannot write the key pair: {exc}") from None
    print(f"private key {args.private} (0600), public key {args.public} (0644)")
    return 0


def _report(args: argparse.Namespace) -> int:
    from tmslurm.cli.report import write_report

    moved = [o for o, v in (("--downtime-json", args.downtime_json), ("--scaling-json", args.scaling_json)) if v]
    if moved:
        raise TmslurmError(
            f"tmslurm report no longer plots benchmark results ({', '.join(moved)}): in a source checkout run "
            "`python -m benchmarks plots --downtime-json PATH --scaling-json PATH --out DIR`"
        )
    path = write_report(Path(args.run_dir), Path(args.out) if args.out else None)
    print(f"report written to {path}")
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="tmslurm", description="tmslurm user and admin commands")
    sub = ap.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("status", help="show a run: jobs, ranks, standbys, step, events")
    st.add_argument("run_dir", nargs="?", default=None, help="the run directory (or --job)")
    st.add_argument(
        "--job",
        default=None,
        metavar="JOBID",
        help="a Slurm job id of the run (main job or a spare) instead of RUN_DIR, from any directory",
    )
    st.add_argument("--json", action="store_true")
    st.add_argument(
        "--watch", action="store_true", help="refresh a compact view until the run finishes (Ctrl-C ends it)"
    )
    st.add_argument(
        "--interval", type=float, default=2.0, metavar="S", help="--watch refresh interval, seconds (default 2)"
    )
    st.add_argument("--token", default=None)
    st.set_defaults(fn=_status)
    sp = sub.add_parser(
        "stop", help="end a run: checkpoint at the next step, cancel the spares, write the summary (resumable)"
    )
    sp.add_argument("run_dir", nargs="?", default=None, help="the run directory (or --job)")
    sp.add_argument(
        "--job",
        default=None,
        metavar="JOBID",
        help="a Slurm job id of the run (main job or a spare) instead of RUN_DIR",
    )
    sp.add_argument("--token", default=None, help="the run token (default: RUN_DIR/token)")
    sp.set_defaults(fn=_stop)
    no = sub.add_parser("notify", help="deliver a maintenance or failure notice (admin hook)")
    no.add_argument("--node", default=None, help="the node that must leave or has failed")
    no.add_argument("--rank", type=int, default=None, help="a training rank instead of a node (needs --run-dir)")
    no.add_argument("--event", required=True, choices=["maintenance", "failure"])
    no.add_argument("--deadline", default=None, help="ISO time, +90s/+5m/+1h, now, or epoch seconds")
    no.add_argument("--reason", default="")
    no.add_argument(
        "--run-dir",
        action="append",
        default=None,
        help="run directory (repeatable); default: every run under --runs-root",
    )
    no.add_argument("--runs-root", default="runs", help="where to look for runs using the node")
    no.add_argument("--token", default=None, help="the run token (default: RUN_DIR/token)")
    no.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="how long to wait for each run's answer, seconds (default 10; a connection try: at most 2)",
    )
    no.add_argument(
        "--private-key-file",
        default=None,
        help="the cluster admin's Ed25519 private key: sign the notice (instead of run tokens)",
    )
    no.set_defaults(fn=_notify)
    kg = sub.add_parser("keygen", help="write a new admin key pair for signed notices (private 0600, public 0644)")
    kg.add_argument("--private", required=True, help="private key file to create (keep it root-only)")
    kg.add_argument(
        "--public", required=True, help="public key file to create (runs read it: security.admin_public_key_file)"
    )
    kg.set_defaults(fn=_keygen)
    rp = sub.add_parser("report", help="write a markdown report with plots for a run")
    rp.add_argument("run_dir")
    rp.add_argument("--out", default=None)
    # moved to `python -m benchmarks plots`: still parsed, so that using them gives a clear error
    rp.add_argument("--downtime-json", default=None, help=argparse.SUPPRESS)
    rp.add_argument("--scaling-json", default=None, help=argparse.SUPPRESS)
    rp.set_defaults(fn=_report)
    return ap


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    return guarded(lambda: args.fn(args), _status_of)


def _status_of(exc: TmslurmError) -> int:
    """The status a notice that did not reach every run carries; else 3 when no controller
    answered (the run is not running), else 2."""
    from tmslurm.cli.notify import Undelivered

    if isinstance(exc, Undelivered):
        return exc.status
    return 3 if "unreachable" in str(exc) or "not running" in str(exc) else USAGE_ERROR
