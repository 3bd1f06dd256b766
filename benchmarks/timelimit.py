"""``bench timelimit``: what a main job's time limit costs the run, ``requeue`` against ``resubmit``.

Contract: on the local Slurm cluster (``scripts/local-slurm up``; Slurm's own requeue delay unless
the lab was started with ``--requeue-delay``), one run per mode in ``--modes``: a DP2 x PP2 job with
``slurm.time=00:02:00``, ``slurm.signal_lead_s=30`` and ``slurm.on_limit=<mode>``, left to run into
its limit ``--boundaries`` times. Per boundary (the run's own ``job_end_*`` event) it records the
pause from the signal to the first committed step of the next job and its parts: the checkpoint
(signal to the requeue or resubmit call, the checkpoint complete on disk), the reschedule (that call
to the next job's controller; for a requeue, Slurm's fixed delay in it: ``EligibleTime`` - requeue
time), the start-up (controller to every rank started from the checkpoint) and the first step; and
the steps lost (must be 0). It prints the table after every boundary and writes ``--json``.
Failure behaviour: a run that does not reach its boundaries in time raises
:class:`~tmslurm.core.errors.TmslurmError` naming them; the job is stopped in every case.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
from pathlib import Path
from typing import Any

from benchmarks.common import SlurmJob, commit, progress, recorded_command, say, sh, write_json
from benchmarks.downtime import fixed_delay
from benchmarks.dtstats import pct
from tmslurm.core.errors import TmslurmError

MODES = ("requeue", "resubmit")


def _boundaries(job: SlurmJob, mode: str) -> list[dict[str, Any]]:
    return [e for e in job.events_done(job.status()) if e.get("kind") == f"job_end_{mode}" and e.get("first_step_t")]


def one(out: Path, mode: str, args: argparse.Namespace, prog: Any) -> list[dict[str, Any]]:
    job = SlurmJob(
        out / mode,
        [
            "parallel.dp=2",
            "parallel.pp=2",
            f"model={args.model}",
            "standby.count=0",
            "train.steps=1000000",
            f"bench.step_delay_s={args.step_delay_s}",
            "slurm.partition=debug",
            "slurm.time=00:02:00",
            "slurm.signal_lead_s=30",
            f"slurm.on_limit={mode}",
        ],
    )
    rows: list[dict[str, Any]] = []
    try:
        while len(rows) < args.boundaries:
            n = len(rows)

            def past(st: dict[str, Any], n: int = n) -> bool:
                done = job.events_done(st)
                return len([e for e in done if e.get("kind") == f"job_end_{mode}" and e.get("first_step_t")]) > n

            job.wait(past, args.timeout, f"time-limit boundary {n + 1} ({mode})")
            ev = _boundaries(job, mode)[n]
            job_id = _current_job(job)
            rows.append(_row(mode, n, ev, fixed_delay(job_id, ev) if mode == "requeue" else None))
            prog.advance(f"{mode} boundary {n + 1}")
            say(describe(rows[-1]))
    finally:
        try:
            job.stop()
        except TmslurmError as exc:
            say(f"could not stop {mode} run cleanly ({exc}); cancelling job {_current_job(job)}")
            sh("scancel", _current_job(job), check=False)
    return rows


def _current_job(job: SlurmJob) -> str:
    """The run's job now: a resubmission is a new job id (``jobs.json``'s ``main_job_id``)."""
    try:
        return str(json.loads((job.run_dir / "jobs.json").read_text())["main_job_id"])
    except (OSError, ValueError, KeyError):
        return job.job_id


def _row(mode: str, i: int, ev: dict[str, Any], fixed: float | None) -> dict[str, Any]:
    t0 = ev["notice_t"]
    ckpt = ev["requeue_t"] - t0
    first = ev["first_step_t"] - ev["all_started_t"] if ev.get("all_started_t") else None
    return {
        "mode": mode,
        "boundary": i + 1,
        "pause_s": round(ev["first_step_t"] - t0, 3),
        "checkpoint_s": round(ckpt, 3),
        "reschedule_s": round(ev["reschedule_s"], 3),
        "fixed_delay_s": None if fixed is None else round(fixed, 3),
        "startup_s": round(ev["startup_s"], 3) if ev.get("startup_s") is not None else None,
        "first_step_s": round(first, 3) if first is not None else None,
        "lost_steps": ev["lost_steps"],
        "at_step": ev["target_step"],
    }


def describe(r: dict[str, Any]) -> str:
    return (
        f"{r['mode']} #{r['boundary']}: pause {r['pause_s']:.1f} s = checkpoint {r['checkpoint_s']:.2f} + reschedule "
        f"{r['reschedule_s']:.1f} (fixed delay {r['fixed_delay_s']}) + start-up {r['startup_s']} + first step "
        f"{r['first_step_s']}; lost steps {r['lost_steps']}"
    )


def table(rows: list[dict[str, Any]]) -> str:
    cols = ("pause_s", "checkpoint_s", "reschedule_s", "fixed_delay_s", "startup_s", "first_step_s")
    lines = [
        "| mode | n | pause p50 (min-max) s | checkpoint s | reschedule s | of it Slurm's fixed delay s | start-up s "
        "| first step s | pause without the fixed delay s | lost steps |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode in MODES:
        rs = [r for r in rows if r["mode"] == mode]
        if not rs:
            continue
        cell = {c: _cell([r[c] for r in rs]) for c in cols}
        net = _cell([r["pause_s"] - (r["fixed_delay_s"] or 0.0) for r in rs])
        lines.append(
            f"| {mode} | {len(rs)} | {cell['pause_s']} | {cell['checkpoint_s']} | {cell['reschedule_s']} "
            f"| {cell['fixed_delay_s']} | {cell['startup_s']} | {cell['first_step_s']} | {net} "
            f"| {sum(r['lost_steps'] for r in rs)} |"
        )
    return "\n".join(lines)


def _cell(xs: list[Any]) -> str:
    xs = [x for x in xs if isinstance(x, (int, float))]
    if not xs:
        return "-"
    p50 = pct(xs, 50)
    return f"{p50:.2f} ({min(xs):.2f}-{max(xs):.2f})" if len(xs) > 1 else f"{p50:.2f}"


def main(args: argparse.Namespace) -> dict[str, Any]:
    modes = args.modes.split(",")
    if any(m not in MODES for m in modes) or args.boundaries < 1:
        raise TmslurmError(f"--modes takes {', '.join(MODES)} (comma-separated) and --boundaries >= 1")
    out = Path(args.out).resolve()
    prog = progress("timelimit", len(modes) * args.boundaries, "boundaries")
    rows: list[dict[str, Any]] = []
    for mode in modes:
        say(f"== slurm.on_limit={mode}: {args.boundaries} time-limit boundaries of a 2-minute job")
        rows += one(out, mode, args, prog)
        print(table(rows), flush=True)
        write_json(Path(args.json), _result(rows, args))
    return _result(rows, args)


def _result(rows: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    return {
        "command": recorded_command("timelimit"),
        "commit": commit(),
        "date": datetime.date.today().isoformat(),
        "setup": {
            "cluster": "local Slurm (scripts/local-slurm), one rank per lab node, all on one 2-core host",
            "layout": "DP2 x PP2, no standby",
            "model": args.model,
            "step_delay_s": args.step_delay_s,
            "job": "slurm.time=00:02:00, slurm.signal_lead_s=30 (--signal=USR1@30)",
            "cred_expire_s": _cred_expire(),
        },
        "rows": rows,
        "table": table(rows),
    }


def _cred_expire() -> int:
    """slurmctld's ``AuthInfo=...,cred_expire=S``: a requeued job waits S + 1 s (Slurm's default 120)."""
    line = next((x for x in sh("scontrol", "show", "config", check=False).splitlines() if x.startswith("AuthInfo")), "")
    m = re.search(r"cred_expire=(\d+)", line)
    return int(m.group(1)) if m else 120
