"""``python -m benchmarks ctlrestart``: what a ``kill -9`` of the controller costs a run.

Contract: runs the same job twice (``--dp`` x ``--pp``, ``--model``, one warm standby, ``--steps``
steps): once uninterrupted (``cluster=local``: the numerics do not depend on where ranks run), once
on ``--cluster`` (``local``, or ``slurm`` on the local cluster, ``scripts/local-slurm up``) with
the controller process (the pid in ``controller.json``, checked to be a child of the launcher this
bench started, or on Slurm to be this run's ``tmslurm.slurm.proc.ctlmain`` process) SIGKILLed at
``--kills`` random committed steps, one kill after the previous restart was adopted
(``runtime.controller_restarts`` = ``--kills``). Per ``controller_restart`` event of the summary it
prints the downtime and its parts (``before_death``, ``restart``, ``adopt``, ``first_step``, which
add up to the gap; downtime = gap - median step), then p50/p90 of each over the events, and whether
the interrupted run ended bit-identical to the uninterrupted one (``final_state_sha256``). Writes
``--json``. A run that fails, a controller that is not the launcher's child, or a restart that is
not adopted within 60 s raises :class:`~tmslurm.core.errors.TmslurmError`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.common import LocalJob, SlurmJob, commit, run_local, say, write_json
from tmslurm.core.errors import TmslurmError

PARTS = ("before_death_s", "restart_s", "adopt_s", "first_step_s", "gap_s", "downtime_s")


def children(pid: int) -> set[int]:
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        out |= {int(c) for c in (task / "children").read_text().split()}
    return out


def committed(run_dir: Path) -> int:
    try:
        return int(json.loads((run_dir / "snapshot.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return 0


def kill_controller(job: LocalJob) -> int:
    pid = int(json.loads((job.run_dir / "controller.json").read_text())["pid"])
    if pid not in children(job.proc.pid):
        raise TmslurmError(f"pid {pid} in controller.json is not a child of the launcher {job.proc.pid}")
    os.kill(pid, signal.SIGKILL)
    return pid


def kill_slurm_controller(run_dir: Path, incarnation: int, timeout: float = 60) -> int:
    """SIGKILL this run's Slurm controller of ``incarnation`` (the lab's nodes share this pid namespace)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            info = json.loads((run_dir / "controller.json").read_text())
            cmd = Path(f"/proc/{int(info['pid'])}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, KeyError):
            cmd = []
        if (
            info.get("incarnation") == incarnation
            and b"tmslurm.slurm.proc.ctlmain" in cmd
            and str(run_dir).encode() in cmd
        ):
            os.kill(int(info["pid"]), signal.SIGKILL)
            return int(info["pid"])
        time.sleep(0.05)
    raise TmslurmError(f"no controller of incarnation {incarnation} of {run_dir} on this host")


def interrupted_slurm(out: Path, overrides: list[str], kill_steps: list[int]) -> dict[str, Any]:
    run_dir = (out / "killed-slurm").resolve()
    SlurmJob(
        run_dir,
        [
            *overrides,
            f"runtime.controller_restarts={len(kill_steps)}",
            "slurm.partition=debug",
            "slurm.time=00:30:00",
            "slurm.poll_interval_s=0.5",
        ],
    )
    for i, step in enumerate(kill_steps):
        deadline = time.monotonic() + 600
        while committed(run_dir) < step:
            if (run_dir / "summary.json").exists() or time.monotonic() > deadline:
                raise TmslurmError(f"the run ended or stalled before step {step}; see {run_dir}")
            time.sleep(0.01)
        say(
            f"kill {i + 1}/{len(kill_steps)}: SIGKILL of controller {kill_slurm_controller(run_dir, i)} at step "
            f"{committed(run_dir)}"
        )
        wait_journal(
            run_dir, lambda e, i=i: e["type"] == "adopted" and e["incarnation"] == i + 1, 60, f"adoption {i + 1}"
        )
    deadline = time.monotonic() + 900
    while not (run_dir / "summary.json").exists():
        if time.monotonic() > deadline:
            raise TmslurmError(f"no summary after 900s; see {run_dir}")
        time.sleep(0.5)
    return json.loads((run_dir / "summary.json").read_text())


def wait_journal(run_dir: Path, pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = (run_dir / "events.jsonl").read_text().splitlines() if (run_dir / "events.jsonl").exists() else []
        if any(pred(json.loads(line)) for line in lines):
            return
        time.sleep(0.05)
    raise TmslurmError(f"timed out after {timeout:.0f}s waiting for {what}; see {run_dir}")


def interrupted(out: Path, overrides: list[str], kill_steps: list[int]) -> dict[str, Any]:
    job = LocalJob(out / "killed", [*overrides, f"runtime.controller_restarts={len(kill_steps)}"])
    for i, step in enumerate(kill_steps):
        deadline = time.monotonic() + 300
        while committed(job.run_dir) < step:
            if job.proc.poll() is not None or time.monotonic() > deadline:
                raise TmslurmError(f"the run ended or stalled before step {step}; see {job.run_dir}")
            time.sleep(0.01)
        say(
            f"kill {i + 1}/{len(kill_steps)}: SIGKILL of controller {kill_controller(job)} at step "
            f"{committed(job.run_dir)}"
        )

        def adopted(e: dict[str, Any], i: int = i) -> bool:
            return e["type"] == "adopted" and e["incarnation"] == i + 1

        job.wait_journal(adopted, 60, f"adoption {i + 1}")
    if job.proc.wait(600) != 0:
        raise TmslurmError(f"the interrupted run failed; see {job.run_dir}")
    return json.loads((job.run_dir / "summary.json").read_text())


def spread(values: list[float]) -> dict[str, float]:
    qs = statistics.quantiles(values, n=10) if len(values) > 1 else values * 9
    return {"p50": statistics.median(values), "p90": qs[8], "n": len(values)}


def main(args: argparse.Namespace) -> None:
    out = Path(args.out)
    overrides = [
        f"parallel.dp={args.dp}",
        f"parallel.pp={args.pp}",
        f"model={args.model}",
        "standby.count=1",
        f"train.steps={args.steps}",
        f"bench.step_delay_s={args.step_delay_s}",
        "standby.start_when_warm=true",
    ]
    gap = (args.steps - 30) // args.kills
    rng = random.Random(args.seed)
    kill_steps = [15 + i * gap + rng.randrange(gap // 2) for i in range(args.kills)]
    say(f"reference run ({args.steps} steps) -> {out}/reference")
    ref = run_local(out / "reference", overrides)
    say(f"interrupted run: kills at steps {kill_steps} -> {out}/killed")
    s = (interrupted_slurm if args.cluster == "slurm" else interrupted)(out, overrides, kill_steps)
    events = [e for e in s["events"] if e["kind"] == "controller_restart"]
    exact = s["final_state_sha256"] == ref["final_state_sha256"] and s["replicas_equal"] is True
    say(f"{'#':>3}{'downtime':>10}{'before death':>14}{'restart':>9}{'adopt':>8}{'first step':>12}{'gap':>8}")
    for i, e in enumerate(events, 1):
        say(
            f"{i:>3}{e['downtime_s']:>9.3f}s{e['before_death_s']:>13.3f}s{e['restart_s']:>8.3f}s{e['adopt_s']:>7.3f}s"
            f"{e['first_step_s']:>11.3f}s{e['gap_s']:>7.3f}s"
        )
    summary = {p: spread([e[p] for e in events]) for p in PARTS if events}
    for p, v in summary.items():
        say(f"{p:<15} p50 {v['p50']:.3f}s  p90 {v['p90']:.3f}s  (n={v['n']})")
    say(f"median step {s['median_step_s']:.3f}s; exact: {exact} ({s['final_state_sha256']})")
    write_json(
        Path(args.json),
        {
            "command": "python -m benchmarks ctlrestart "
            + " ".join(
                f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in ("cmd", "out", "json")
            ),
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "commit": commit(),
            "cluster": args.cluster,
            "kill_steps": kill_steps,
            "overrides": overrides,
            "median_step_s": s["median_step_s"],
            "exact": exact,
            "events": events,
            "spread": summary,
        },
    )
