"""Which checkpoints of a run are complete, read from the run directory alone (no torch).

Contract: :func:`latest_complete` returns the newest step whose every shard wrote its
``meta.json`` (what makes a checkpoint count as complete, written last), or None. A shard saved at
``parallel.zero=1`` is a directory of slices ``slice<d>of<D>``; it is complete when all D slices
wrote theirs (whatever the current dp: a run may resume at another data-parallel size). It only lists
directories and never fails on a missing or partial checkpoint tree. Kept apart from
:mod:`tmslurm.train.checkpoint` so the controller process, which never loads a tensor, does not
import torch (a restarted controller is back ~1.3 s sooner).
"""

from __future__ import annotations

from pathlib import Path

from tmslurm.core.rundir import RunDir


def latest_complete(run_dir: str | Path, shards: int | list[str]) -> int | None:
    """Newest step with every shard saved; ``shards`` is the number of stages (tp = 1) or the shard names."""
    root = RunDir(Path(run_dir)).checkpoints
    if not root.is_dir():
        return None
    names = [f"stage{j}" for j in range(shards)] if isinstance(shards, int) else list(shards)
    steps = []
    for d in root.glob("step_*"):
        if all(shard_complete(d / name) for name in names):
            steps.append(int(d.name.split("_")[1]))
    return max(steps) if steps else None


def shard_complete(path: Path) -> bool:
    """The shard's ``meta.json`` exists, or every slice ``slice<d>of<D>`` (d < D) has its own."""
    if (path / "meta.json").is_file():
        return True
    totals = {d.name.partition("of")[2] for d in path.glob("slice*of*")}
    if len(totals) != 1 or not next(iter(totals)).isdigit():
        return False
    total = int(totals.pop())
    return total > 0 and all((path / f"slice{i}of{total}" / "meta.json").is_file() for i in range(total))
