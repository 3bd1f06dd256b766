"""``bench gray``: a slow node on the failure lab, found and moved off (or not), and what it cost.

Contract: on the local Slurm cluster (``scripts/local-slurm up``), ``--repeats`` runs per kind of
slowness, each a fresh DP2 x PP2 job (``--model``, one warm standby, ``gray.evict=true``).
After ``--baseline`` committed steps the benchmark slows rank 1's node itself through the lab
(``throttle NODE PCT`` or ``slowlink NODE RATE``, at a moment it knows), then waits for the
controller's ``gray_evict`` or for ``--observe`` more steps, stops the run and undoes the slowness.
Per run it records: the steps and seconds from the slowness to the eviction (None when there was
none), the steps lost to the straggler (the sum over the slowed steps, up to the move, of the
extra step time in units of the median step before it), the median step before and while slowed,
and any eviction before the slowness (a false alarm). It prints the table and writes ``--json``.
Failure behaviour: a run that does not start or a lab command that fails raises
:class:`~tmslurm.core.errors.TmslurmError`; the lab is healed in every case.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.common import SlurmJob, commit, local_slurm, recorded_command, say, write_json
from tmslurm.controller.journal import read_journal
from tmslurm.controller.snapshot import read_steps
from tmslurm.core.errors import TmslurmError
from tmslurm.core.rundir import RunDir
from tmslurm.slurm.lab import fault_moment

KINDS = {"throttle": "throttle", "slowlink": "slowlink"}


def _moved(e: dict[str, Any]) -> bool:
    """An event that moved rank 1 off its node: planned (the eviction's switch) or unexpected (hung first)."""
    return e.get("kind") in ("planned", "unexpected") and e.get("status") == "done" and 1 in (e.get("ranks") or [])


def _median_gap(steps: list[dict[str, Any]]) -> float | None:
    gaps = [b["t_end"] - a["t_end"] for a, b in zip(steps, steps[1:]) if b["step"] == a["step"] + 1]
    return statistics.median(gaps) if gaps else None


def _wait_steps(job: SlurmJob, step: int, timeout: float) -> None:
    job.wait(lambda st: st.get("step", 0) >= step, timeout, f"step {step}")


def one(out: Path, kind: str, amount: str, i: int, args: argparse.Namespace) -> dict[str, Any]:
    run_dir = out / f"{kind}-{i}"
    job = SlurmJob(
        run_dir,
        [
            "parallel.dp=2",
            "parallel.pp=2",
            f"model={args.model}",
            "standby.count=1",
            "standby.start_when_warm=true",
            "gray.evict=true",
            "train.steps=1000000",
            "slurm.partition=debug",
            "slurm.time=00:20:00",
            "detect.heartbeat_timeout_s=3.0",
        ],
    )
    rd = RunDir(run_dir)
    node = None
    try:
        job.warm_pool(1)
        _wait_steps(job, args.baseline, 600)
        node, _ = job.node_of_rank(1)
        s0 = job.status()["step"]
        t0 = fault_moment(local_slurm(kind, node, amount))
        if t0 is None:
            raise TmslurmError(f"local-slurm {kind} {node} {amount} printed no at=")
        deadline = time.monotonic() + args.timeout
        evict = None
        while time.monotonic() < deadline:
            evict = next((e for e in read_journal(rd.events) if e["type"] == "gray_evict"), None)
            if evict is not None or job.status().get("step", 0) >= s0 + args.observe:
                break
            time.sleep(0.5)
        if evict is not None:  # the move itself: wait for its event (planned; or unexpected, when the
            # slow rank was found hung first: the only vote missing for detect.hang_factor x the median step)
            job.wait(lambda st: any(_moved(e) for e in st.get("events", [])), 300, "the move off the slow node")
        summary = job.stop()
    finally:
        if node is not None:
            local_slurm(kind, node, "off")
    return _row(kind, amount, node, s0, t0, rd, summary)


def _row(kind: str, amount: str, node: str, s0: int, t0: float, rd: RunDir, summary: dict[str, Any]) -> dict[str, Any]:
    journal = read_journal(rd.events)
    steps = read_steps(rd.steps)
    evicts = [e for e in journal if e["type"] == "gray_evict"]
    false_alarms = [e for e in evicts if e["t"] < t0]
    evict = next((e for e in evicts if e["t"] >= t0), None)
    moved = next((e for e in summary["events"] if _moved(e)), None)
    end = moved["target_step"] if moved else (steps[-1]["step"] if steps else s0)
    before = _median_gap([e for e in steps if e["step"] < s0])
    slowed = [e for e in steps if s0 <= e["step"] <= end]
    during = _median_gap(slowed)
    lost = None
    if before:
        gaps = [b["t_end"] - a["t_end"] for a, b in zip(slowed, slowed[1:]) if b["step"] == a["step"] + 1]
        lost = round(sum(max(0.0, g - before) for g in gaps) / before, 2)
    return {
        "kind": kind,
        "amount": amount,
        "node": node,
        "slowed_at_step": s0,
        "evicted": evict is not None,
        "detect_steps": evict["step"] - s0 if evict else None,
        "detect_s": round(evict["t"] - t0, 3) if evict else None,
        "ratio": evict.get("ratio") if evict else None,
        "found_by": evict.get("cause") if evict else None,
        "best_mbps": evict.get("best_mbps") if evict else None,
        "median_mbps": evict.get("median_mbps") if evict else None,
        "moved_at_step": moved["target_step"] if moved else None,
        "moved_by": moved["kind"] if moved else None,
        "steps_lost": lost,
        "median_step_before_s": round(before, 4) if before else None,
        "median_step_slowed_s": round(during, 4) if during else None,
        "false_alarms": len(false_alarms),
        "peak_ratio": (summary.get("gray") or {}).get("peak_ratio"),
        "link_best_mbps": (summary.get("links") or {}).get("best_mbps"),
        "replicas_equal": summary.get("replicas_equal"),
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| kind | amount | evicted | found by | detect steps | detect s | steps lost | median step before / slowed s | "
        "false alarms |",
        "|---|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['kind']} | {r['amount']} | {r['evicted']} | {r['found_by']} | {r['detect_steps']} "
            f"| {r['detect_s']} | {r['steps_lost']} "
            f"| {r['median_step_before_s']} / {r['median_step_slowed_s']} | {r['false_alarms']} |"
        )
    return "\n".join(lines)


def main(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out).resolve()
    rows: list[dict[str, Any]] = []
    for spec in args.kinds.split(","):
        kind, _, amount = spec.partition(":")
        if kind not in KINDS or not amount:
            raise TmslurmError(f"--kinds: {spec!r} is not throttle:PCT or slowlink:RATE")
        for i in range(args.repeats):
            say(f"== {kind} {amount}: run {i + 1}/{args.repeats}")
            rows.append(one(out, kind, amount, i, args))
            print(table(rows), flush=True)
            write_json(Path(args.json), _result(rows, args))
    return _result(rows, args)


def _result(rows: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    return {
        "command": recorded_command("gray"),
        "commit": commit(),
        "date": datetime.date.today().isoformat(),
        "setup": {
            "cluster": "local Slurm (scripts/local-slurm), one rank per lab node, all on one 2-core host",
            "layout": "DP2 x PP2",
            "model": args.model,
            "gray": "gray.evict=true (busy times and link probes), defaults otherwise",
            "slowed": "rank 1's node, by the benchmark through the lab, after --baseline steps",
        },
        "rows": rows,
    }
