"""``bench tables``: render the figures in ``docs/bench/*.json`` as markdown tables.

Contract: reads whichever of downtime.json, scaling.json, memory.json, overhead.json and
projection.json exist in ``--dir`` and prints markdown (used to write docs/benchmarks.md, so the
page shows exactly the measured numbers). Missing files are skipped with a note.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tmslurm.bench.common import median
from tmslurm.bench.downtime import RS_PARTS, TM_PARTS


def _f(x: Any, unit: str = "s", nd: int = 3) -> str:
    return "–" if not isinstance(x, (int, float)) else f"{x:.{nd}f}{unit}"


def downtime(d: dict[str, Any]) -> str:
    m = d["medians"]
    out = ["| event | tmslurm | in-job restart | requeue restart | in-job / tmslurm | requeue / tmslurm |", "|---|---|---|---|---|---|"]
    for ev in ("planned", "unexpected", "hang"):
        tm, ij, rq = (m.get(s, {}).get(ev) for s in ("tmslurm", "injob_restart", "requeue_restart"))
        r1 = f"{ij / tm:.0f}x" if tm and ij else "–"
        r2 = f"{rq / tm:.0f}x" if tm and rq else "–"
        out.append(f"| {ev} | {_f(tm)} | {_f(ij, nd=2)} | {_f(rq, nd=1)} | {r1} | {r2} |")
    out += ["", "Median parts (seconds):", "", "| strategy | event | n | " + " | ".join(p[:-2] for p in TM_PARTS) + " |",
            "|---|---|---|" + "---|" * len(TM_PARTS)]
    for ev in ("planned", "unexpected", "hang"):
        rows = [r for r in d["rows"] if r["strategy"] == "tmslurm" and r["event"] == ev]
        if rows:
            out.append(f"| tmslurm | {ev} | {len(rows)} | " + " | ".join(_f(median([r['parts'].get(p) for r in rows]), '') for p in TM_PARTS) + " |")
    out += ["", "| strategy | event | n | " + " | ".join(p[:-2] for p in RS_PARTS) + " | lost steps |", "|---|---|---|" + "---|" * (len(RS_PARTS) + 1)]
    for s in ("injob_restart", "requeue_restart"):
        for ev in ("planned", "unexpected"):
            rows = [r for r in d["rows"] if r["strategy"] == s and r["event"] == ev]
            if rows:
                out.append(f"| {s} | {ev} | {len(rows)} | " + " | ".join(_f(median([r['parts'].get(p) for r in rows]), '', 2) for p in RS_PARTS)
                           + f" | {median([r.get('lost_steps') for r in rows])} |")
    out += ["", "Every event, as measured:", "", "| strategy | event | # | downtime | gap (commit to commit) |", "|---|---|---|---|---|"]
    for r in d["rows"]:
        if not r["event"].startswith("_"):
            out.append(f"| {r['strategy']} | {r['event']} | {r['repeat']} | {_f(r['downtime_s'])} | {_f(r.get('gap_s'))} |")
    hashes = {r["strategy"]: r.get("final_params_sha256") for r in d["rows"] if r["event"] == "_run"}
    steps = {r["strategy"]: r.get("summary_median_step_s") for r in d["rows"] if r["event"] == "_run"}
    out += ["", "Median step time per run: " + ", ".join(f"{k} {_f(v)}" for k, v in steps.items()),
            "", "Final hashes of the three runs (they stop at different steps, so they differ): " +
            ", ".join(f"{k} `{(v or '')[:12]}`" for k, v in hashes.items())]
    return "\n".join(out)


def scaling(d: dict[str, Any]) -> str:
    sizes = sorted({r["ranks"] for r in d["rows"]})
    out = ["| ranks | delta phase 2 | full phase 2 | delta downtime | full downtime |", "|---|---|---|---|---|"]
    for n in sizes:
        med = {(m, k): median([r[k] for r in d["rows"] if r["ranks"] == n and r["mode"] == m])
               for m in ("delta", "full") for k in ("phase2_s", "downtime_s")}
        out.append(f"| {n} | {_f(med[('delta', 'phase2_s')], 's', 4)} | {_f(med[('full', 'phase2_s')], 's', 4)} | "
                   f"{_f(med[('delta', 'downtime_s')], 's', 4)} | {_f(med[('full', 'downtime_s')], 's', 4)} |")
    return "\n".join(out)


def memory(d: dict[str, Any]) -> str:
    out = ["| stayer rank | peak RSS before | peak RSS after | change |", "|---|---|---|---|"]
    for r in d["stayers"]:
        out.append(f"| {r['rank']} | {r['peak_before_mb']:.1f} MiB | {r['peak_after_mb']:.1f} MiB | {r['delta_mb']:+.1f} MiB |")
    out += ["", "| standby | role | RSS | growth since start | warm-up |", "|---|---|---|---|---|"]
    for r in d["standby_roles"]:
        out.append(f"| {r['agent'].split('.')[0]} | {r['role']} | {r['rss_mb']:.0f} MiB | +{r['role_rss_mb']:.0f} MiB | {r['warmup_s']:.2f}s |")
    return "\n".join(out)


def overhead(d: dict[str, Any]) -> str:
    return "\n".join(["| configuration | runs (median step, commit to commit) | median |", "|---|---|---|",
                      f"| vote + heartbeats + watcher on | {', '.join(_f(x, 's', 4) for x in d['on_s'])} | {_f(d['median_on_s'], 's', 4)} |",
                      f"| all off | {', '.join(_f(x, 's', 4) for x in d['off_s'])} | {_f(d['median_off_s'], 's', 4)} |",
                      "", f"Slowdown: **{d['slowdown_pct']:+.2f}%** (target ≤ 3%)."])


def main(args: Any) -> int:
    root = Path(args.dir)
    for name, fn in (("downtime", downtime), ("scaling", scaling), ("memory", memory), ("overhead", overhead)):
        path = root / f"{name}.json"
        print(f"\n### {name}\n")
        print(fn(json.loads(path.read_text())) if path.exists() else f"({path} not measured yet)")
    return 0
