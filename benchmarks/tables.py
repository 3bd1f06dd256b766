"""``bench tables``: render the figures in ``docs/bench/*.json`` as markdown tables.

Contract: reads whichever of downtime.json, scaling.json, memory.json, overhead.json and
chaos.json exist in ``--dir`` and prints markdown (used to write docs/benchmarks.md, so the
page shows exactly the measured numbers). Missing files are skipped with a note.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks import dtstats
from benchmarks.common import median


def _f(x: Any, unit: str = "s", nd: int = 3) -> str:
    return "–" if not isinstance(x, (int, float)) else f"{x:.{nd}f}{unit}"


def downtime(d: dict[str, Any]) -> str:
    if "reference" not in d:
        return "(docs/bench/downtime.json is of the old format; run `python -m benchmarks downtime` again)"
    runs = ", ".join(f"{k}: {', '.join(v['commits'])}" for k, v in d.get("runs", {}).items())
    return (
        f"Reference step {d['reference']['median_step_s']:.3f}s; commits per strategy: {runs}; commands:\n\n"
        + "\n".join(f"    {c}" for c in d.get("commands", []))
        + "\n\n"
        + dtstats.table(d)
    )


def scaling(d: dict[str, Any]) -> str:
    sizes = sorted({r["ranks"] for r in d["rows"]})
    out = ["| ranks | delta phase 2 | full phase 2 | delta downtime | full downtime |", "|---|---|---|---|---|"]
    for n in sizes:
        med = {
            (m, k): median([r[k] for r in d["rows"] if r["ranks"] == n and r["mode"] == m])
            for m in ("delta", "full")
            for k in ("phase2_s", "downtime_s")
        }
        out.append(
            f"| {n} | {_f(med[('delta', 'phase2_s')], 's', 4)} | {_f(med[('full', 'phase2_s')], 's', 4)} | "
            f"{_f(med[('delta', 'downtime_s')], 's', 4)} | {_f(med[('full', 'downtime_s')], 's', 4)} |"
        )
    return "\n".join(out)


def memory(d: dict[str, Any]) -> str:
    out = ["| stayer rank | peak RSS before | peak RSS after | change |", "|---|---|---|---|"]
    for r in d["stayers"]:
        out.append(
            f"| {r['rank']} | {r['peak_before_mb']:.1f} MiB | {r['peak_after_mb']:.1f} MiB | {r['delta_mb']:+.1f} MiB |"
        )
    out += ["", "| standby | role | RSS | growth since start | warm-up |", "|---|---|---|---|---|"]
    for r in d["standby_roles"]:
        out.append(
            f"| {r['agent'].split('.')[0]} | {r['role']} | {r['rss_mb']:.0f} MiB | +{r['role_rss_mb']:.0f} MiB | "
            f"{r['warmup_s']:.2f}s |"
        )
    return "\n".join(out)


def overhead(d: dict[str, Any]) -> str:
    return "\n".join(
        [
            "| configuration | runs (median step, commit to commit) | median |",
            "|---|---|---|",
            f"| vote + heartbeats + watcher on | {', '.join(_f(x, 's', 4) for x in d['on_s'])} | "
            f"{_f(d['median_on_s'], 's', 4)} |",
            f"| all off | {', '.join(_f(x, 's', 4) for x in d['off_s'])} | {_f(d['median_off_s'], 's', 4)} |",
            "",
            f"Slowdown: **{d['slowdown_pct']:+.2f}%** (target ≤ 3%).",
        ]
    )


def _counts(d: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(d.items())) or "none"


def chaos(d: dict[str, Any]) -> str:
    """The soak (benchmarks/chaos.py): what was injected, what the run did, what the checker found."""
    dt, st = d["downtime_s"], d["setup"]
    checks = ", ".join(f"{k} {v['status']}" for k, v in d["checks"].items())
    rows = [
        (
            "soak",
            f"{d['soak_minutes']:.1f} min, {d['steps']} steps, {st['layout']}, model={st['model']}, "
            f"standbys {st['standbys']}, a fault every {st['gap_s'][0]:g}-{st['gap_s'][1]:g} s (seed {st['seed']})",
        ),
        ("faults", f"{d['faults']}: {_counts(d['faults_by_kind'])}"),
        ("events", f"{sum(d['events_by_kind'].values())}: {_counts(d['events_by_kind'])}"),
        ("switches / checkpoint fallbacks", f"{d['switches']} / {d['checkpoint_fallbacks']}"),
        ("downtime per event", f"n={dt['n']}, p50 {_f(dt['p50'])}, p90 {_f(dt['p90'])}, max {_f(dt['max'])}"),
        ("downtime in all", _f(d["downtime_total_s"], "s", 1)),
        ("false alarms", str(len(d["false_alarms"]))),
        (
            "processes left over",
            f"{len(d['leftover_processes'])} (of {d['pids_checked']} pids checked, and a /proc scan)",
        ),
        ("checks", checks),
        ("passed", "**yes**" if d["passed"] else "**no**"),
        ("commit, date", f"{d['commit']}, {d['date']}"),
    ]
    return "\n".join(["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])


def main(args: Any) -> int:
    root = Path(args.dir)
    for name, fn in (
        ("downtime", downtime),
        ("scaling", scaling),
        ("memory", memory),
        ("overhead", overhead),
        ("chaos", chaos),
    ):
        path = root / f"{name}.json"
        print(f"\n### {name}\n")
        print(fn(json.loads(path.read_text())) if path.exists() else f"({path} not measured yet)")
    return 0
