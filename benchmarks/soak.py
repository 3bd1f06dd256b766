"""``python -m benchmarks soak``: a long fault-free run that must raise no alarm.

Contract: runs one ``cluster=local`` job (default dp=2 x pp=2, ``model.compile=true``, two warm
standbys, default liveness settings, so ranks, standbys, their compile and the node monitors all
share this machine's cores) for ``--minutes`` of training after both standbys are warm, then stops
it with a ``stop`` request and reads its journal and summary. An *alarm* is any journal entry a
healthy run never writes: a rank or standby declared hung, lost, exited or fenced, a node lost, a
monitor gone before the end, an abort, a restart, a stuck plan, a communication error. Prints
progress every 30 s (step, alarms so far) and the result (duration, steps, median step, alarms by
type: all zero for a pass), and writes ``--json`` (with the command, date and commit). The run's
own failure (it ends early, cannot be stopped) raises :class:`~tmslurm.core.errors.TmslurmError`.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.common import LocalJob, commit, recorded_command, say

ALARMS = (
    "hung",
    "abort",
    "node_lost",
    "stuck",
    "process_exit",
    "standby_lost",
    "fenced",
    "restart",
    "comm_error",
    "handler_error",
    "exited_ignored",
    "late_join",
)


def alarms(journal: list[dict[str, Any]], until_t: float) -> Counter:
    """Alarm entries written before ``until_t`` (the stop request), by type; monitors gone count too."""
    out: Counter = Counter()
    for e in journal:
        if e["t"] < until_t and (e["type"] in ALARMS or e["type"] == "monitor_gone"):
            out[e["type"]] += 1
    return out


def main(args: Any) -> dict[str, Any]:
    out = Path(args.out) / time.strftime("soak-%Y%m%d-%H%M%S")
    overrides = [
        f"parallel.dp={args.dp}",
        f"parallel.pp={args.pp}",
        f"standby.count={args.standbys}",
        f"model={args.model}",
        f"model.compile={str(args.compile).lower()}",
        "train.steps=100000000",
        "standby.start_when_warm=true",
        *args.override,
    ]
    say(f"soak: {' '.join(overrides)} for {args.minutes} min -> {out}")
    job = LocalJob(out / "run", overrides)
    job.wait_journal(lambda e: e["type"] == "standby_ready", timeout=900, what="a warm standby")
    t0 = time.time()
    while (elapsed := time.time() - t0) < args.minutes * 60:
        if job.proc.poll() is not None:
            raise RuntimeError(f"the soak run ended early (rc {job.proc.returncode}); see {out}")
        step = job.request({"type": "status"}).get("status", {}).get("step")
        say(f"{elapsed / 60:5.1f} min  step {step}  alarms so far {dict(alarms(job.journal(), time.time()))}")
        time.sleep(min(30.0, max(0.0, args.minutes * 60 - elapsed)))
    stop_t = time.time()
    summary = job.finish()
    found = alarms(job.journal(), stop_t)
    dts = [e["dt"] for e in summary.get("step_log", []) if e.get("dt") is not None]
    result = {
        "command": recorded_command("soak"),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "commit": commit(),
        "overrides": overrides,
        "minutes": round((stop_t - t0) / 60, 2),
        "steps": summary.get("steps"),
        "median_step_s": statistics.median(dts) if dts else None,
        "alarms": dict(found),
        "alarm_count": sum(found.values()),
        "unexpected_events": [
            e for e in summary.get("events", []) if e.get("trigger") == "unexpected" or e.get("kind") == "unexpected"
        ],
    }
    say(
        f"soak done: {result['minutes']} min, {result['steps']} steps, median step {result['median_step_s']}, "
        f"alarms {result['alarm_count']} {result['alarms']}"
    )
    Path(args.json).write_text(json.dumps(result, indent=1))
    return result
