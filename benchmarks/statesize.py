"""``python -m benchmarks statesize``: what a move costs as the state per rank grows from MBs to GBs.

Contract: for each ``--models`` preset (small ~8 MB, medium ~60 MB, base ~0.5 GB, large ~1.4 GB of
parameters + AdamW moments per rank at DP2 x PP2), local processes (``cluster=local``), eager:

- ``link`` and ``transfer``: :mod:`benchmarks.linkbw` on one loopback gloo pair (``--link-repeats``);
- ``shadow`` and ``noshadow``: one run each with one standby that is replaced after each use
  (``standby.replenish``); ``--repeats`` times: wait until a fresh standby is warm for every role,
  send a maintenance notice for rank 1, wait for the switch (``shadow.enabled`` true / false);
- ``unexpected``: ``--repeats`` runs, each with a SIGKILL of rank 1 (midstep) once the standby is warm;
  the DP peer that sends the state is the *source*, whose peak RSS is read before and after; the
  ranks that send no state redo the step after the transfer (``runtime.redo_overlap=false``, the default);
- ``unexpected_overlap``: the same with ``runtime.redo_overlap=true`` (they redo it beside the transfer);
- ``injob_restart``: one run with ``--repeats`` drains 6 steps apart, ``bench.restart_mode=injob_restart``
  (each restart reloads a checkpoint of that size) and ``runtime.fork_agents=false`` (each restarted
  rank is a fresh process that imports torch, as on a cluster).

Per event it reads ``pause_s`` (gap - the first step's own time) and ``downtime_s`` (gap - median
step) from summary.json; for a SIGKILL also ``before_fault_s`` (the last commit -> the kill: the
step's work before it, redone) and ``pause_from_fault_s`` (the pause without it); per row p50s, the samples, the
standby's and the largest rank's RSS, and the floor (state bytes / measured link bandwidth). Writes ``--json``
(docs/bench/statesize.json) after each size (marked ``partial`` until the last) and, with matplotlib, a plot next to it.
After each cell (the link counts as one) a progress line (:func:`benchmarks.common.progress`: cells done / total,
events, elapsed, remaining) goes to stdout with the benchmark's log; larger sizes take longer, so the estimate is low
early on. ``--cells`` measures a subset of :data:`CELLS` (the others' figures are null). A run that fails raises
TmslurmError naming its log.
"""

from __future__ import annotations

import argparse
import datetime
import math
import statistics
from pathlib import Path
from typing import Any

from benchmarks import linkbw
from benchmarks.common import LocalJob, commit, progress, recorded_command, run_local, say, write_json
from tmslurm.core.errors import TmslurmError

BASE = [
    "parallel.dp=2",
    "parallel.pp=2",
    "train.micro_batches=2",
    "train.micro_batch_size=1",
    "runtime.connect_timeout_s=600",
    "runtime.collective_timeout_s=600",
    "runtime.switch_timeout_s=600",
]


def _p50(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if isinstance(x, (int, float))]
    return round(statistics.median(vals), 4) if vals else None


def _events(summary: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in summary["events"] if e.get("kind") == kind and e.get("status") == "done"]


def drains(out: Path, model: str, shadow: bool, repeats: int) -> dict[str, Any]:
    """One run, ``repeats`` planned moves of rank 1, each to a standby warm for every role."""
    name = f"{model}-{'shadow' if shadow else 'noshadow'}"
    job = LocalJob(
        out / name,
        [
            *BASE,
            f"model={model}",
            "standby.count=1",
            "standby.replenish=true",
            "standby.start_when_warm=true",
            "train.steps=1000000",
            f"shadow.enabled={str(shadow).lower()}",
        ],
    )
    try:
        for i in range(repeats):

            def warm(e: dict[str, Any], i: int = i) -> bool:
                return e["type"] == "standby_ready" and e["role"] == "last" and e["agent"] == nth_standby(job, i)

            job.wait_journal(warm, 1800, f"standby #{i} warm")
            job.request({"type": "notice", "event": "maintenance", "rank": 1, "reason": f"bench statesize {i}"})

            def moved(e: dict[str, Any], i: int = i) -> bool:
                return is_planned(e) and sum(map(is_planned, job.journal())) > i

            job.wait_journal(moved, 1800, f"move #{i}")
            say(f"{name}: move {i + 1}/{repeats} done")
        summary = job.finish(1800)
    except BaseException:
        job.proc.kill()
        raise
    events = _events(summary, "planned")
    if len(events) != repeats:
        raise TmslurmError(f"{name}: {len(events)} planned events, expected {repeats}; see {job.run_dir}")
    return {"summary": summary, "events": events}


def nth_standby(job: LocalJob, i: int) -> str | None:
    """The agent id of the i-th standby that connected (standbys are used in that order)."""
    seen: list[str] = []
    for e in job.journal():
        if e["type"] == "standby_ready" and e["agent"] not in seen:
            seen.append(e["agent"])
    return seen[i] if i < len(seen) else None


def is_planned(e: dict[str, Any]) -> bool:
    """A finished planned move (a start-up restart is an event too, and must not count as one)."""
    return e["type"] == "event" and e.get("kind") == "planned"


def kills(out: Path, model: str, repeats: int, overlap: bool = False) -> dict[str, Any]:
    """``repeats`` runs, each with one SIGKILL of rank 1 after the standby is warm."""
    events, summaries = [], []
    for i in range(repeats):
        s = run_local(
            out / f"{model}-kill{'-overlap' if overlap else ''}-{i}",
            [
                *BASE,
                f"model={model}",
                "standby.count=1",
                "standby.start_when_warm=true",
                "train.steps=10",
                f"runtime.redo_overlap={str(overlap).lower()}",
                "faults=[{step:5,kind:kill,rank:1}]",
            ],
            timeout=3600,
        )
        (ev,) = _events(s, "unexpected")
        ev["source_rss"] = source_rss(s, ev)
        events.append(ev)
        summaries.append(s)
        say(f"{model}: kill{' (overlap)' if overlap else ''} {i + 1}/{repeats}: pause {ev.get('pause_s')}")
    return {"summary": summaries[-1], "events": events}


def source_rss(summary: dict[str, Any], ev: dict[str, Any]) -> dict[str, float | None]:
    """The state source's peak RSS (MiB) logged before the event and after it."""
    (src,) = ev.get("sources") or [None]
    if src is None:
        return {"before_mb": None, "after_mb": None}
    key = str(src)
    t = ev.get("last_commit_t", 0.0)
    before = [e["peak_rss_mb"][key] for e in summary["step_log"] if e["t_end"] <= t and key in e["peak_rss_mb"]]
    after = [e["peak_rss_mb"][key] for e in summary["step_log"] if e["t_end"] > t and key in e["peak_rss_mb"]]
    return {"before_mb": max(before, default=None), "after_mb": max(after + before, default=None)}


def restarts(out: Path, model: str, repeats: int) -> dict[str, Any]:
    faults = ",".join(f"{{step:{4 + 6 * i},kind:drain,rank:1}}" for i in range(repeats))
    # fresh processes, as a restart on a cluster has (a forked agent would skip importing torch)
    s = run_local(
        out / f"{model}-injob",
        [
            *BASE,
            f"model={model}",
            "standby.count=0",
            "bench.restart_mode=injob_restart",
            "runtime.fork_agents=false",
            f"train.steps={6 * repeats + 4}",
            f"faults=[{faults}]",
        ],
        timeout=7200,
    )
    events = _events(s, "injob_restart")
    say(f"{model}: {len(events)} in-job restarts")
    return {"summary": s, "events": events}


CELLS = ("shadow", "noshadow", "unexpected", "unexpected_overlap", "injob_restart")
"""The cells measured per size after the link, in this order."""
SAMPLE_FIELDS = (
    "pause_s",
    "downtime_s",
    "transfer_s",
    "verify_s",
    "first_step_s",
    "gap_s",
    "verify_wait_s",
    "before_fault_s",
    "detect_s",
    "pick_s",
    "phase1_s",
    "phase2_s",
    "other_s",
    "pause_from_fault_s",
)
"""Listed per event: the first six always (null where the event has none), the rest where it has them."""


def cell(out: Path, model: str, name: str, repeats: int) -> dict[str, Any]:
    """One cell of ``CELLS`` for ``model``: its last summary and its events."""
    if name in ("shadow", "noshadow"):
        return drains(out, model, name == "shadow", repeats)
    if name in ("unexpected", "unexpected_overlap"):
        return kills(out, model, repeats, overlap=name == "unexpected_overlap")
    return restarts(out, model, repeats)


def row(model: str, link: dict[str, Any], cells: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One size's figures from the cells measured (``--cells``); a cell not measured has no events."""
    shadow, plain, kill, overlap, restart = (cells.get(k, {"events": []})["events"] for k in CELLS)
    first = next(cells[k]["summary"] for k in CELLS if k in cells)
    nbytes = max(first["state_bytes"].values())
    memory = (cells.get("shadow") or cells.get("noshadow") or cells.get("unexpected") or {"summary": {}})[
        "summary"
    ].get("memory") or {}
    src = [e["source_rss"] for e in kill]
    r = {
        "model": model,
        "state_mb_per_rank": round(nbytes / 1e6, 1),
        **{k: link[k] for k in ("link_gbps", "transfer_gbps")},
        "floor_s": round(nbytes / 1e9 / link["link_gbps"], 4),
        "planned_shadow_pause_p50_s": _p50([e.get("pause_s") for e in shadow]),
        "planned_pause_p50_s": _p50([e.get("pause_s") for e in plain]),
        "unexpected_pause_p50_s": _p50([e.get("pause_s") for e in kill]),
        "planned_shadow_downtime_p50_s": _p50([e.get("downtime_s") for e in shadow]),
        "planned_downtime_p50_s": _p50([e.get("downtime_s") for e in plain]),
        "unexpected_downtime_p50_s": _p50([e.get("downtime_s") for e in kill]),
        "injob_restart_planned_downtime_p50_s": _p50([e.get("downtime_s") for e in restart]),
        "injob_restart_planned_pause_p50_s": _p50([e.get("pause_s") for e in restart]),
        "unexpected_detect_p50_s": _p50([e.get("detect_s") for e in kill]),
        # the SIGKILL lands between rank 1's forward and backward: the step's work before it is redone
        "unexpected_before_fault_p50_s": _p50([e.get("before_fault_s") for e in kill]),
        "unexpected_pause_from_fault_p50_s": _p50([e.get("pause_from_fault_s") for e in kill]),
        "unexpected_transfer_p50_s": _p50([e.get("transfer_s") for e in kill]),
        # for a failure, pick_s is the wait for every survivor's 'aborted' before the standby is picked
        "unexpected_pick_p50_s": _p50([e.get("pick_s") for e in kill]),
        # issue 23's bound on the pause from the fault: detection + 1.5 x floor + 0.1 s
        "unexpected_bound_s": _bound(kill, nbytes / 1e9 / link["link_gbps"]),
        # the same SIGKILL with runtime.redo_overlap=true: the held ranks redo the step beside the transfer
        # the pause counts the held ranks' redone forwards when they run beside the transfer (overlap), not when
        # they run after it: the gap and the downtime (gap - median step) compare the two settings fairly
        "unexpected_overlap_pause_p50_s": _p50([e.get("pause_s") for e in overlap]),
        "unexpected_gap_p50_s": _p50([e.get("gap_s") for e in kill]),
        "unexpected_overlap_gap_p50_s": _p50([e.get("gap_s") for e in overlap]),
        "unexpected_overlap_downtime_p50_s": _p50([e.get("downtime_s") for e in overlap]),
        # downtime without the step in flight before the fault: what the user loses, whatever the setting
        "unexpected_downtime_from_fault_p50_s": _from_fault_p50(kill),
        "unexpected_overlap_downtime_from_fault_p50_s": _from_fault_p50(overlap),
        "unexpected_overlap_pause_from_fault_p50_s": _p50([e.get("pause_from_fault_s") for e in overlap]),
        "unexpected_overlap_transfer_p50_s": _p50([e.get("transfer_s") for e in overlap]),
        "shadow_catchup_p50_s": _p50([e.get("shadow_catchup_s") for e in shadow]),
        "shadow_follow_s_per_step_p50": _p50([e.get("shadow_follow_s_per_step") for e in shadow]),
        "all_shadowed": all(e.get("shadowed") and e.get("shadow_matched") for e in shadow) if shadow else None,
        "standby_rss_mb": memory.get("standby_rss_mb"),
        "standby_peak_rss_mb": memory.get("standby_peak_rss_mb"),
        "rank_rss_mb": memory.get("largest_rank_peak_rss_mb"),
        "source_peak_rss_before_mb": _p50([s["before_mb"] for s in src]),
        "source_peak_rss_during_mb": _p50([s["after_mb"] for s in src]),
        "n": {k: len(c["events"]) for k, c in cells.items()},
        "samples": {
            k: [
                {f: e.get(f) for f in SAMPLE_FIELDS[:6] + tuple(f for f in SAMPLE_FIELDS[6:] if f in e)}
                for e in c["events"]
            ]
            for k, c in cells.items()
        },
    }
    return r


def _from_fault_p50(kill: list[dict[str, Any]]) -> float | None:
    """p50 of downtime - before_fault per event (both known), or None."""
    return _p50(
        [
            e["downtime_s"] - e["before_fault_s"]
            for e in kill
            if e.get("downtime_s") is not None and e.get("before_fault_s") is not None
        ]
        or [None]
    )


def _bound(kill: list[dict[str, Any]], floor_s: float) -> float | None:
    """Detection p50 + 1.5 x the floor + 0.1 s, or None without SIGKILL events."""
    detect = _p50([e.get("detect_s") for e in kill])
    return None if detect is None else round(detect + 1.5 * floor_s + 0.1, 4)


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'model':<7}{'MB/rank':>8}{'link':>7}{'xfer':>7}{'floor':>7}{'shadow':>8}{'planned':>8}{'unexp':>7}"
        f"{'fromflt':>8}{'overlap':>8}{'restart':>8}{'sby RSS':>8}{'rank RSS':>9}"
    )
    lines = [
        head,
        f"{'':<7}{'':>8}{'GB/s':>7}{'GB/s':>7}{'s':>7}{'pause s':>8}{'pause s':>8}{'pause':>7}{'pause s':>8}"
        f"{'fromflt':>8}{'down s':>8}{'MiB':>8}{'MiB':>9}",
    ]
    for r in rows:
        f = lambda v, w, p=3: f"{v:>{w}.{p}f}" if isinstance(v, (int, float)) else f"{'-':>{w}}"  # noqa: E731
        lines.append(
            f"{r['model']:<7}{r['state_mb_per_rank']:>8.1f}{f(r['link_gbps'], 7, 2)}{f(r['transfer_gbps'], 7, 2)}"
            f"{f(r['floor_s'], 7)}{f(r['planned_shadow_pause_p50_s'], 8)}{f(r['planned_pause_p50_s'], 8)}"
            f"{f(r['unexpected_pause_p50_s'], 7)}{f(r.get('unexpected_pause_from_fault_p50_s'), 8)}"
            f"{f(r.get('unexpected_overlap_pause_from_fault_p50_s'), 8)}"
            f"{f(r['injob_restart_planned_downtime_p50_s'], 8, 2)}"
            f"{f(r['standby_rss_mb'], 8, 0)}{f(r['rank_rss_mb'], 9, 0)}"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        say("matplotlib is not installed: no plot")
        return
    x = [r["state_mb_per_rank"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, label in (
        ("planned_shadow_pause_p50_s", "planned, live shadow (pause)"),
        ("planned_pause_p50_s", "planned, state in the pause"),
        ("unexpected_pause_p50_s", "SIGKILL (pause)"),
        ("unexpected_pause_from_fault_p50_s", "SIGKILL (pause from the fault)"),
        ("injob_restart_planned_downtime_p50_s", "in-job restart, planned (downtime)"),
    ):
        ax.plot(x, [math.nan if r.get(key) is None else r[key] for r in rows], marker="o", label=label)  # a gap
    ax.plot(x, [r["floor_s"] for r in rows], linestyle="--", color="grey", label="floor: state bytes / link bandwidth")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("state per rank (MB: parameters + AdamW moments)")
    ax.set_ylabel("seconds (p50)")
    ax.set_title("What a move costs as the state grows (DP2 x PP2, CPU, loopback)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    say(f"wrote {path}")


def main(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out).resolve()
    rows = []
    models = args.models.split(",")
    names = [c for c in args.cells.split(",") if c]
    unknown = [c for c in names if c not in CELLS]
    if unknown or not names:
        raise TmslurmError(f"--cells {args.cells!r}: unknown {unknown or 'empty'}; choose from {','.join(CELLS)}")
    prog = progress("statesize", len(models) * (1 + len(names)), "cells")
    prog.count("events", 0)
    for model in models:
        say(f"== {model}: link, then {args.repeats} events per cell")
        link = linkbw.row(model, linkbw.measure(model, args.link_repeats))
        prog.advance(note=f"{model} link")
        cells = {}
        for name in (c for c in CELLS if c in names):
            cells[name] = cell(out, model, name, args.repeats)
            prog.count("events", len(cells[name]["events"]))
            prog.advance(note=f"{model} {name}")
        rows.append(row(model, link, cells))
        print(table(rows), flush=True)
        write_json(Path(args.json), _result(rows, done=False))  # a later size that fails keeps these rows
    result = _result(rows, done=True)
    write_json(Path(args.json), result)
    plot(rows, Path(args.json).with_suffix(".png"))
    return result


def _result(rows: list[dict[str, Any]], done: bool) -> dict[str, Any]:
    largest = rows[-1]
    ratio = (
        largest["injob_restart_planned_downtime_p50_s"] / largest["planned_shadow_pause_p50_s"]
        if largest["planned_shadow_pause_p50_s"] and largest["injob_restart_planned_downtime_p50_s"]
        else None
    )
    result = {
        "command": recorded_command("statesize"),
        "commit": commit(),
        "date": datetime.date.today().isoformat(),
        "setup": {
            "layout": "DP2 x PP2, one rank per local node, eager, 2 micro-batches of 1 sequence",
            "host": "local processes on one 2-core machine, loopback",
        },
        "rows": rows,
        "ratio_planned_largest": round(ratio, 1) if ratio else None,
        "ratio_note": "in-job restart planned downtime p50 / tmslurm planned pause p50 "
        "with a live shadow, largest size",
    }
    if not done:
        result["partial"] = "written after each size; the run has not finished every --models size"
    return result
