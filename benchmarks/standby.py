"""``bench standby``: what a warm standby costs while it waits: CPU per training step and memory.

Contract: one local run of DP1 x PP3 x TP2 (the shape classes first, middle and last, each at two TP
positions; ``--model`` with ``model.n_layer=4``), paced at ``--step-delay-s`` (>= 0.5 s: a step
of real training), with ``--standbys`` universal standbys. Once every standby has warmed every
shape class (journal ``standby_ready``), each standby process (pid from its agent id, checked
against ``/proc/<pid>/cmdline``; only read, never signalled) is sampled over ``--idle-s``: its
on-CPU seconds (all threads, ``/proc/<pid>/task/*/schedstat``) and RSS. Per standby it reports the
CPU share of one core, the CPU ms per training step, the RSS, and per shape class the RSS growth
that class's warm-up added (``role_rss_mb``). Writes ``--json``; a run that fails raises
TmslurmError with the run directory.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from benchmarks.common import LocalJob, commit, say, write_json
from benchmarks.procstat import proc_sample
from tmslurm.core.errors import TmslurmError

DP, PP, TP, N_LAYER = 1, 3, 2, 4
CLASSES = ("first", "middle", "last")


def _pid(aid: str) -> int:
    return int(aid.split(".", 1)[1].split("#", 1)[0])  # agent ids: <kind><n>.<pid>#<conn>


def _ready(job: LocalJob, standbys: int) -> dict[str, list[dict[str, Any]]]:
    """Agent id -> its standby_ready entries, once every standby has warmed every class."""
    by_agent: dict[str, list[dict[str, Any]]] = {}
    for e in job.journal():
        if e.get("type") == "standby_ready" and e.get("warm", True):
            by_agent.setdefault(e["agent"], []).append(e)
    done = {a: es for a, es in by_agent.items() if {e["role"] for e in es} >= set(CLASSES)}
    return done if len(done) >= standbys else {}


def main(args: Any) -> dict[str, Any]:
    run_dir = Path(args.out).resolve() / "standby"
    job = LocalJob(
        run_dir,
        [
            f"parallel.dp={DP}",
            f"parallel.pp={PP}",
            f"parallel.tp={TP}",
            f"model={args.model}",
            f"model.n_layer={N_LAYER}",
            f"model.compile={str(args.compile).lower()}",
            f"standby.count={args.standbys}",
            "train.steps=1000000",
            f"bench.step_delay_s={args.step_delay_s}",
        ],
    )
    deadline = time.monotonic() + 900
    while not (ready := _ready(job, args.standbys)):
        if job.proc.poll() is not None or time.monotonic() > deadline:
            raise TmslurmError(f"run {run_dir}: the standbys did not all warm up (see {job.log.name})")
        time.sleep(0.5)
    pids = {a: _pid(a) for a in ready}
    for aid, pid in pids.items():
        if "tmslurm" not in Path(f"/proc/{pid}/cmdline").read_text(errors="replace"):
            raise TmslurmError(f"pid {pid} of {aid} is not a tmslurm process")
    say(f"{len(pids)} standbys warm; sampling {args.idle_s:.0f}s while training runs at {args.step_delay_s}s per step")
    step0, t0 = _step(job), time.monotonic()
    first = {a: proc_sample(p) for a, p in pids.items()}
    time.sleep(args.idle_s)  # the measurement window itself, not a wait for a condition
    last = {a: proc_sample(p) for a, p in pids.items()}
    wall, steps = time.monotonic() - t0, _step(job) - step0
    summary = job.finish()
    rows: list[dict[str, Any]] = []
    for aid in pids:
        cpu = last[aid].cpu_s - first[aid].cpu_s
        rows.append(
            {
                "standby": aid.split(".", 1)[0],
                "classes": sorted({e["role"] for e in ready[aid]}),
                "cpu_s": cpu,
                "wall_s": wall,
                "cpu_pct_of_a_core": 100 * cpu / wall,
                "cpu_ms_per_step": 1000 * cpu / steps if steps else None,
                "rss_mb": last[aid].rss_mb,
                "role_rss_mb": {e["role"]: e["role_rss_mb"] for e in ready[aid]},
                "warmup_s": {e["role"]: e["warmup_s"] for e in ready[aid]},
            }
        )
        r = rows[-1]
        say(
            f"{r['standby']}: {r['cpu_pct_of_a_core']:.2f}% of a core, "
            f"{r['cpu_ms_per_step'] or 0:.2f} ms CPU per step, "
            f"RSS {r['rss_mb']:.0f} MiB (per class: "
            + ", ".join(f"{k} +{v:.0f}" for k, v in r["role_rss_mb"].items())
            + ")"
        )
    result = {
        "command": f"python -m benchmarks standby --standbys {args.standbys} --idle-s {args.idle_s:g} "
        f"--step-delay-s {args.step_delay_s:g}",
        "commit": commit(),
        "date": time.strftime("%Y-%m-%d"),
        "setup": {
            "layout": f"DP{DP} x PP{PP} x TP{TP}",
            "model": args.model,
            "n_layer": N_LAYER,
            "compile": args.compile,
            "step_delay_s": args.step_delay_s,
            "idle_s": args.idle_s,
        },
        "steps_in_window": steps,
        "median_step_s": summary.get("median_step_s"),
        "standbys": rows,
    }
    write_json(Path(args.json), result)
    return result


def _step(job: LocalJob) -> int:
    return int(job.request({"type": "status"})["status"]["step"])
