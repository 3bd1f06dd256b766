"""The drawing kit shared by the run report (:mod:`tmslurm.cli.report`) and the benchmarks' plots
(``benchmarks/plots.py``): Agg figures without pyplot state, stacked part bars, markdown tables, and
the names of a pause's parts.

Contract: every function here is pure apart from :func:`save`, which writes one PNG into the folder
it is given. Failure behaviour: matplotlib (the ``report`` extra) is imported lazily, inside the
functions that draw; without it they raise ImportError, and nothing else here needs it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tmslurm.core.results import PAUSE_PARTS

log = logging.getLogger(__name__)

EVENT_PARTS = PAUSE_PARTS
RESTART_PARTS = ("stop_s", "reschedule_s", "startup_s", "group_setup_s", "ckpt_load_s", "warmup_s", "redo_s")
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


def num(value: Any) -> float | None:
    """``value`` as a finite float, or None when it is missing, null, boolean or not numeric."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def ordered(found: Iterable[str], preferred: Iterable[str]) -> list[str]:
    """The distinct names in ``found``: those in ``preferred`` first, in its order, then the rest sorted."""
    found = list(dict.fromkeys(found))
    first = [x for x in preferred if x in found]
    return first + sorted(x for x in found if x not in first)


def fmt(value: float | None, unit: str = "") -> str:
    """Three significant digits and ``unit``, or ``n/a`` for None."""
    return "n/a" if value is None else f"{value:.3g}{unit}"


def new_figure(title: str):
    """A fresh Agg-backed figure and axes (no pyplot global state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    return fig, ax


def save(fig, out_dir: Path, name: str) -> str:
    fig.tight_layout()
    fig.savefig(out_dir / name, dpi=DPI)
    log.debug("wrote %s", out_dir / name)
    return name


def plain_ticks(ax, *axes: str) -> None:
    """Tick labels like 0.2, 4, 150 instead of 2x10^-1 on log axes."""
    from matplotlib.ticker import FuncFormatter

    fmt = FuncFormatter(lambda v, _pos: f"{v:g}")
    for name in axes:
        getattr(ax, f"{name}axis").set_major_formatter(fmt)


def legend_outside(ax) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, borderaxespad=0.0)


def colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def bars(
    ax, labels: list[str], stacks: dict[str, list[float]], totals=None, total_label: str = "measured downtime"
) -> None:
    """Horizontal stacked bars: one per label, one colour per part; optional total markers."""
    ys = list(range(len(labels)))
    left = [0.0] * len(labels)
    for (part, values), color in zip(stacks.items(), colors(len(stacks))):
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
    legend_outside(ax)


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table's lines."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


def image(name: str | None, alt: str) -> list[str]:
    """A markdown image line and a blank one, or nothing when the plot was skipped (None)."""
    return [f"![{alt}]({name})", ""] if name else []
