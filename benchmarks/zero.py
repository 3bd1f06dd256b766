"""``python -m benchmarks zero``: what the sharded optimizer (parallel.zero=1) and its buddy copies cost.

Contract: for each ``--layouts`` entry (``dp4pp1``, ``dp2pp2``) and each ``--models`` preset, local
processes (``cluster=local``), eager:

- ``bytes``: optimizer bytes per rank at zero=0, at zero=1 without the buddy (the own slice) and with
  it, measured in this process on the runners of every stage after one AdamW step (so the moments
  exist); ``optimizer_bytes_ratio`` = zero=1 with buddy / zero=0, per rank. The zero=1 run's
  summary.json (``optimizer_bytes``, from the ranks themselves) is recorded next to it;
- ``buddy``: one zero=1 run of ``--steps`` steps; each rank times, at every committed step, its buddy
  swap plus its wait for the ward's optimizer step, which overlaps the next all-gather (summary.json
  ``buddy_cost``): the buddy's part of the critical path. Reported: p50 and p90 per rank over the
  steps, and the largest rank's p50 against the run's median step;
- ``drain`` and ``kill`` at zero=0 and zero=1: ``--repeats`` planned moves of rank 1 in one run (one
  standby, replaced after each use), and ``--repeats`` runs with one SIGKILL of rank 1 each. Per event
  ``downtime_s`` and ``pause_s`` from summary.json; p50s and every sample.

Prints a table and writes ``--json`` (docs/bench/zero.json) after each layout. A run that fails
raises TmslurmError naming its log.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import LocalJob, commit, recorded_command, run_local, say, write_json
from benchmarks.statesize import is_planned, nth_standby
from tmslurm.core.config import MODEL_PRESETS, TrainConfig
from tmslurm.core.errors import TmslurmError
from tmslurm.core.topology import Layout, split_layers
from tmslurm.train.model import ReferenceTask
from tmslurm.train.schedule import StageRunner
from tmslurm.train.task import StageSpec
from tmslurm.train.zero import ZeroStageRunner

LAYOUTS = {"dp4pp1": (4, 1), "dp2pp2": (2, 2)}
COMMON = [
    "train.micro_batches=2",
    "train.micro_batch_size=1",
    "runtime.connect_timeout_s=600",
    "runtime.collective_timeout_s=600",
    "runtime.switch_timeout_s=600",
    "detect.heartbeat_timeout_s=5.0",
]


def _p50(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if isinstance(x, (int, float))]
    return round(statistics.median(vals), 4) if vals else None


def optimizer_bytes(model: str, dp: int, pp: int) -> dict[str, Any]:
    """Per stage: optimizer bytes of one rank at zero=0, zero=1 own slice, zero=1 with the buddy."""
    m = MODEL_PRESETS[model]
    task = ReferenceTask(m, TrainConfig())
    rows = []
    for stage, blocks in enumerate(split_layers(m.n_layer, pp)):
        spec = StageSpec(stage, pp, Layout(dp, pp).role_of_stage(stage), blocks)
        whole = StageRunner(task, spec, 0, dp, 1, torch.device("cpu"))
        for p in whole.params:
            p.grad = torch.zeros_like(p)
        whole.apply()
        zero = ZeroStageRunner(task, spec, 0, dp, 1, torch.device("cpu"))
        zero.own.grad, zero.ward.grad = torch.zeros_like(zero.own), torch.zeros_like(zero.ward)
        zero.apply()
        own = sum(t.numel() * t.element_size() for t in zero.optimizer.state[zero.own].values() if t.dim())
        with_buddy = zero.optimizer_bytes()
        rows.append(
            {
                "stage": stage,
                "zero0_bytes": whole.optimizer_bytes(),
                "zero1_own_bytes": own,
                "zero1_with_buddy_bytes": with_buddy,
                "optimizer_bytes_ratio": round(with_buddy / whole.optimizer_bytes(), 4),
                "own_only_ratio": round(own / whole.optimizer_bytes(), 4),
            }
        )
        del whole, zero
    return {"per_stage": rows, "optimizer_bytes_ratio_max": max(r["optimizer_bytes_ratio"] for r in rows)}


def buddy_cost(out: Path, name: str, base: list[str], steps: int) -> dict[str, Any]:
    s = run_local(out / f"{name}-buddy", [*base, "parallel.zero=1", f"train.steps={steps}"], timeout=3600)
    per_rank = {
        r: {"p50_ms": round(c["p50_ms"], 3), "p90_ms": round(c["p90_ms"], 3), "n": c["n"]}
        for r, c in s["buddy_cost"].items()
    }
    worst = max(c["p50_ms"] for c in per_rank.values())
    step = s["median_step_s"]
    return {
        "steps": steps,
        "median_step_s": step,
        "per_rank": per_rank,
        "largest_p50_ms": worst,
        "fraction_of_step": round(worst / 1e3 / step, 4) if step else None,
        "summary_optimizer_bytes": s["optimizer_bytes"],
    }


def drains(out: Path, name: str, base: list[str], zero: int, repeats: int) -> list[dict[str, Any]]:
    job = LocalJob(
        out / f"{name}-zero{zero}-drain",
        [
            *base,
            f"parallel.zero={zero}",
            "standby.count=1",
            "standby.replenish=true",
            "standby.start_when_warm=true",
            "train.steps=1000000",
        ],
    )
    try:
        for i in range(repeats):

            def warm(e: dict[str, Any], i: int = i) -> bool:
                return (
                    e["type"] == "standby_ready"
                    and e["agent"] == nth_standby(job, i)
                    and _warm_everywhere(job, e["agent"])
                )

            job.wait_journal(warm, 1800, f"standby #{i} warm")
            job.request({"type": "notice", "event": "maintenance", "rank": 1, "reason": f"bench zero {i}"})

            def moved(e: dict[str, Any], i: int = i) -> bool:
                return is_planned(e) and sum(map(is_planned, job.journal())) > i

            job.wait_journal(moved, 1800, f"move #{i}")
        summary = job.finish(1800)
    except BaseException:
        job.proc.kill()
        raise
    events = [e for e in summary["events"] if e["kind"] == "planned" and e.get("status") == "done"]
    if len(events) != repeats:
        raise TmslurmError(f"{name} zero={zero}: {len(events)} planned events, expected {repeats}; see {job.run_dir}")
    say(f"{name} zero={zero}: {repeats} drains")
    return events


def _warm_everywhere(job: LocalJob, agent: str) -> bool:
    roles = {e["role"] for e in job.journal() if e["type"] == "standby_ready" and e["agent"] == agent}
    return {"first", "last"} <= roles or "only" in roles


def kills(out: Path, name: str, base: list[str], zero: int, repeats: int) -> list[dict[str, Any]]:
    events = []
    for i in range(repeats):
        s = run_local(
            out / f"{name}-zero{zero}-kill-{i}",
            [
                *base,
                f"parallel.zero={zero}",
                "standby.count=1",
                "standby.start_when_warm=true",
                "train.steps=10",
                "faults=[{step:5,kind:kill,rank:1}]",
            ],
            timeout=3600,
        )
        evs = [e for e in s["events"] if e["kind"] == "unexpected" and e.get("status") == "done"]
        if len(evs) != 1:
            raise TmslurmError(f"{name} zero={zero} kill {i}: events {[e['kind'] for e in s['events']]}; see {out}")
        events.append(evs[0])
    say(f"{name} zero={zero}: {repeats} kills")
    return events


def _cell(events: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "n": len(events),
        "downtime_p50_s": _p50([e.get("downtime_s") for e in events]),
        "pause_p50_s": _p50([e.get("pause_s") for e in events]),
        "downtime_samples_s": [
            round(e["downtime_s"], 4) if isinstance(e.get("downtime_s"), float) else None for e in events
        ],
        "pause_samples_s": [round(e["pause_s"], 4) if isinstance(e.get("pause_s"), float) else None for e in events],
        "transfer_p50_s": _p50([e.get("transfer_s") for e in events]),
    }


def row(out: Path, layout: str, model: str, repeats: int, steps: int) -> dict[str, Any]:
    dp, pp = LAYOUTS[layout]
    name = f"{layout}-{model}"
    base = [f"parallel.dp={dp}", f"parallel.pp={pp}", f"model={model}", *COMMON]
    say(f"== {name}: bytes, buddy cost over {steps} steps, then {repeats} drains and kills at zero=0 and zero=1")
    out_row: dict[str, Any] = {
        "layout": layout,
        "model": model,
        "bytes": optimizer_bytes(model, dp, pp),
        "buddy": buddy_cost(out, name, base, steps),
    }
    for zero in (0, 1):
        out_row[f"zero{zero}"] = {
            "drain": _cell(drains(out, name, base, zero, repeats)),
            "kill": _cell(kills(out, name, base, zero, repeats)),
        }
    z0, z1 = out_row["zero0"]["kill"]["downtime_p50_s"], out_row["zero1"]["kill"]["downtime_p50_s"]
    out_row["unexpected_downtime_ratio"] = round(z1 / z0, 3) if z0 and z1 is not None else None
    return out_row


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| layout | model | opt. bytes ratio (zero=1+buddy / zero=0) | buddy ms/step p50 (share of step) "
        "| drain downtime p50 zero0 / zero1 | kill downtime p50 zero0 / zero1 |\n|---|---|---:|---:|---:|---:|"
    )
    lines = [head]
    for r in rows:
        b = r["buddy"]
        lines.append(
            f"| {r['layout']} | {r['model']} | {r['bytes']['optimizer_bytes_ratio_max']:.3f} "
            f"| {b['largest_p50_ms']:.2f} ({100 * (b['fraction_of_step'] or 0):.2f} % of {b['median_step_s']:.3f} s) "
            f"| {r['zero0']['drain']['downtime_p50_s']} / {r['zero1']['drain']['downtime_p50_s']} "
            f"| {r['zero0']['kill']['downtime_p50_s']} / {r['zero1']['kill']['downtime_p50_s']} |"
        )
    return "\n".join(lines)


def main(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out).resolve()
    rows = []
    for layout in args.layouts.split(","):
        if layout not in LAYOUTS:
            raise TmslurmError(f"--layouts: unknown layout {layout!r}; known: {', '.join(LAYOUTS)}")
        for model in args.models.split(","):
            rows.append(row(out, layout, model, args.repeats, args.steps))
            print(table(rows), flush=True)
            write_json(Path(args.json), _result(rows))
    return _result(rows)


def _result(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "command": recorded_command("zero"),
        "commit": commit(),
        "date": datetime.date.today().isoformat(),
        "setup": {
            "host": "local processes on one 2-core machine, loopback, eager; 2 micro-batches of 1 sequence",
            "buddy": "mutual pairs: dp rank XOR 1",
        },
        "rows": rows,
    }
