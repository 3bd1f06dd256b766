"""``bench memory``: stayers' peak RSS before and after a switch, and a standby's RSS per warmed role.

Contract: one local run (DP2 x PP2, ``small`` model, one standby, a planned drain of rank 1 and a
SIGKILL of rank 2); reads each rank's peak RSS from the step log (reported with every vote) and
the standby's RSS per role from the journal. Prints the table and writes ``docs/bench/memory.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.common import run_local, say, write_json


def main(args: Any) -> dict[str, Any]:
    out = Path(args.out).resolve()
    steps = args.steps
    s = run_local(
        out / "memory",
        [
            "parallel.dp=2",
            "parallel.pp=2",
            f"model={args.model}",
            "standby.count=2",
            f"train.steps={steps}",
            "bench.step_delay_s=0.05",
            f"faults=[{{step:{steps // 3},kind:drain,rank:1}},{{step:{2 * steps // 3},kind:kill,rank:2}}]",
        ],
    )
    events = sorted(s["events"], key=lambda e: e["switched_t"])
    first_switch = events[0]["switched_t"]
    rows = []
    for rank in (0, 3):  # stayers through both events
        before = max(
            e["peak_rss_mb"][str(rank)]
            for e in s["step_log"]
            if e["t_end"] < first_switch and str(rank) in e["peak_rss_mb"]
        )
        after = max(e["peak_rss_mb"][str(rank)] for e in s["step_log"] if str(rank) in e["peak_rss_mb"])
        rows.append({"rank": rank, "peak_before_mb": before, "peak_after_mb": after, "delta_mb": after - before})
        say(
            f"stayer rank {rank}: peak RSS {before:.1f} MiB before, {after:.1f} MiB after the switches "
            f"({after - before:+.1f})"
        )
    journal = [json.loads(x) for x in (out / "memory" / "events.jsonl").read_text().splitlines()]
    roles = [
        {
            "agent": e["agent"],
            "role": e["role"],
            "rss_mb": e["rss_mb"],
            "role_rss_mb": e["role_rss_mb"],
            "warmup_s": e["warmup_s"],
        }
        for e in journal
        if e["type"] == "standby_ready"
    ]
    for r in roles:
        say(
            f"standby {r['agent']} role {r['role']}: RSS {r['rss_mb']:.1f} MiB (+{r['role_rss_mb']:.1f} since start), "
            f"warm-up {r['warmup_s']:.2f}s"
        )
    result = {
        "setup": {"model": args.model, "events": [e["kind"] for e in events]},
        "stayers": rows,
        "standby_roles": roles,
        "final_params_sha256": s["final_params_sha256"],
    }
    write_json(Path(args.json), result)
    return result
