"""``bench overhead``: steady-state cost of the commit vote, heartbeats and the Slurm watcher.

Contract: the same job (DP2 x PP2, ``small`` model, no faults) on the local Slurm cluster, twice per
repeat, alternating: with tmslurm's commit vote, heartbeats and watcher on, and with all three off.
Prints median step times (commit to commit) side by side and the slowdown in percent; writes
``docs/bench/overhead.json``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tmslurm.bench.common import SlurmJob, median, say, write_json

OFF = ["runtime.commit_vote=false", "runtime.heartbeats=false", "slurm.watch=false"]


def _run(out: Path, name: str, extra: list[str], steps: int, model: str) -> float:
    job = SlurmJob(out / name, ["parallel.dp=2", "parallel.pp=2", f"model={model}", f"train.steps={steps}",
                                "standby.count=0", "slurm.partition=debug", "slurm.time=00:30:00", *extra])
    summary_path = job.run_dir / "summary.json"
    deadline = time.monotonic() + 1800
    while not summary_path.exists() and time.monotonic() < deadline:
        time.sleep(1)
    s = json.loads(summary_path.read_text())
    dts = [e["dt"] for e in s["step_log"][5:]]
    gaps = [b["t_end"] - a["t_end"] for a, b in zip(s["step_log"][5:], s["step_log"][6:])]
    say(f"{name}: median step (commit to commit) {median(gaps):.4f}s, compute {median(dts):.4f}s")
    return median(gaps)


def main(args: Any) -> dict[str, Any]:
    out = Path(args.out).resolve()
    on, off = [], []
    for rep in range(args.repeats):
        on.append(_run(out, f"on-{rep}", [], args.steps, args.model))
        off.append(_run(out, f"off-{rep}", OFF, args.steps, args.model))
    m_on, m_off = median(on), median(off)
    pct = 100.0 * (m_on - m_off) / m_off
    print(f"{'':<28}{'median step':>12}\n{'vote+heartbeats+watcher on':<28}{m_on:>11.4f}s\n{'all off':<28}{m_off:>11.4f}s\n"
          f"slowdown: {pct:+.2f}% (target <= 3%)")
    result = {"setup": {"model": args.model, "steps": args.steps, "repeats": args.repeats, "layout": "DP2 x PP2"},
              "on_s": on, "off_s": off, "median_on_s": m_on, "median_off_s": m_off, "slowdown_pct": pct}
    write_json(Path(args.json), result)
    return result
