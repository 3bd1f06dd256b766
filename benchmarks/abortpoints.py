"""``python -m benchmarks abortpoints``: what the abort points between layers cost a step.

Contract: one in-process stage runner (``--model``, DP1 x PP1, eager, 2 micro-batches, one torch
thread), its whole step (``StageRunner.compute`` then ``drop``) timed ``--repeats`` times with the
abort points disarmed (``stop=None``, as a sandboxed standby runs) and armed with a check that never
fires (what every rank runs), alternating, after 5 warm-up pairs. Prints the p50s side by side
with p10-p90, their difference and the p50 of the paired differences (armed - disarmed of each
alternating pair: drift of the host's speed cancels out); writes ``--json`` (docs/bench/abortpoints.json). No process,
no group: the hooks are the only difference between the two timings.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import commit, recorded_command, say, write_json

WARMUP = 5


def _timer(model: str) -> Callable[[Callable[[], None] | None], float]:
    import torch

    from tmslurm.agent.build import build_runner
    from tmslurm.comm.stage_comm import SoloStageComm
    from tmslurm.core.config import compose_config

    torch.set_num_threads(1)
    cfg = compose_config(
        ["parallel.dp=1", "parallel.pp=1", f"model={model}", "model.compile=false", "train.micro_batches=2"]
    )
    runner, comm = build_runner(cfg, 0), SoloStageComm()

    def one(stop: Callable[[], None] | None) -> float:
        t0 = time.perf_counter()
        runner.compute(0, comm, stop=stop)
        runner.drop()
        return time.perf_counter() - t0

    return one


def spread(xs: list[float]) -> dict[str, float]:
    """p50, p10 and p90 (nearest rank) in milliseconds."""
    s = sorted(xs)
    at = lambda q: s[min(len(s) - 1, int(q * len(s)))]  # noqa: E731
    return {
        "p50_ms": round(1e3 * statistics.median(s), 4),
        "p10_ms": round(1e3 * at(0.1), 4),
        "p90_ms": round(1e3 * at(0.9), 4),
    }


def main(args: argparse.Namespace) -> dict[str, Any]:
    one = _timer(args.model)
    never = lambda: None  # noqa: E731  (armed, never fires)
    for _ in range(WARMUP):
        one(None), one(never)
    off, on = [], []
    for _ in range(args.repeats):
        off.append(one(None))
        on.append(one(never))
    a, b = spread(off), spread(on)
    diff_ms = round(b["p50_ms"] - a["p50_ms"], 4)
    paired_ms = round(1e3 * statistics.median(y - x for x, y in zip(off, on)), 4)
    say(
        f"abortpoints {args.model}: disarmed p50 {a['p50_ms']:.3f} ms [{a['p10_ms']:.3f}, {a['p90_ms']:.3f}]   "
        f"armed p50 {b['p50_ms']:.3f} ms [{b['p10_ms']:.3f}, {b['p90_ms']:.3f}]   difference {1e3 * diff_ms:.0f} us "
        f"({100 * diff_ms / a['p50_ms']:.1f} %), paired p50 {1e3 * paired_ms:.0f} us, n={args.repeats} each"
    )
    result = {
        "command": recorded_command("abortpoints"),
        "commit": commit(),
        "date": datetime.date.today().isoformat(),
        "setup": f"model={args.model}, DP1 x PP1, eager, 2 micro-batches, 1 torch thread, in process",
        "n": args.repeats,
        "disarmed": a,
        "armed": b,
        "difference_p50_ms": diff_ms,
        "paired_difference_p50_ms": paired_ms,
        "difference_pct": round(100 * diff_ms / a["p50_ms"], 2),
    }
    write_json(Path(args.json), result)
    return result
