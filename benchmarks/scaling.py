"""``bench scaling``: one planned switch at 4, 8 and 16 ranks, delta switch against a full rebuild.

Contract: local processes (``cluster=local``), tiny model, DP x PP2 layouts with 4, 8, 16 ranks and
one standby; the same drain of rank 1 with ``bench.switch_mode=delta`` (only the groups containing
the leaver, built in the background) and ``full`` (every group rebuilt inside the pause). Prints
phase-2 time and downtime for both series side by side and the 16-vs-4 ratios; writes
``docs/bench/scaling.json`` (the command, commit and date, every row, and per size and mode the
sample count, median, min and max).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from benchmarks.common import LocalJob, commit, median, median_of, recorded_command, say, write_json


def _one(out: Path, ranks: int, mode: str, rep: int, steps: int) -> dict[str, Any]:
    dp = ranks // 2
    job = LocalJob(
        out / f"r{ranks}-{mode}-{rep}",
        [
            f"parallel.dp={dp}",
            "parallel.pp=2",
            "standby.count=1",
            "train.steps=100000",
            "bench.step_delay_s=0.02",
            f"bench.switch_mode={mode}",
            "runtime.connect_timeout_s=300",
        ],
    )
    for role in ("first", "last"):

        def warm(e: dict[str, Any], role: str = role) -> bool:
            return e["type"] == "standby_ready" and e["role"] == role

        job.wait_journal(warm, 900, f"standby warm for {role}")
    job.request({"type": "notice", "event": "maintenance", "rank": 1, "reason": "bench scaling"})
    job.wait_journal(lambda e: e["type"] == "event", 600, "the switch to complete")
    time.sleep(steps * 0.05)
    s = job.finish()
    (ev,) = [e for e in s["events"] if e["kind"] == "planned"]
    row = {
        "ranks": ranks,
        "mode": mode,
        "repeat": rep,
        "phase2_s": ev.get("phase2_s"),
        "downtime_s": ev.get("downtime_s"),
        "phase1_s": ev.get("phase1_s"),
        "groups_rebuilt": None,
        "median_step_s": s["median_step_s"],
    }
    say(f"{ranks:>3} ranks {mode:<5} #{rep}: phase2 {row['phase2_s']:.3f}s downtime {row['downtime_s']:.3f}s")
    return row


def table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'ranks':>5}{'delta phase2':>14}{'full phase2':>13}{'delta downtime':>16}{'full downtime':>15}"]
    sizes = sorted({r["ranks"] for r in rows})
    med = {
        (n, m, k): median_of([r[k] for r in rows if r["ranks"] == n and r["mode"] == m], f"{k} ({m}, {n} ranks)")
        for n in sizes
        for m in ("delta", "full")
        for k in ("phase2_s", "downtime_s")
    }
    for n in sizes:
        lines.append(
            f"{n:>5}{med[(n, 'delta', 'phase2_s')]:>13.3f}s{med[(n, 'full', 'phase2_s')]:>12.3f}s"
            f"{med[(n, 'delta', 'downtime_s')]:>15.3f}s{med[(n, 'full', 'downtime_s')]:>14.3f}s"
        )
    if len(sizes) > 1:
        a, b = sizes[0], sizes[-1]
        for m in ("delta", "full"):
            lines.append(
                f"{m}: downtime {b} ranks / {a} ranks = "
                f"{med[(b, m, 'downtime_s')] / max(med[(a, m, 'downtime_s')], 1e-9):.2f}x, "
                f"phase2 = {med[(b, m, 'phase2_s')] / max(med[(a, m, 'phase2_s')], 1e-9):.2f}x"
            )
    return "\n".join(lines)


def spread(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per size and mode: n, median, min and max of the downtime and of phase 2."""
    out = []
    for n in sorted({r["ranks"] for r in rows}):
        for m in ("delta", "full"):
            cell = [r for r in rows if r["ranks"] == n and r["mode"] == m]
            entry: dict[str, Any] = {"ranks": n, "mode": m, "n": len(cell)}
            for k in ("downtime_s", "phase2_s"):
                xs = [r[k] for r in cell if r[k] is not None]
                entry[k] = {"median": median(xs), "min": min(xs, default=None), "max": max(xs, default=None)}
            out.append(entry)
    return out


def main(args: Any) -> dict[str, Any]:
    out = Path(args.out).resolve()
    rows = [
        _one(out, n, mode, rep, args.steps)
        for n in args.sizes
        for rep in range(args.repeats)
        for mode in ("delta", "full")
    ]
    print(table(rows))
    result = {
        "command": recorded_command("scaling"),
        "commit": commit(),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "setup": {
            "model": "tiny",
            "layout": "DP x PP2, one standby, drain of rank 1",
            "repeats": args.repeats,
            "host": "local processes on one 2-core machine",
        },
        "rows": rows,
        "spread": spread(rows),
    }
    write_json(Path(args.json), result)
    return result
