"""Submission with submitit: the main training job and the spare allocations.

Contract: :func:`executor` builds a submitit ``AutoExecutor`` for this run (folder
``<run_dir>/submitit``, partition, time, account and extra sbatch arguments from ``slurm.*``).
:func:`launch_slurm` (``tmslurm-launch cluster=slurm``) writes the run directory and submits the
main job: one multi-node job with ``--no-kill`` (a lost node shrinks it instead of killing it) and
``--requeue``, whose single batch task runs :func:`tmslurm.slurm.job.main_job` on the batch host;
that task starts every rank as its own ``--no-kill`` step and submits the spares. It prints the job
id and the ``tmslurm status`` command. A submission failure raises SlurmError (sbatch's message).
"""

from __future__ import annotations

import json
import math
import logging
import time
from pathlib import Path
from typing import Any

from tmslurm.config import RunConfig, num_nodes
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


def submit_main(run_dir: Path, cfg: RunConfig) -> str:
    from tmslurm.slurm.job import main_job

    ex = main_executor(run_dir, cfg)
    try:
        job = ex.submit(main_job, str(run_dir))
    except Exception as exc:  # submitit raises its own failure types around sbatch
        raise SlurmError(f"sbatch of the main job failed: {exc}") from None
    return str(job.job_id)


def launch_slurm(cfg: RunConfig) -> str:
    from tmslurm.launch import prepare_run_dir
    from tmslurm.runtime.protocol import write_token

    run_dir = prepare_run_dir(cfg)
    write_token(run_dir)
    job_id = submit_main(run_dir, cfg)
    (run_dir / "jobs.json").write_text(json.dumps({"main_job_id": job_id, "submitted_t": time.time()}))
    print(f"main job {job_id}: {num_nodes(cfg.parallel)} nodes, dp={cfg.parallel.dp} pp={cfg.parallel.pp}, "
          f"{cfg.standby.count} spare job(s) submitted by the run itself")
    print(f"run directory: {run_dir}")
    print(f"watch it:      tmslurm status {run_dir}")
    return job_id
