"""``bench overhead``: steady-state cost of the commit vote, heartbeats and the Slurm watcher.

Contract: the same job (DP2 x PP2, ``small`` model, no faults, each step paced to at least
``--step-delay-s`` more than its compute, as a real step of >= 0.5 s) on the local Slurm cluster,
twice per repeat, alternating: with tmslurm's commit vote, heartbeats, node monitors and watcher
on, and with all of them off. Prints median step times (commit to commit) side by side with every
repeat, and the cost in ms per step and in percent; writes ``docs/bench/overhead.json``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from benchmarks.common import SlurmJob, median_of, say, write_json

OFF = ["bench.commit_vote=false", "bench.heartbeats=false", "slurm.watch=false"]


def _run(out: Path, name: str, extra: list[str], steps: int, model: str, delay_s: float) -> float:
    job = SlurmJob(
        out / name,
        [
            "parallel.dp=2",
            "parallel.pp=2",
            f"model={model}",
            f"train.steps={steps}",
            f"bench.step_delay_s={delay_s}",
            "standby.count=0",
            "slurm.partition=debug",
            "slurm.time=00:30:00",
            *extra,
        ],
    )
    summary_path = job.run_dir / "summary.json"
    deadline = time.monotonic() + 1800
    while not summary_path.exists() and time.monotonic() < deadline:
        time.sleep(1)
    s = json.loads(summary_path.read_text())
    dts = [e["dt"] for e in s["step_log"][5:]]
    gaps = [b["t_end"] - a["t_end"] for a, b in zip(s["step_log"][5:], s["step_log"][6:])]
    step = median_of(gaps, f"the step gaps of {name}")
    say(f"{name}: median step (commit to commit) {step:.4f}s, compute {median_of(dts, f'the compute of {name}'):.4f}s")
    return step


def main(args: Any) -> dict[str, Any]:
    out = Path(args.out).resolve()
    on, off = [], []
    for rep in range(args.repeats):
        on.append(_run(out, f"on-{rep}", [], args.steps, args.model, args.step_delay_s))
        off.append(_run(out, f"off-{rep}", OFF, args.steps, args.model, args.step_delay_s))
    m_on, m_off = median_of(on, "the runs with the monitors"), median_of(off, "the runs without")
    pct = 100.0 * (m_on - m_off) / m_off
    deltas = [1000 * (a - b) for a, b in zip(on, off)]
    print(
        f"{'':<34}{'median step':>12}   per repeat\n"
        f"{'vote+heartbeats+monitors+watcher':<34}{m_on:>11.4f}s   {', '.join(f'{x:.4f}' for x in on)}\n"
        f"{'all off':<34}{m_off:>11.4f}s   {', '.join(f'{x:.4f}' for x in off)}\n"
        f"cost: {1000 * (m_on - m_off):+.2f} ms per step ({pct:+.2f}% of the step; per repeat "
        f"{', '.join(f'{d:+.2f}' for d in deltas)} ms; n={args.repeats} pairs)"
    )
    result = {
        "setup": {
            "model": args.model,
            "steps": args.steps,
            "repeats": args.repeats,
            "layout": "DP2 x PP2",
            "step_delay_s": args.step_delay_s,
        },
        "on_s": on,
        "off_s": off,
        "median_on_s": m_on,
        "median_off_s": m_off,
        "slowdown_pct": pct,
        "cost_ms_per_step": 1000 * (m_on - m_off),
        "cost_ms_per_repeat": deltas,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    write_json(Path(args.json), result)
    return result
