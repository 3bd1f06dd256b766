"""Turn a finished run into ``report.md`` plus PNG plots.

Contract: :func:`write_report` reads ``<run_dir>/summary.json`` (written by the training runtime)
and writes into ``out_dir`` (default ``<run_dir>/report/``):

- ``throughput.png``: step time against wall time, each interruption a labelled band;
- ``downtime_parts.png``: the parts of each event's downtime as stacked bars;
- ``report.md`` linking them, with the numbers as tables.

The benchmarks' own results (downtime.json, scaling.json) are plotted by ``python -m benchmarks
plots`` in a source checkout, not here: the wheel carries the run report only.
The summary is read as a :class:`~tmslurm.core.results.Summary`; a missing or null part of an
event is plotted as 0 and listed under "Notes".
Failure behaviour: a missing, unreadable or malformed summary.json raises
:class:`~tmslurm.core.errors.TmslurmError` naming the file, and nothing is written. Plots need
matplotlib (the ``report`` extra), imported lazily and drawn with the Agg canvas only.
"""

from __future__ import annotations

import logging
from pathlib import Path

from tmslurm.cli.figures import (
    EVENT_PARTS,
    PART_LABELS,
    RESTART_PARTS,
    bars,
    colors,
    fmt,
    image,
    legend_outside,
    new_figure,
    num,
    ordered,
    plain_ticks,
    save,
    table,
)
from tmslurm.controller.events import pause_parts
from tmslurm.core.results import Event, Summary, load_summary
from tmslurm.core.rundir import RunDir

log = logging.getLogger(__name__)


def _event_label(i: int, ev: Event) -> str:
    ranks = _ranks(ev)
    return f"#{i} {ev.kind}" + (f" r{ranks}" if ranks else "")


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
    steps = [(t, dt) for s in summary.step_log if (t := num(s.t_end)) is not None and (dt := num(s.dt)) is not None]
    if len(steps) < len(summary.step_log):
        notes.append(f"{len(summary.step_log) - len(steps)} step_log entries with a non-finite t_end/dt were skipped.")
    if not steps:
        notes.append("No usable step_log: throughput plot skipped.")
        return None
    t0 = min(t - dt for t, dt in steps)
    fig, ax = new_figure(f"Step time over the run ({summary.run_id})")
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
        plain_ticks(ax, "y")
    _mark_events(ax, summary.events, t0, notes)
    ax.set_xlabel("wall time since the first step started (s)")
    ax.set_ylabel("step time (s)")
    legend_outside(ax)
    return save(fig, out_dir, "throughput.png")


def _mark_events(ax, events: list[Event], t0: float, notes: list[str]) -> None:
    kinds = ordered((e.kind for e in events), ())
    color = dict(zip(kinds, colors(len(kinds))))
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


def plot_event_parts(summary: Summary, out_dir: Path, notes: list[str]) -> str | None:
    """Stacked pause parts per event of the run, ``other`` included, so each bar is the event's gap
    (marked); None without events."""
    events = summary.events
    if not events:
        notes.append("The run had no interruptions: downtime-parts plot skipped.")
        return None
    order = ordered((p for ev in events for p in _pause_parts(ev)), EVENT_PARTS + RESTART_PARTS)
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
    fig, ax = new_figure("Pause parts per interruption (they add up to the gap)")
    labels = [_event_label(i, ev) for i, ev in enumerate(events, 1)]
    bars(ax, labels, stacks, totals=[ev.part("gap_s") for ev in events], total_label="measured gap")
    ax.set_ylabel("event (#, kind, ranks)")
    return save(fig, out_dir, "downtime_parts.png")


# ---------------------------------------------------------------- markdown


def _run_section(summary: Summary, images: dict) -> list[str]:
    lay = " × ".join(f"{k}={v}" for k, v in summary.layout.model_dump().items())
    lines = [
        f"# Run report: {summary.run_id}",
        "",
        f"- layout: {lay}",
        f"- steps: {summary.steps}",
        f"- loss: {fmt(num(summary.loss_first))} → {fmt(num(summary.loss_last))}",
        f"- median step time: {fmt(num(summary.median_step_s), ' s')}",
        f"- final parameters sha256: `{summary.final_params_sha256 or 'n/a'}`",
        f"- interruptions: {len(summary.events)}",
        "",
        "## Step time",
        "",
    ]
    return lines + image(images.get("throughput"), "step time over wall time")


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
            fmt(ev.part("gap_s"), " s"),
            _sum_text(ev),
            fmt(ev.part("downtime_s"), " s"),
        ]
        for i, ev in enumerate(summary.events, 1)
    ]
    lines += table(header, rows) + [""]
    lines += [
        "Gap = completion of the first step after the event − completion of the last step before it; "
        "it is the sum of the pause parts and `other` (what the parts do not explain; negative when "
        "parts overlap). Downtime = gap − median step time. A planned switch's phase 1 runs while "
        "training goes on, so it is not a pause part.",
        "",
    ]
    return lines + image(images.get("parts"), "pause parts per event")


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


# ---------------------------------------------------------------- entry point


def write_report(run_dir: Path | str, out_dir: Path | str | None = None) -> Path:
    """Write ``report.md`` and its plots for the run in ``run_dir``; returns the report's path.

    Raises TmslurmError naming the file when summary.json is missing or malformed; nothing is
    written in that case.
    """
    run_dir = Path(run_dir)
    summary = load_summary(RunDir(run_dir).summary)
    out = Path(out_dir) if out_dir is not None else run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    images = {"throughput": plot_throughput(summary, out, notes), "parts": plot_event_parts(summary, out, notes)}
    lines = _run_section(summary, images) + _events_section(summary, images)
    lines += ["## Notes", ""] + ([f"- {n}" for n in notes] or ["- none"]) + [""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    log.info("wrote %s", path)
    return path
