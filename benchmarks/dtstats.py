"""The downtime benchmark's figures: one row per event, cells per (strategy, event), ratios, tables.

Contract (pure; no Slurm, no files): a *row* is one measured event (:func:`make_row`): its gap
(commit of the last step before the event to commit of the first step after it), the one
*reference step* shared by every strategy, ``downtime_s = gap_s - ref_step_s``, and the event's
pause parts with ``other_s`` so that ``gap_s = sum(parts)``, hence ``downtime_s = sum(parts) -
ref_step_s``. A requeue's ``fixed_delay_s`` is Slurm's own (``EligibleTime`` - requeue time);
``no_delay_s = downtime_s - fixed_delay_s``. :func:`cells` gives n, every sample, p50 and p90
(nearest rank) per cell; :func:`ratios` compares p50s against tmslurm's. :func:`merge` replaces
the cells a new run re-measured and keeps the others. Missing values stay None, never 0.
"""

from __future__ import annotations

from typing import Any

from benchmarks.common import median
from benchmarks.procstat import percentile
from tmslurm.controller.events import pause_parts

TM_EVENTS = ("planned", "power-off", "partition", "sigkill", "sigstop", "bh-drain", "bh-power-off")
RS_EVENTS = ("planned", "power-off", "sigkill")
UNEXPECTED = ("power-off", "partition", "sigkill", "sigstop")
"""Events whose detection is measured from the injection; a planned event's notice arrives while training goes on."""
STRATEGIES = ("tmslurm", "injob_restart", "requeue_restart")
LABELS = {
    "planned": "planned (admin drain)",
    "power-off": "power-off (silent)",
    "partition": "partition",
    "sigkill": "SIGKILL of a rank",
    "sigstop": "SIGSTOP of a rank (hang)",
    "bh-drain": "batch-host drain",
    "bh-power-off": "batch-host power-off",
}


def make_row(
    strategy: str,
    event: str,
    repeat: int,
    ev: dict[str, Any],
    *,
    ref_step_s: float,
    t_inject: float,
    inject_step: int | None,
    offset: int | None,
    fixed_delay_s: float | None = None,
) -> dict[str, Any]:
    gap = _num(ev.get("gap_s"))
    parts: dict[str, float] = {p: ev[p] for p in pause_parts(ev) if _num(ev.get(p)) is not None}
    noticed = _num(ev.get("notice_t"))
    if noticed is not None and event in UNEXPECTED:  # the run's detection (its notice is the fault where it knew it)
        noticed += _num(ev.get("detect_s")) or 0.0
    notice = None if noticed is None else max(0.0, noticed - t_inject)
    if notice is not None and event in UNEXPECTED:
        parts["detect_s"] = notice  # from the injection: the run itself cannot know when the fault came
        parts = _from_injection(parts, ev, t_inject)
    if gap is not None:
        parts["other_s"] = gap - sum(v for k, v in parts.items() if k != "other_s")
    down = None if gap is None else gap - ref_step_s
    return {
        "strategy": strategy,
        "event": event,
        "repeat": repeat,
        "kind": ev.get("kind"),
        "ranks": ev.get("ranks"),
        "node": ev.get("node"),
        "notice_s": notice,
        "inject_step": inject_step,
        "interval_offset": offset,
        "gap_s": gap,
        "ref_step_s": ref_step_s,
        "downtime_s": down,
        "run_downtime_s": ev.get("downtime_s"),
        "parts": parts,
        "lost_steps": ev.get("lost_steps"),
        "fixed_delay_s": fixed_delay_s,
        "no_delay_s": None if down is None or fixed_delay_s is None else down - fixed_delay_s,
    }


def _from_injection(parts: dict[str, Any], ev: dict[str, Any], t_inject: float) -> dict[str, Any]:
    """A switch's step in flight before the fault, counted to the injection: its last commit -> the
    fault (the run's own figure would count to its detection, having no instant of the fault)."""
    last = _num(ev.get("last_commit_t"))
    rest = {k: v for k, v in parts.items() if k != "before_fault_s"}
    if "before_fault_s" not in pause_parts(ev) or last is None:
        return rest
    return {"before_fault_s": max(0.0, t_inject - last), **rest}


def describe(row: dict[str, Any]) -> str:
    parts = " + ".join(f"{k[:-2]} {v:.3f}" for k, v in row["parts"].items())
    tail = f"; without Slurm's fixed delay {row['no_delay_s']:.3f}s" if row.get("no_delay_s") is not None else ""
    return (
        f"{row['strategy']} {row['event']} #{row['repeat']}: downtime {_fmt(row['downtime_s'])} = gap "
        f"{_fmt(row['gap_s'])} ({parts}) - reference step {row['ref_step_s']:.3f}{tail}"
    )


def pct(xs: list[float], q: float) -> float | None:
    """Nearest-rank percentile of ``xs`` (None for no sample)."""
    return percentile(xs, q) if xs else None


def cells(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per strategy and event: n, every sample, p50/p90 of the downtime, of detection and (requeues)
    without Slurm's fixed delay."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        if r.get("downtime_s") is None:
            continue
        c = out.setdefault(r["strategy"], {}).setdefault(r["event"], {"samples": [], "detect": [], "no_delay": []})
        c["samples"].append(r["downtime_s"])
        if r["parts"].get("detect_s") is not None:
            c["detect"].append(r["parts"]["detect_s"])
        if r.get("no_delay_s") is not None:
            c["no_delay"].append(r["no_delay_s"])
    for by_event in out.values():
        for c in by_event.values():
            xs, ds, nd = sorted(c["samples"]), sorted(c["detect"]), sorted(c["no_delay"])
            c.update(
                n=len(xs),
                p50=pct(xs, 50),
                p90=pct(xs, 90),
                detect_p50=pct(ds, 50),
                detect_p90=pct(ds, 90),
                no_delay_p50=pct(nd, 50),
                no_delay_p90=pct(nd, 90),
            )
    return out


def ratios(cs: dict[str, dict[str, dict[str, Any]]]) -> dict[str, float | None]:
    """p50 of a baseline / p50 of tmslurm: planned = drain, unexpected = power-off (same detection)."""

    def p50(strategy: str, event: str, key: str = "p50") -> float | None:
        return cs.get(strategy, {}).get(event, {}).get(key)

    def div(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    out: dict[str, float | None] = {}
    for name, event in (("planned", "planned"), ("unexpected", "power-off"), ("sigkill", "sigkill")):
        tm = p50("tmslurm", event)
        out[f"ratio_{name}"] = div(p50("injob_restart", event), tm)
        out[f"ratio_{name}_requeue"] = div(p50("requeue_restart", event), tm)
        out[f"ratio_{name}_requeue_no_delay"] = div(p50("requeue_restart", event, "no_delay_p50"), tm)
    return out


def merge(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of ``old`` whose (strategy, event) cell ``new`` did not measure, then ``new``."""
    fresh = {(r["strategy"], r["event"]) for r in new}
    return [r for r in old if (r["strategy"], r["event"]) not in fresh] + new


def table(result: dict[str, Any]) -> str:
    """Markdown: p50/p90 per cell side by side, the ratios, median parts, then every event."""
    cs, rs = result["cells"], result["ratios"]
    out = [
        "| event | tmslurm p50 / p90 | in-job restart p50 / p90 | requeue restart p50 / p90 "
        "| requeue without fixed delay p50 | in-job / tmslurm | requeue / tmslurm |",
        "|---|---|---|---|---|---|---|",
    ]
    for ev in TM_EVENTS:
        c = [cs.get(s, {}).get(ev) for s in STRATEGIES]
        if not any(c):
            continue
        tm = c[0]["p50"] if c[0] else None
        out.append(
            f"| {LABELS[ev]} | {_cell(c[0])} | {_cell(c[1])} | {_cell(c[2])} | "
            f"{_fmt(c[2]['no_delay_p50']) if c[2] else '–'} | {_ratio(c[1], tm)} | {_ratio(c[2], tm)} |"
        )
    out += [
        "",
        "Ratios of p50s: " + ", ".join(f"{k} {v:.1f}x" for k, v in rs.items() if v is not None),
        "",
        "Median parts (seconds; gap = sum of parts, downtime = gap - reference step):",
        "",
    ]
    out += _parts_table(result["rows"])
    out += [
        "",
        "Every event (downtime = gap - reference step):",
        "",
        "| strategy | event | # | step at injection (offset in interval) | downtime | gap | parts |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        parts = ", ".join(f"{k[:-2]} {v:.3f}" for k, v in r["parts"].items())
        out.append(
            f"| {r['strategy']} | {r['event']} | {r['repeat']} | {r['inject_step']} ({r['interval_offset']}) | "
            f"{_fmt(r['downtime_s'])} | {_fmt(r['gap_s'])} | {parts} |"
        )
    return "\n".join(out)


ORDER = (
    "before_fault_s",
    "detect_s",
    "pick_s",
    "phase1_s",
    "phase2_s",
    "apply_s",
    "transfer_s",
    "verify_wait_s",
    "stop_s",
    "reschedule_s",
    "startup_s",
    "redo_s",
    "first_step_s",
    "other_s",
)


def _parts_table(rows: list[dict[str, Any]]) -> list[str]:
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r["parts"] if k not in keys]
    keys.sort(key=lambda k: ORDER.index(k) if k in ORDER else len(ORDER))
    out = ["| strategy | event | n | " + " | ".join(k[:-2] for k in keys) + " |", "|---|---|---|" + "---|" * len(keys)]
    for s in STRATEGIES:
        for ev in TM_EVENTS:
            sel = [r for r in rows if r["strategy"] == s and r["event"] == ev]
            if sel:
                meds = [median([r["parts"].get(k) for r in sel]) for k in keys]
                out.append(
                    f"| {s} | {ev} | {len(sel)} | " + " | ".join("–" if m is None else f"{m:.3f}" for m in meds) + " |"
                )
    return out


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _fmt(x: float | None) -> str:
    return "–" if x is None else (f"{x:.3f}s" if x < 10 else f"{x:.1f}s")


def _cell(x: dict[str, Any] | None) -> str:
    """One table cell: p50 / p90 and the count of a strategy's cell, or a dash where it has none."""
    return "–" if x is None else f"{_fmt(x['p50'])} / {_fmt(x['p90'])} (n={x['n']})"


def _ratio(x: dict[str, Any] | None, tm: float | None) -> str:
    """A strategy's p50 over tmslurm's p50 ``tm``, or a dash where either is missing."""
    return "–" if x is None or not tm else f"{x['p50'] / tm:.0f}x"
