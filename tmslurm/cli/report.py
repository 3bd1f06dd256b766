"""Turn a finished run (and optional benchmark results) into ``report.md`` plus PNG plots.

Contract: :func:`write_report` reads ``<run_dir>/summary.json`` (written by the training
runtime) and, when given, a ``downtime.json`` and a ``scaling.json`` from the benchmarks; it
writes into ``out_dir`` (default ``<run_dir>/report/``):

- ``throughput.png``: step time against wall time, each interruption a labelled band;
- ``downtime_parts.png``: the parts of each event's downtime as stacked bars;
- ``downtime_compare.png`` and ``bench_parts.png`` (with a downtime.json): median downtime per
  event kind for tmslurm vs in-job restart vs requeue restart (log scale, ratios annotated), and
  the median parts of each (strategy, event);
- ``scaling.png`` (with a scaling.json): phase-2 time and total downtime vs ranks, delta switch
  vs full rebuild;
- ``report.md`` linking them, with the numbers as tables.

The summary is read as a :class:`~tmslurm.core.results.Summary`; a missing or null part of an
event is plotted as 0 and listed under "Notes".
Failure behaviour: a missing, unreadable or malformed summary.json (or a benchmark file that was
passed but cannot be read) raises :class:`~tmslurm.core.errors.TmslurmError` naming the file. Plots
need matplotlib (the ``report`` extra), imported lazily and drawn with the Agg canvas only.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tmslurm.controller.events import pause_parts
from tmslurm.core.errors import TmslurmError
from tmslurm.core.jsonfile import read_json_object
from tmslurm.core.results import PAUSE_PARTS, Event, Summary, load_summary
from tmslurm.core.rundir import RunDir

log = logging.getLogger(__name__)

EVENT_PARTS = PAUSE_PARTS
RESTART_PARTS = ("stop_s", "reschedule_s", "startup_s", "group_setup_s", "ckpt_load_s", "warmup_s", "redo_s")
STRATEGIES = ("tmslurm", "injob_restart", "requeue_restart")
EVENT_KINDS = (
    "planned",
    "power-off",
    "partition",
    "sigkill",
    "sigstop",
    "bh-drain",
    "bh-power-off",
    "unexpected",
    "hang",
)
PART_LABELS = {
    "before_fault_s": "step in flight before the fault",
    "detect_s": "detect",
    "pick_s": "standby pick",
    "phase1_s": "phase 1 (overlaps training if planned)",
    "phase2_s": "phase 2",
    "transfer_s": "state transfer",
    "verify_wait_s": "wait for the shadow's check",
    "first_step_s": "first step",
    "stop_s": "stop",
    "reschedule_s": "reschedule",
    "startup_s": "start-up",
    "group_setup_s": "group setup",
    "ckpt_load_s": "checkpoint load",
    "warmup_s": "warm-up",
    "redo_s": "redo lost steps",
    "other_s": "other (not explained by the parts)",
    "before_death_s": "before the controller died",
    "restart_s": "controller restart",
    "adopt_s": "adoption",
}
FIGSIZE = (8.0, 4.5)
DPI = 120


# ---------------------------------------------------------------- inputs


def _num(value: Any) -> float | None:
    """``value`` as a finite float, or None when it is missing, null, boolean or not numeric."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _list_of_dicts(data: dict, key: str, path: Path, what: str) -> list[dict]:
    value = data.get(key, [])
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(x, dict) for x in value):
        raise TmslurmError(f"{what} {path}: '{key}' must be a list of objects")
    return value


def load_bench(path: Path | str | None, what: str) -> dict | None:
    """Read a benchmark JSON with a ``rows`` list, or None when no path was passed."""
    if path is None:
        return None
    path = Path(path)
    data = read_json_object(path, what)
    data["rows"] = _list_of_dicts(data, "rows", path, what)
    return data


# ---------------------------------------------------------------- small helpers


def _median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _ordered(found: Iterable[str], preferred: Iterable[str]) -> list[str]:
    found = list(dict.fromkeys(found))
    first = [x for x in preferred if x in found]
    return first + sorted(x for x in found if x not in first)


def _fmt(value: float | None, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:.3g}{unit}"


def _event_label(i: int, ev: Event) -> str:
    ranks = _ranks(ev)
    return f"#{i} {ev.kind}" + (f" r{ranks}" if ranks else "")


def _new_figure(title: str):
    """A fresh Agg-backed figure and axes (no pyplot global state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _save(fig, out_dir: Path, name: str) -> str:
    fig.tight_layout()
    fig.savefig(out_dir / name, dpi=DPI)
    log.debug("wrote %s", out_dir / name)
    return name


def _plain_ticks(ax, *axes: str) -> None:
    """Tick labels like 0.2, 4, 150 instead of 2x10^-1 on log axes."""
    from matplotlib.ticker import FuncFormatter

    fmt = FuncFormatter(lambda v, _pos: f"{v:g}")
    for name in axes:
        getattr(ax, f"{name}axis").set_major_formatter(fmt)


def _legend_outside(ax) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, borderaxespad=0.0)


def _colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


# ---------------------------------------------------------------- run plots


def _event_downtime(ev: Event) -> float | None:
    """The event's measured downtime, else the sum of its pause parts (phase 1 excluded)."""
    measured = ev.part("downtime_s")
    if measured is not None:
        return measured
    parts = [ev.part(p) for p in EVENT_PARTS if p != "phase1_s"]
    return sum(p for p in parts if p is not None) if any(p is not None for p in parts) else None


def plot_throughput(summary: Summary, out_dir: Path, notes: list[str]) -> str | None:
    """Step time vs wall time with each interruption as a labelled band; None without steps."""
    steps = [(t, dt) for s in summary.step_log if (t := _num(s.t_end)) is not None and (dt := _num(s.dt)) is not None]
    if len(steps) < len(summary.step_log):
        notes.append(f"{len(summary.step_log) - len(steps)} step_log entries with a non-finite t_end/dt were skipped.")
    if not steps:
        notes.append("No usable step_log: throughput plot skipped.")
        return None
    t0 = min(t - dt for t, dt in steps)
    fig, ax = _new_figure(f"Step time over the run ({summary.run_id})")
    ax.hlines(
        [dt for _, dt in steps],
        [t - dt - t0 for t, dt in steps],
        [t - t0 for t, _ in steps],
        color="tab:blue",
        lw=1.5,
        label="step (start → end)",
    )
    ax.plot([t - t0 for t, _ in steps], [dt for _, dt in steps], ".", ms=3, color="tab:blue")
    dts = [dt for _, dt in steps if dt > 0]
    if dts and max(dts) / min(dts) > 20:
        ax.set_yscale("log")
        _plain_ticks(ax, "y")
    _mark_events(ax, summary.events, t0, notes)
    ax.set_xlabel("wall time since the first step started (s)")
    ax.set_ylabel("step time (s)")
    _legend_outside(ax)
    return _save(fig, out_dir, "throughput.png")


def _mark_events(ax, events: list[Event], t0: float, notes: list[str]) -> None:
    kinds = _ordered((e.kind for e in events), ())
    color = dict(zip(kinds, _colors(len(kinds))))
    labelled: set[str] = set()
    for i, ev in enumerate(events, 1):
        start = ev.part("notice_t")
        if start is None:
            notes.append(f"Event {_event_label(i, ev)} has no notice_t: not marked in time.")
            continue
        kind, x = ev.kind, start - t0
        width = _event_downtime(ev) or 0.0
        legend = None if kind in labelled else f"{kind} (notice → +downtime)"
        labelled.add(kind)
        if width > 0:
            ax.axvspan(x, x + width, color=color[kind], alpha=0.25, label=legend)
        else:
            ax.axvline(x, color=color[kind], lw=1.5, label=legend)
        ax.annotate(
            _event_label(i, ev),
            (x, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(2, -4),
            textcoords="offset points",
            rotation=90,
            va="top",
            fontsize=8,
            color="black",
        )


def _bars(
    ax, labels: list[str], stacks: dict[str, list[float]], totals=None, total_label: str = "measured downtime"
) -> None:
    """Horizontal stacked bars: one per label, one colour per part; optional total markers."""
    ys = list(range(len(labels)))
    left = [0.0] * len(labels)
    for (part, values), color in zip(stacks.items(), _colors(len(stacks))):
        hatch = "//" if part == "phase1_s" else None
        ax.barh(ys, values, left=left, color=color, hatch=hatch, edgecolor="white", label=PART_LABELS.get(part, part))
        left = [a + b for a, b in zip(left, values)]
    if totals is not None:
        pts = [(t, y) for t, y in zip(totals, ys) if t is not None]
        if pts:
            ax.plot([t for t, _ in pts], [y for _, y in pts], "kD", ms=5, label=total_label)
    for y, width, total in zip(ys, left, totals or [None] * len(ys)):
        ax.annotate(
            f"Σ {width:.3g} s",
            (max(width, total or 0.0), y),
            xytext=(6, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
        )
    ax.set_yticks(ys, labels)
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    _legend_outside(ax)


def plot_event_parts(summary: Summary, out_dir: Path, notes: list[str]) -> str | None:
    """Stacked pause parts per event of the run, ``other`` included, so each bar is the event's gap
    (marked); None without events."""
    events = summary.events
    if not events:
        notes.append("The run had no interruptions: downtime-parts plot skipped.")
        return None
    order = _ordered((p for ev in events for p in _pause_parts(ev)), EVENT_PARTS + RESTART_PARTS)
    stacks: dict[str, list[float]] = {}
    for part in order + ["other_s"]:
        stacks[part] = [
            max(0.0, ev.part(part) or 0.0) if part in _pause_parts(ev) or part == "other_s" else 0.0 for ev in events
        ]
    for i, ev in enumerate(events, 1):
        missing = [p for p in _pause_parts(ev) if ev.part(p) is None]
        if missing:
            notes.append(
                f"Event {_event_label(i, ev)}: {', '.join(missing)} missing or null, "
                "plotted as 0 (their time is in 'other')."
            )
        if (other := ev.part("other_s") or 0.0) < 0:
            notes.append(
                f"Event {_event_label(i, ev)}: its parts overlap by {-other:.3g} s (negative 'other', plotted as 0)."
            )
    fig, ax = _new_figure("Pause parts per interruption (they add up to the gap)")
    labels = [_event_label(i, ev) for i, ev in enumerate(events, 1)]
    _bars(ax, labels, stacks, totals=[ev.part("gap_s") for ev in events], total_label="measured gap")
    ax.set_ylabel("event (#, kind, ranks)")
    return _save(fig, out_dir, "downtime_parts.png")


# ---------------------------------------------------------------- benchmark plots


def downtime_medians(downtime: dict) -> dict[tuple[str, str], float]:
    """Median downtime_s per (event, strategy) over the repeats in a downtime.json."""
    groups: dict[tuple[str, str], list[float | None]] = defaultdict(list)
    for row in downtime["rows"]:
        groups[(str(row.get("event")), str(row.get("strategy")))].append(_num(row.get("downtime_s")))
    return {k: m for k, v in groups.items() if (m := _median(v)) is not None}


def plot_downtime_compare(downtime: dict, out_dir: Path) -> str | None:
    """Median downtime per event kind and strategy, log scale, restart/tmslurm ratios annotated."""
    medians = downtime_medians(downtime)
    if not medians:
        return None
    events = _ordered((e for e, _ in medians), EVENT_KINDS)
    strategies = _ordered((s for _, s in medians), STRATEGIES)
    width = 0.8 / len(strategies)
    fig, ax = _new_figure("Median downtime per event: tmslurm vs restart baselines")
    for j, (strategy, color) in enumerate(zip(strategies, _colors(len(strategies)))):
        xs = [i + (j - (len(strategies) - 1) / 2) * width for i in range(len(events))]
        ys = [medians.get((e, strategy)) for e in events]
        pts = [(x, y, e) for x, y, e in zip(xs, ys, events) if y is not None and y > 0]
        ax.bar([p[0] for p in pts], [p[1] for p in pts], width, color=color, label=strategy)
        for x, y, e in pts:
            ax.annotate(
                _ratio_text(y, medians.get((e, "tmslurm")), strategy),
                (x, y),
                xytext=(0, 2),
                textcoords="offset points",
                ha="center",
                fontsize=8,
            )
    ax.set_yscale("log")
    ax.set_xticks(range(len(events)), events)
    ax.set_xlabel("event kind")
    ax.set_ylabel("median downtime (s, log scale)")
    _plain_ticks(ax, "y")
    ax.legend(fontsize=8, loc="upper left")
    ax.margins(y=0.15)
    return _save(fig, out_dir, "downtime_compare.png")


def _ratio_text(value: float, tmslurm: float | None, strategy: str) -> str:
    if strategy == "tmslurm" or not tmslurm:
        return f"{value:.3g} s"
    return f"{value:.3g} s\n×{value / tmslurm:.1f}"


def plot_bench_parts(downtime: dict, out_dir: Path) -> str | None:
    """Median parts per (strategy, event) of a downtime.json as stacked bars."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for row in downtime["rows"]:
        if isinstance(row.get("parts"), dict):
            groups[(str(row.get("strategy")), str(row.get("event")))].append(row["parts"])
    if not groups:
        return None
    keys = sorted(groups, key=lambda k: (_rank(k[0], STRATEGIES), _rank(k[1], EVENT_KINDS)))
    parts = _ordered((p for rows in groups.values() for r in rows for p in r), EVENT_PARTS + RESTART_PARTS)
    stacks = {p: [_median(_num(r.get(p)) for r in groups[k]) or 0.0 for k in keys] for p in parts}
    fig, ax = _new_figure("Median downtime parts per strategy and event (benchmark)")
    _bars(ax, [f"{s} / {e}" for s, e in keys], stacks)
    ax.set_ylabel("strategy / event")
    return _save(fig, out_dir, "bench_parts.png")


def _rank(value: str, order: tuple[str, ...]) -> tuple[int, str]:
    return (order.index(value) if value in order else len(order), value)


def scaling_medians(scaling: dict) -> dict[str, dict[int, tuple[float | None, float | None]]]:
    """mode -> ranks -> (median phase2_s, median downtime_s) from a scaling.json."""
    groups: dict[str, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for row in scaling["rows"]:
        ranks = _num(row.get("ranks"))
        if ranks is not None:
            groups[str(row.get("mode"))][int(ranks)].append(row)
    return {
        mode: {
            r: (_median(_num(x.get("phase2_s")) for x in rows), _median(_num(x.get("downtime_s")) for x in rows))
            for r, rows in sorted(by_ranks.items())
        }
        for mode, by_ranks in groups.items()
    }


def plot_scaling(scaling: dict, out_dir: Path) -> str | None:
    """Phase-2 time and total downtime vs ranks, delta switch vs full rebuild."""
    medians = scaling_medians(scaling)
    if not medians:
        return None
    fig, ax = _new_figure("Switch cost vs scale: delta switch vs full rebuild")
    modes = _ordered(medians, ("delta", "full"))
    values = []
    for mode, color in zip(modes, _colors(len(modes))):
        for idx, style, what in ((0, "o-", "phase 2"), (1, "s--", "total downtime")):
            pts = [(r, y) for r, v in medians[mode].items() if (y := v[idx]) is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=color, label=f"{mode}: {what}")
                values += [p[1] for p in pts if p[1] > 0]
    ax.set_xscale("log", base=2)
    _plain_ticks(ax, "x")
    if values and max(values) / min(values) > 20:
        ax.set_yscale("log")
        _plain_ticks(ax, "y")
    ax.set_xlabel("ranks (log2 scale)")
    ax.set_ylabel("seconds (log scale)" if ax.get_yscale() == "log" else "seconds")
    _legend_outside(ax)
    return _save(fig, out_dir, "scaling.png")


# ---------------------------------------------------------------- markdown


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


def _image(name: str | None, alt: str) -> list[str]:
    return [f"![{alt}]({name})", ""] if name else []


def _run_section(summary: Summary, images: dict) -> list[str]:
    lay = " × ".join(f"{k}={v}" for k, v in summary.layout.model_dump().items())
    lines = [
        f"# Run report: {summary.run_id}",
        "",
        f"- layout: {lay}",
        f"- steps: {summary.steps}",
        f"- loss: {_fmt(_num(summary.loss_first))} → {_fmt(_num(summary.loss_last))}",
        f"- median step time: {_fmt(_num(summary.median_step_s), ' s')}",
        f"- final parameters sha256: `{summary.final_params_sha256 or 'n/a'}`",
        f"- interruptions: {len(summary.events)}",
        "",
        "## Step time",
        "",
    ]
    return lines + _image(images.get("throughput"), "step time over wall time")


def _events_section(summary: Summary, images: dict) -> list[str]:
    lines = ["## Interruptions", ""]
    if not summary.events:
        return lines + ["No interruptions in this run.", ""]
    header = ["#", "kind", "ranks", "node", "standby", "gap", "= pause parts + other", "downtime"]
    rows = [
        [
            str(i),
            ev.kind,
            _ranks(ev),
            ev.node or "",
            ev.standby or "",
            _fmt(ev.part("gap_s"), " s"),
            _sum_text(ev),
            _fmt(ev.part("downtime_s"), " s"),
        ]
        for i, ev in enumerate(summary.events, 1)
    ]
    lines += _table(header, rows) + [""]
    lines += [
        "Gap = completion of the first step after the event − completion of the last step before it; "
        "it is the sum of the pause parts and `other` (what the parts do not explain; negative when "
        "parts overlap). Downtime = gap − median step time. A planned switch's phase 1 runs while "
        "training goes on, so it is not a pause part.",
        "",
    ]
    return lines + _image(images.get("parts"), "pause parts per event")


def _ranks(ev: Event) -> str:
    return ",".join(str(r) for r in ev.ranks)


def _pause_parts(ev: Event) -> tuple[str, ...]:
    """The parts that lie one after the other in the event's pause (:func:`~tmslurm.controller.events.pause_parts`)."""
    return pause_parts(ev.record())


def _sum_text(ev: Event) -> str:
    terms = [
        f"{PART_LABELS.get(p, p[:-2]).split(' (')[0]} {value:.3f}"
        for p in _pause_parts(ev)
        if (value := ev.part(p)) is not None
    ]
    if (other := ev.part("other_s")) is not None:
        terms.append(f"other {other:.3f}")
    return " + ".join(terms) or "n/a"


def _bench_section(downtime: dict, images: dict) -> list[str]:
    medians = downtime_medians(downtime)
    events = _ordered((e for e, _ in medians), EVENT_KINDS)
    strategies = _ordered((s for _, s in medians), STRATEGIES)
    baselines = [s for s in strategies if s != "tmslurm"]
    rows = []
    for e in events:
        tm = medians.get((e, "tmslurm"))
        row = [e] + [_fmt(medians.get((e, s)), " s") for s in strategies]
        row += [_fmt(medians[(e, b)] / tm) + "×" if tm and (e, b) in medians else "n/a" for b in baselines]
        rows.append(row)
    header = ["event"] + [f"{s} (median)" for s in strategies] + [f"{b} / tmslurm" for b in baselines]
    lines = ["## Downtime vs restart baselines (benchmark)", ""] + _table(header, rows) + [""]
    ratios = {k: v for k, v in downtime.items() if k.startswith("ratio") and _num(v) is not None}
    if ratios:
        lines += [
            "Ratios as recorded by the benchmark: "
            + ", ".join(f"{k} = {_num(v):.3g}" for k, v in sorted(ratios.items())),
            "",
        ]
    lines += [
        "Medians here are the middle value, or the mean of the two middle ones for an even count; the "
        "benchmark's p50 is the nearest-rank percentile (the lower middle value), so the two can differ "
        "by half the gap between the middle samples.",
        "",
    ]
    return (
        lines
        + _image(images.get("compare"), "median downtime per event kind")
        + _image(images.get("bench_parts"), "median downtime parts per strategy")
    )


def _scaling_section(scaling: dict, images: dict) -> list[str]:
    rows = [
        [str(r), mode, _fmt(p2, " s"), _fmt(dt, " s")]
        for mode, by_ranks in scaling_medians(scaling).items()
        for r, (p2, dt) in by_ranks.items()
    ]
    return (
        ["## Switch cost vs scale (benchmark)", ""]
        + _table(["ranks", "mode", "phase 2 (median)", "downtime (median)"], rows)
        + [""]
        + _image(images.get("scaling"), "phase 2 and downtime vs ranks")
    )


# ---------------------------------------------------------------- entry point


def write_report(
    run_dir: Path | str,
    out_dir: Path | str | None = None,
    *,
    downtime_json: Path | str | None = None,
    scaling_json: Path | str | None = None,
) -> Path:
    """Write ``report.md`` and its plots for the run in ``run_dir``; returns the report's path.

    Raises TmslurmError naming the file when summary.json (or a passed benchmark file) is
    missing or malformed; nothing is written in that case.
    """
    run_dir = Path(run_dir)
    summary = load_summary(RunDir(run_dir).summary)
    downtime = load_bench(downtime_json, "downtime benchmark")
    scaling = load_bench(scaling_json, "scaling benchmark")
    out = Path(out_dir) if out_dir is not None else run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    images = {"throughput": plot_throughput(summary, out, notes), "parts": plot_event_parts(summary, out, notes)}
    lines = _run_section(summary, images) + _events_section(summary, images)
    if downtime is not None:
        images.update(compare=plot_downtime_compare(downtime, out), bench_parts=plot_bench_parts(downtime, out))
        lines += _bench_section(downtime, images)
    if scaling is not None:
        images["scaling"] = plot_scaling(scaling, out)
        lines += _scaling_section(scaling, images)
    lines += ["## Notes", ""] + ([f"- {n}" for n in notes] or ["- none"]) + [""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    log.info("wrote %s", path)
    return path
