"""Preparing a run directory: create it (0700), copy a checkpoint to resume from, write the config.

Contract: :func:`prepare_run_dir` resolves ``cfg.run_dir`` (default ``runs/<time>``), refuses a
directory that already holds a finished run and a ``train.resume_from`` without a complete
checkpoint (TmslurmError naming them; :func:`check_run_dir`, before anything is written), creates it mode 0700,
copies the newest complete checkpoint of ``train.resume_from`` (TmslurmError when there is none)
and writes ``config.json``. :func:`warn_unprotected` logs a warning when a run has neither a
standby nor periodic checkpoints, and when a Slurm run has no periodic checkpoint (its batch host
can be lost with nothing to resume from). Used by ``tmslurm-launch`` and by the Slurm entry points.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from tmslurm.core.config import SLURM_CHECKPOINT_EVERY, RunConfig, to_dict
from tmslurm.core.errors import TmslurmError
from tmslurm.core.rundir import RunDir
from tmslurm.core.topology import Layout

log = logging.getLogger(__name__)


def run_dir_of(cfg: RunConfig) -> Path:
    """The run directory ``cfg`` names (default ``runs/<time>``), resolved; nothing is created."""
    return Path(cfg.run_dir or f"runs/{time.strftime('%Y%m%d-%H%M%S')}").resolve()


def check_run_dir(cfg: RunConfig, run_dir: Path) -> int | None:
    """What :func:`prepare_run_dir` would refuse, checked without writing anything: ``run_dir`` holds a
    finished run, or ``train.resume_from`` has no complete checkpoint (TmslurmError naming the fix).
    The step of the checkpoint to resume from, or None."""
    if RunDir(run_dir).summary.exists():
        raise TmslurmError(f"run directory {run_dir} already holds a finished run; pass run_dir=<new dir>")
    if not cfg.train.resume_from:
        return None
    from tmslurm.train.checkpoint import latest_complete

    src = Path(cfg.train.resume_from)
    step = latest_complete(src, Layout.from_config(cfg).shard_names)
    if step is None:
        raise TmslurmError(f"train.resume_from={src}: no complete checkpoint there (every shard needs meta.json)")
    return step


def prepare_run_dir(cfg: RunConfig) -> Path:
    run_dir = run_dir_of(cfg)
    check_run_dir(cfg, run_dir)  # refused before the directory exists
    RunDir(run_dir).create()  # 0700: the token, checkpoints and logs inside are the owner's alone
    cfg.run_dir = str(run_dir)
    if cfg.train.resume_from:
        copy_latest_checkpoint(Path(cfg.train.resume_from), run_dir, Layout.from_config(cfg).shard_names)
    RunDir(run_dir).config.write_text(json.dumps(to_dict(cfg), indent=1))
    return run_dir


def copy_latest_checkpoint(src: Path, run_dir: Path, shards: int | list[str]) -> int:
    """Copy the newest complete checkpoint of ``src`` into ``run_dir``; returns its step."""
    import shutil

    from tmslurm.train.checkpoint import checkpoint_dir, latest_complete

    step = latest_complete(src, shards)
    if step is None:
        raise TmslurmError(f"train.resume_from={src}: no complete checkpoint there (every shard needs meta.json)")
    if src.resolve() != run_dir.resolve():
        shutil.copytree(checkpoint_dir(src, step), checkpoint_dir(run_dir, step), dirs_exist_ok=True)
    return step


def warn_unprotected(cfg: RunConfig) -> None:
    """No standby and no periodic checkpoint: every unexpected failure restarts from step 0."""
    if cfg.standby.count == 0 and cfg.train.checkpoint_every == 0:
        log.warning(
            "standby.count=0 and train.checkpoint_every=0: an unexpected failure restarts the run from "
            "step 0 (set train.checkpoint_every=N or standby.count=1)"
        )
    if cfg.cluster == "slurm" and cfg.train.checkpoint_every == 0:
        log.warning(
            "cluster=slurm with train.checkpoint_every=0: if the batch host is lost the run has no checkpoint "
            "to resume from (train.resume_from); set train.checkpoint_every=K (default on Slurm: %d)",
            SLURM_CHECKPOINT_EVERY,
        )
