"""Plot the benchmarks' downtime.json and scaling.json: ``python -m benchmarks plots --downtime-json
PATH --scaling-json PATH --out DIR`` (either file may be left out, not both).

Contract: :func:`write_bench_plots` writes into ``DIR``:

- ``downtime_compare.png`` and ``bench_parts.png`` (with a downtime.json): median downtime per
  event kind for tmslurm vs in-job restart vs requeue restart (log scale, ratios annotated), and
  the median parts of each (strategy, event);
- ``scaling.png`` (with a scaling.json): phase-2 time and total downtime vs ranks, delta switch
  vs full rebuild;
- ``bench.md`` linking them, with the numbers as tables.

A run's own report (throughput, parts per event) is ``tmslurm report RUN_DIR``; both may write into
the same folder (docs/bench/report/). Failure behaviour: a passed file that is missing, unreadable
or malformed raises :class:`~tmslurm.core.errors.TmslurmError` naming it, before anything is
written. Plots need matplotlib (``pip install -e .[report]``).
"""

from __future__ import annotations

import argparse
import logging
import statistics
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from tmslurm.cli.figures import (
    EVENT_PARTS,
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
from tmslurm.core.errors import TmslurmError
from tmslurm.core.jsonfile import read_json_object

log = logging.getLogger(__name__)

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


# ---------------------------------------------------------------- inputs


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


def _median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


# ---------------------------------------------------------------- plots


def downtime_medians(downtime: dict) -> dict[tuple[str, str], float]:
    """Median downtime_s per (event, strategy) over the repeats in a downtime.json."""
    groups: dict[tuple[str, str], list[float | None]] = defaultdict(list)
    for row in downtime["rows"]:
        groups[(str(row.get("event")), str(row.get("strategy")))].append(num(row.get("downtime_s")))
    return {k: m for k, v in groups.items() if (m := _median(v)) is not None}


def plot_downtime_compare(downtime: dict, out_dir: Path) -> str | None:
    """Median downtime per event kind and strategy, log scale, restart/tmslurm ratios annotated."""
    medians = downtime_medians(downtime)
    if not medians:
        return None
    events = ordered((e for e, _ in medians), EVENT_KINDS)
    strategies = ordered((s for _, s in medians), STRATEGIES)
    width = 0.8 / len(strategies)
    fig, ax = new_figure("Median downtime per event: tmslurm vs restart baselines")
    for j, (strategy, color) in enumerate(zip(strategies, colors(len(strategies)))):
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
    plain_ticks(ax, "y")
    ax.legend(fontsize=8, loc="upper left")
    ax.margins(y=0.15)
    return save(fig, out_dir, "downtime_compare.png")


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
    parts = ordered((p for rows in groups.values() for r in rows for p in r), EVENT_PARTS + RESTART_PARTS)
    stacks = {p: [_median(num(r.get(p)) for r in groups[k]) or 0.0 for k in keys] for p in parts}
    fig, ax = new_figure("Median downtime parts per strategy and event (benchmark)")
    bars(ax, [f"{s} / {e}" for s, e in keys], stacks)
    ax.set_ylabel("strategy / event")
    return save(fig, out_dir, "bench_parts.png")


def _rank(value: str, order: tuple[str, ...]) -> tuple[int, str]:
    return (order.index(value) if value in order else len(order), value)


def scaling_medians(scaling: dict) -> dict[str, dict[int, tuple[float | None, float | None]]]:
    """mode -> ranks -> (median phase2_s, median downtime_s) from a scaling.json."""
    groups: dict[str, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for row in scaling["rows"]:
        ranks = num(row.get("ranks"))
        if ranks is not None:
            groups[str(row.get("mode"))][int(ranks)].append(row)
    return {
        mode: {
            r: (_median(num(x.get("phase2_s")) for x in rows), _median(num(x.get("downtime_s")) for x in rows))
            for r, rows in sorted(by_ranks.items())
        }
        for mode, by_ranks in groups.items()
    }


def plot_scaling(scaling: dict, out_dir: Path) -> str | None:
    """Phase-2 time and total downtime vs ranks, delta switch vs full rebuild."""
    medians = scaling_medians(scaling)
    if not medians:
        return None
    fig, ax = new_figure("Switch cost vs scale: delta switch vs full rebuild")
    modes = ordered(medians, ("delta", "full"))
    values = []
    for mode, color in zip(modes, colors(len(modes))):
        for idx, style, what in ((0, "o-", "phase 2"), (1, "s--", "total downtime")):
            pts = [(r, y) for r, v in medians[mode].items() if (y := v[idx]) is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=color, label=f"{mode}: {what}")
                values += [p[1] for p in pts if p[1] > 0]
    ax.set_xscale("log", base=2)
    plain_ticks(ax, "x")
    if values and max(values) / min(values) > 20:
        ax.set_yscale("log")
        plain_ticks(ax, "y")
    ax.set_xlabel("ranks (log2 scale)")
    ax.set_ylabel("seconds (log scale)" if ax.get_yscale() == "log" else "seconds")
    legend_outside(ax)
    return save(fig, out_dir, "scaling.png")


# ---------------------------------------------------------------- markdown


def _bench_section(downtime: dict, images: dict) -> list[str]:
    medians = downtime_medians(downtime)
    events = ordered((e for e, _ in medians), EVENT_KINDS)
    strategies = ordered((s for _, s in medians), STRATEGIES)
    baselines = [s for s in strategies if s != "tmslurm"]
    rows = []
    for e in events:
        tm = medians.get((e, "tmslurm"))
        row = [e] + [fmt(medians.get((e, s)), " s") for s in strategies]
        row += [fmt(medians[(e, b)] / tm) + "×" if tm and (e, b) in medians else "n/a" for b in baselines]
        rows.append(row)
    header = ["event"] + [f"{s} (median)" for s in strategies] + [f"{b} / tmslurm" for b in baselines]
    lines = ["## Downtime vs restart baselines (benchmark)", ""] + table(header, rows) + [""]
    ratios = {k: v for k, v in downtime.items() if k.startswith("ratio") and num(v) is not None}
    if ratios:
        lines += [
            "Ratios as recorded by the benchmark: "
            + ", ".join(f"{k} = {num(v):.3g}" for k, v in sorted(ratios.items())),
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
        + image(images.get("compare"), "median downtime per event kind")
        + image(images.get("bench_parts"), "median downtime parts per strategy")
    )


def _scaling_section(scaling: dict, images: dict) -> list[str]:
    rows = [
        [str(r), mode, fmt(p2, " s"), fmt(dt, " s")]
        for mode, by_ranks in scaling_medians(scaling).items()
        for r, (p2, dt) in by_ranks.items()
    ]
    return (
        ["## Switch cost vs scale (benchmark)", ""]
        + table(["ranks", "mode", "phase 2 (median)", "downtime (median)"], rows)
        + [""]
        + image(images.get("scaling"), "phase 2 and downtime vs ranks")
    )


# ---------------------------------------------------------------- entry point


def write_bench_plots(
    out_dir: Path | str, *, downtime_json: Path | str | None = None, scaling_json: Path | str | None = None
) -> Path:
    """Write ``bench.md`` and its plots into ``out_dir``; returns the markdown's path.

    Raises TmslurmError naming the file when a passed benchmark file is missing or malformed, or
    when neither file is passed; nothing is written in that case.
    """
    if downtime_json is None and scaling_json is None:
        raise TmslurmError("benchmarks plots: pass --downtime-json, --scaling-json or both")
    downtime = load_bench(downtime_json, "downtime benchmark")
    scaling = load_bench(scaling_json, "scaling benchmark")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    images: dict[str, str | None] = {}
    lines: list[str] = ["# Benchmark plots", ""]
    if downtime is not None:
        images.update(compare=plot_downtime_compare(downtime, out), bench_parts=plot_bench_parts(downtime, out))
        lines += _bench_section(downtime, images)
    if scaling is not None:
        images["scaling"] = plot_scaling(scaling, out)
        lines += _scaling_section(scaling, images)
    path = out / "bench.md"
    path.write_text("\n".join(lines))
    log.info("wrote %s", path)
    return path


def main(args: argparse.Namespace) -> int:
    """``python -m benchmarks plots``: exit 0 with the markdown's path printed, 1 with the error."""
    try:
        path = write_bench_plots(args.out, downtime_json=args.downtime_json, scaling_json=args.scaling_json)
    except TmslurmError as exc:
        print(f"benchmarks plots: {exc}")
        return 1
    print(f"plots written to {path}")
    return 0
