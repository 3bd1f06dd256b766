"""``python -m benchmarks ckpt``: how long a periodic checkpoint stalls the training step.

Contract: in this one process, one rank holding the whole model (dp = pp = tp = 1, ``SoloStageComm``,
``train.threads`` = 1 as a rank has) trains ``--steps`` steps from the same initial state in each mode:
checkpoints ``off``, ``sync`` (:func:`~tmslurm.train.checkpoint.save_stage`, what
``train.checkpoint_async=false`` does) and ``async`` (:class:`~tmslurm.train.async_checkpoint.AsyncCheckpointer`,
the default), with a checkpoint after every ``--every``-th step, as the worker does. Modes alternate
``--repeats`` times and samples are pooled. A step is timed from the start of its compute to the
return of the checkpoint call (what the step loop waits for); the first ``--warmup`` steps of each
repeat are left out. Per mode it reports the median plain step, the median checkpoint step, the median
step right after a checkpoint (where a background write competes for the cores), and the stall of
each checkpoint (checkpoint step minus the mode's median plain step: median, p10, p90, count), and
the cost per checkpoint over a whole interval (mean step time minus that of ``off``, times ``--every``),
which also counts a background write slowing the steps that follow it. Prints a table and writes ``--json``. Any failure
(a checkpoint error included) propagates.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import commit, say
from tmslurm.comm.stage_comm import SoloStageComm
from tmslurm.core.config import MODEL_PRESETS, TrainConfig
from tmslurm.core.topology import split_layers
from tmslurm.train import checkpoint
from tmslurm.train.async_checkpoint import AsyncCheckpointer
from tmslurm.train.model import ReferenceTask
from tmslurm.train.schedule import StageRunner
from tmslurm.train.task import StageSpec

MODES = ("off", "sync", "async")


def build_runner(model: str) -> StageRunner:
    return build_stage_runner(model, stage=0, stages=1)


def build_stage_runner(model: str, stage: int, stages: int) -> StageRunner:
    """The runner of one pipeline stage of ``model`` (dp = tp = 1), as a rank builds it."""
    cfg = MODEL_PRESETS[model]
    task = ReferenceTask(cfg, TrainConfig())
    role = "only" if stages == 1 else "first" if stage == 0 else "last" if stage == stages - 1 else "middle"
    spec = StageSpec(stage, stages, role, split_layers(cfg.n_layer, stages)[stage])
    return StageRunner(task, spec, 0, 1, TrainConfig().micro_batches, torch.device("cpu"))


def run_mode(mode: str, model: str, steps: int, every: int, out: Path) -> list[tuple[int, bool, float]]:
    """Train ``steps`` steps; per step (index, checkpointed, seconds)."""
    runner, comm = build_runner(model), SoloStageComm()
    saver = AsyncCheckpointer(out)
    rows = []
    for step in range(steps):
        t0 = time.perf_counter()
        runner.compute(step, comm)
        runner.apply()
        due = mode != "off" and (step + 1) % every == 0
        if due and mode == "sync":
            checkpoint.save_stage(out, step + 1, 0, runner)
        elif due:
            saver.save(step + 1, 0, runner)
        rows.append((step, due, time.perf_counter() - t0))
    saver.wait()
    return rows


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def summarise(rows: list[tuple[int, bool, float]], warmup: int, every: int) -> dict[str, Any]:
    kept = [r for r in rows if r[0] >= warmup]
    plain = [dt for s, due, dt in kept if not due]
    ckpt = [dt for s, due, dt in kept if due]
    after = [dt for s, due, dt in kept if not due and s % every == 0 and s > 0]
    base = statistics.median(plain)
    stall = [dt - base for dt in ckpt]
    out: dict[str, Any] = {
        "plain_median_s": base,
        "plain_n": len(plain),
        "mean_step_s": statistics.fmean(dt for _, _, dt in kept),
        "after_ckpt_median_s": statistics.median(after) if after else None,
    }
    if ckpt:
        out |= {
            "ckpt_median_s": statistics.median(ckpt),
            "stall_median_s": statistics.median(stall),
            "stall_p10_s": pct(stall, 0.1),
            "stall_p90_s": pct(stall, 0.9),
            "ckpt_n": len(ckpt),
        }
    return out


def shard_bytes(out: Path) -> int | None:
    shards = sorted(out.glob("checkpoints/step_*/stage0"))
    return sum(f.stat().st_size for f in shards[-1].iterdir()) if shards else None


def ms(x: float | None) -> str:
    return "-" if x is None else f"{1000 * x:.1f}"


def table(modes: dict[str, dict[str, Any]]) -> str:
    head = (
        "| mode | plain step median (ms) | checkpoint step median (ms) | step after a checkpoint (ms) "
        "| stall per checkpoint median [p10, p90] (ms) | n | cost per checkpoint over its interval (ms) |"
    )
    lines = [head, "|---|---|---|---|---|---|---|"]
    for mode, s in modes.items():
        stall = (
            "-"
            if "stall_median_s" not in s
            else f"{ms(s['stall_median_s'])} [{ms(s['stall_p10_s'])}, {ms(s['stall_p90_s'])}]"
        )
        lines.append(
            f"| {mode} | {ms(s['plain_median_s'])} | {ms(s.get('ckpt_median_s'))} | {ms(s['after_ckpt_median_s'])} "
            f"| {stall} | {s.get('ckpt_n', 0)} | {ms(s['interval_cost_s'])} |"
        )
    return "\n".join(lines)


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    out = Path(args.out)
    rows: dict[str, list[tuple[int, bool, float]]] = {m: [] for m in MODES}
    for rep in range(args.repeats):
        for mode in MODES:
            d = out / f"{mode}-{rep}"
            shutil.rmtree(d, ignore_errors=True)
            say(f"repeat {rep + 1}/{args.repeats}: {mode}, {args.steps} steps, checkpoint every {args.every}")
            rows[mode] += [(s, due, dt) for s, due, dt in run_mode(mode, args.model, args.steps, args.every, d)]
    modes = {m: summarise(rows[m], args.warmup, args.every) for m in MODES}
    for s in modes.values():
        s["interval_cost_s"] = (s["mean_step_s"] - modes["off"]["mean_step_s"]) * args.every
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "commit": commit(),
        "cpus": os.cpu_count(),
        "model": args.model,
        "steps": args.steps,
        "every": args.every,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "torch": torch.__version__,
        "shard_bytes": shard_bytes(out / f"sync-{args.repeats - 1}"),
        "modes": modes,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1))
    print(table(modes))
    print(f"checkpoint size {result['shard_bytes']} bytes; written {args.json}")
