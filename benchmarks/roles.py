"""``bench roles``: downtime of a planned join per role and TP position, and a standby's cost per shape class.

Contract: ``--repeats`` local runs of DP1 x PP3 x TP2 (six ranks: first, middle and last stage, each
at TP positions 0 and 1; ``--model`` preset with ``model.n_layer=4``, ``--compile`` optional), each
draining every rank once, in turn, with one standby per rank, all warm before step 0 commits (a
replenished standby would still be starting when the next drain comes). Downtime per role and TP
position comes from the run's events (``downtime_s``, ``joiner_warm``); warm-up time and RSS growth
per shape class from the journal's ``standby_ready`` entries. Prints sample count, median, min and
max of each, and writes ``docs/bench/roles.json``. A run that fails raises TmslurmError with the
tail of its log (from :func:`~benchmarks.common.run_local`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from benchmarks.common import run_local, say, write_json
from tmslurm.core.topology import Layout

log = logging.getLogger(__name__)

DP, PP, TP, N_LAYER = 1, 3, 2, 4
EVERY = 4


def _spread(xs: list[float]) -> dict[str, Any]:
    xs = sorted(x for x in xs if isinstance(x, (int, float)))
    if not xs:
        return {"n": 0, "median": None, "min": None, "max": None}
    mid = len(xs) // 2
    med = xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2
    return {"n": len(xs), "median": med, "min": xs[0], "max": xs[-1]}


def main(args: Any) -> dict[str, Any]:
    out = Path(args.out).resolve()
    layout = Layout(DP, PP, TP, n_layer=N_LAYER)
    ranks = list(range(layout.world))
    steps = EVERY * (len(ranks) + 1)
    faults = ",".join(f"{{step:{EVERY * (i + 1)},kind:drain,rank:{r}}}" for i, r in enumerate(ranks))
    downtimes: dict[str, list[float]] = {}
    warm: dict[str, list[bool]] = {}
    classes: dict[str, dict[str, list[float]]] = {}
    for rep in range(args.repeats):
        name = f"roles-{rep}"
        s = run_local(
            out / name,
            [
                f"parallel.dp={DP}",
                f"parallel.pp={PP}",
                f"parallel.tp={TP}",
                f"model={args.model}",
                f"model.n_layer={N_LAYER}",
                f"model.compile={str(args.compile).lower()}",
                f"standby.count={layout.world}",
                "standby.start_when_warm=true",
                f"train.steps={steps}",
                "bench.step_delay_s=0.05",
                f"faults=[{faults}]",
            ],
        )
        for ev in s["events"]:
            (rank,) = ev["ranks"]
            c = layout.coord(rank)
            label = f"{layout.role(rank)} (stage {c.stage}) tp{c.tp}"
            downtimes.setdefault(label, []).append(ev.get("downtime_s"))
            warm.setdefault(label, []).append(bool(ev.get("joiner_warm")))
        for line in (out / name / "events.jsonl").read_text().splitlines():
            e = json.loads(line)
            if e["type"] == "standby_ready" and e.get("warm", True):
                row = classes.setdefault(e["role"], {"warmup_s": [], "role_rss_mb": []})
                row["warmup_s"].append(e["warmup_s"])
                row["role_rss_mb"].append(e["role_rss_mb"])
        say(f"run {rep}: {len(s['events'])} planned joins, final_params_sha256 {s['final_params_sha256']}")
    roles = [
        {"role": k, **_spread(v), "all_warm": all(warm[k])} for k, v in sorted(downtimes.items(), key=lambda kv: kv[0])
    ]
    per_class: list[dict[str, Any]] = [
        {"class": k, "warmup_s": _spread(v["warmup_s"]), "role_rss_mb": _spread(v["role_rss_mb"])}
        for k, v in classes.items()
    ]
    for r in roles:
        say(
            f"{r['role']:<22} n={r['n']} downtime median {r['median']:.3f}s (min {r['min']:.3f}, max {r['max']:.3f}) "
            f"warm={r['all_warm']}"
        )
    for cls in per_class:
        w, m = cls["warmup_s"], cls["role_rss_mb"]
        say(
            f"class {cls['class']:<8} n={w['n']} warm-up median {w['median']:.2f}s "
            f"(min {w['min']:.2f}, max {w['max']:.2f}); "
            f"RSS growth median {m['median']:.1f} MiB (min {m['min']:.1f}, max {m['max']:.1f})"
        )
    result = {
        "setup": {
            "layout": f"DP{DP} x PP{PP} x TP{TP}",
            "model": args.model,
            "n_layer": N_LAYER,
            "compile": args.compile,
            "repeats": args.repeats,
        },
        "roles": roles,
        "classes": per_class,
    }
    write_json(Path(args.json), result)
    return result
