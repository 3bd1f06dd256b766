"""Submission with submitit: the main training job and the spare allocations.

Contract: :func:`executor` builds a submitit ``AutoExecutor`` for this run (folder
``<run_dir>/submitit``, partition, time, account and extra sbatch arguments from ``slurm.*``).
:func:`main_executor` makes the main job: one multi-node job with ``--no-kill`` (a lost node shrinks
it instead of killing it) and ``--requeue`` (submitted by :func:`tmslurm.slurm.proc.job.launch_slurm`).
:func:`submit_spare` submits one spare job whose body (:func:`spare_main`) runs
``ranks_per_node`` standby agents. A submission failure raises SlurmError (sbatch's message).
"""

from __future__ import annotations

import math
import os
import logging
import sys
import subprocess
from pathlib import Path
from typing import Any

from tmslurm.config import RunConfig, num_nodes, wants_monitors
from tmslurm.errors import ConfigError, SlurmError

log = logging.getLogger(__name__)


def time_minutes(text: str) -> int:
    """sbatch --time forms D-HH:MM:SS, HH:MM:SS, MM:SS, MM -> whole minutes (at least 1)."""
    try:
        days, _, rest = text.rpartition("-")
        parts = [int(p) for p in rest.split(":")]
        if len(parts) == 3:
            minutes = parts[0] * 60 + parts[1] + parts[2] / 60
        elif len(parts) == 2:
            minutes = parts[0] + parts[1] / 60
        else:
            minutes = parts[0]
        minutes += int(days) * 1440 if days else 0
    except ValueError:
        raise ConfigError(f"slurm.time={text!r} is not a Slurm time (D-HH:MM:SS, HH:MM:SS, MM:SS or MM). Fix: pass slurm.time=00:30:00") from None
    return max(1, math.ceil(minutes))  # never shorter than asked


def _extra_args(cfg: RunConfig) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for arg in cfg.slurm.extra_args:
        key, _, value = arg.lstrip("-").partition("=")
        out[key.replace("-", "_")] = value if value else True
    return out


def executor(run_dir: Path, cfg: RunConfig, *, name: str, nodes: int, extra: dict[str, Any] | None = None,
             exclude: str | None = None, srun_args: list[str] | None = None) -> Any:
    import submitit

    ex = submitit.AutoExecutor(folder=str(Path(run_dir) / "submitit"), cluster="slurm")
    params: dict[str, Any] = {"no_kill": True, "exclusive": True, **_extra_args(cfg), **(extra or {})}
    if cfg.slurm.account:
        params["account"] = cfg.slurm.account
    kwargs: dict[str, Any] = dict(name=name, timeout_min=time_minutes(cfg.slurm.time), slurm_partition=cfg.slurm.partition,
                                  nodes=nodes, tasks_per_node=1, slurm_additional_parameters=params)
    if exclude:
        kwargs["slurm_exclude"] = exclude
    if srun_args:
        kwargs["slurm_srun_args"] = srun_args
    ex.update_parameters(**kwargs)
    return ex


def main_executor(run_dir: Path, cfg: RunConfig) -> Any:
    """The main job: all training nodes, --no-kill, --requeue, one batch task on the batch host."""
    return executor(run_dir, cfg, name="tmslurm-main", nodes=num_nodes(cfg.parallel), extra={"requeue": True},
                    srun_args=["--nodes=1", "--ntasks=1"])


def main_sbatch_text(run_dir: Path, cfg: RunConfig) -> str:
    """The sbatch script submitit generates for the main job (run directory shown as RUN_DIR)."""
    ex = main_executor(run_dir, cfg)
    text = ex._executor._make_submission_file_text("python -u -m submitit.core._submit RUN_DIR/submitit", "UID")
    return text.replace(str(Path(run_dir)), "RUN_DIR")


def spare_executor(run_dir: Path, cfg: RunConfig, job_index: int, exclude: list[str]) -> Any:
    """A spare: one node, --no-requeue (a lost spare just ends and is replaced), bad nodes excluded."""
    return executor(run_dir, cfg, name=f"tmslurm-spare{job_index}", nodes=1, extra={"no_requeue": True},
                    exclude=",".join(exclude) if exclude else None)


def spare_sbatch_text(run_dir: Path, cfg: RunConfig, exclude: list[str]) -> str:
    ex = spare_executor(run_dir, cfg, 0, exclude)
    text = ex._executor._make_submission_file_text("python -u -m submitit.core._submit RUN_DIR/submitit", "UID")
    return text.replace(str(Path(run_dir)), "RUN_DIR")


def submit_spare(run_dir: Path, cfg: RunConfig, job_index: int, first_standby: int, exclude: list[str]) -> str:
    ex = spare_executor(run_dir, cfg, job_index, exclude)
    job = ex.submit(spare_main, str(run_dir), first_standby, cfg.parallel.ranks_per_node, wants_monitors(cfg))
    return str(job.job_id)


def spare_main(run_dir: str, first_standby: int, count: int, monitor: bool = True) -> int:
    """Body of a spare job: run ``count`` standby agents (and the node's monitor) until they end."""
    env = dict(os.environ)
    agent = [sys.executable, "-m", "tmslurm.agent.main", "--run-dir", run_dir]
    watcher = [subprocess.Popen([sys.executable, "-m", "tmslurm.slurm.proc.orphan", "--run-dir", run_dir], env=env)] if monitor else []
    procs = [subprocess.Popen([*agent, "--standby", str(first_standby + i)], env=env) for i in range(count)]
    rc = max(p.wait() for p in procs)
    for p in watcher:  # it ends on "finish"; a spare whose standbys all ended needs no monitor either
        p.terminate()
        p.wait()
    return rc
