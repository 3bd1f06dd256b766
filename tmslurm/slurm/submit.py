"""Submission with submitit: the main training job and the spare allocations.

Contract: :func:`executor` builds a submitit ``AutoExecutor`` for this run (folder
``<run_dir>/submitit``, time from ``slurm.time``, where it runs from a :class:`Placement`, extra
sbatch arguments from ``slurm.extra_args``, ``--comment='tmslurm run=<name> dir=<run dir>'`` on every job,
:func:`tmslurm.slurm.runtag.run_comment`).
:func:`main_executor` makes the main job: one multi-node job with ``--no-kill`` (a lost node shrinks
it instead of killing it), ``--requeue`` and ``--signal=USR1@slurm.signal_lead_s`` (submitted by
:func:`tmslurm.slurm.proc.job.launch_slurm`, and again by a run that resubmits itself at its time
limit). :func:`submit_spare` submits one spare job, in the main job's placement plus
``slurm.spare_args``, whose body (:func:`spare_main`) runs ``ranks_per_node`` standby agents. A
submission failure raises SlurmError (sbatch's message).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from submitit.core.utils import FailedJobError

from tmslurm.core.config import RunConfig, num_nodes, wants_monitors
from tmslurm.core.config.slurmtime import RENEW_S, time_minutes
from tmslurm.core.config.slurmtime import spare_minutes as _spare_minutes
from tmslurm.core.errors import SlurmError
from tmslurm.slurm.placement import Placement, placement_from_config
from tmslurm.slurm.runtag import run_comment

log = logging.getLogger(__name__)


def _extra_args(args: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for arg in args:
        key, _, value = arg.lstrip("-").partition("=")
        out[key.replace("-", "_")] = value if value else True
    return out


def executor(
    run_dir: Path,
    cfg: RunConfig,
    *,
    name: str,
    nodes: int,
    placement: Placement,
    extra: dict[str, Any] | None = None,
    exclude: str | None = None,
    srun_args: list[str] | None = None,
    setup: list[str] | None = None,
    minutes: int | None = None,
) -> Any:
    """A submitit executor. Parameters, later ones winning: --no-kill --exclusive, the placement,
    ``slurm.extra_args``, ``extra``."""
    import submitit

    ex = submitit.AutoExecutor(folder=str(Path(run_dir) / "submitit"), cluster="slurm")
    params: dict[str, Any] = {
        "no_kill": True,
        "exclusive": True,
        "comment": run_comment(run_dir),
        **placement.sbatch_params(),
        **_extra_args(cfg.slurm.extra_args),
        **(extra or {}),
    }
    minutes = time_minutes(cfg.slurm.time) if minutes is None else minutes
    kwargs: dict[str, Any] = dict(
        name=name,
        timeout_min=minutes,
        slurm_partition=placement.partition,
        nodes=nodes,
        tasks_per_node=1,
        slurm_additional_parameters=params,
    )
    if exclude:
        kwargs["slurm_exclude"] = exclude
    if srun_args:
        kwargs["slurm_srun_args"] = srun_args
    if setup:
        kwargs["slurm_setup"] = setup
    ex.update_parameters(**kwargs)
    return ex


BATCH_SHELL_KEEPS_TERM = "trap '' TERM  # a preemption signals this shell too: it must outlive the run's checkpoint"
"""First line of the main job's batch script: Slurm sends SIGTERM to every process of a preempted or
cancelled job, this shell included, which would die of it and end the job at once; the run inside
(the srun step) checkpoints within the grace time instead."""


def main_executor(run_dir: Path, cfg: RunConfig, placement: Placement | None = None, after: str | None = None) -> Any:
    """The main job: all training nodes, --no-kill, --requeue, one batch task on the batch host, and
    SIGUSR1 ``slurm.signal_lead_s`` before its time limit (to every step's processes; this replaces
    submitit's own USR2 signal, whose handler would end a job it cannot checkpoint). ``after``: a
    job of the same run this one must wait for (a resubmission, ``--dependency=afterany``)."""
    spare_minutes(cfg)  # a spare that could not be renewed is refused before anything is submitted
    extra: dict[str, Any] = {"requeue": True, "signal": f"USR1@{cfg.slurm.signal_lead_s}"}
    if after is not None:
        extra["dependency"] = f"afterany:{after}"
    return executor(
        run_dir,
        cfg,
        name="tmslurm-main",
        nodes=num_nodes(cfg.parallel),
        extra=extra,
        placement=placement or placement_from_config(cfg),
        srun_args=["--nodes=1", "--ntasks=1"],
        setup=[BATCH_SHELL_KEEPS_TERM],
    )


def main_sbatch_text(run_dir: Path, cfg: RunConfig, after: str | None = None) -> str:
    """The sbatch script submitit generates for the main job (run directory shown as RUN_DIR)."""
    ex = main_executor(run_dir, cfg, after=after)
    text = ex._executor._make_submission_file_text("python -u -m submitit.core._submit RUN_DIR/submitit", "UID")
    return text.replace(str(Path(run_dir)), "RUN_DIR")


def spare_minutes(cfg: RunConfig) -> int:
    """A spare's time limit in minutes (:func:`tmslurm.core.config.slurmtime.spare_minutes`)."""
    return _spare_minutes(cfg.slurm)


def spare_renew_lead(cfg: RunConfig) -> int | None:
    """Seconds before a spare's time limit at which it is renewed; None: spares are not renewed (no
    slurm.spare_renew_s and a limit under 2 x :data:`RENEW_S`)."""
    if cfg.slurm.spare_renew_s is not None:
        return cfg.slurm.spare_renew_s
    return RENEW_S if spare_minutes(cfg) * 60 >= 2 * RENEW_S else None


def spare_executor(
    run_dir: Path, cfg: RunConfig, job_index: int, exclude: list[str], placement: Placement | None = None
) -> Any:
    """A spare: one node, ``slurm.spare_time`` (else ``slurm.time``), --no-requeue (a lost spare just
    ends and is replaced), bad nodes excluded, the main job's placement, then ``slurm.spare_args``."""
    return executor(
        run_dir,
        cfg,
        name=f"tmslurm-spare{job_index}",
        nodes=1,
        minutes=spare_minutes(cfg),
        extra={"no_requeue": True, **_extra_args(cfg.slurm.spare_args)},
        placement=placement or placement_from_config(cfg),
        exclude=",".join(exclude) if exclude else None,
    )


def spare_sbatch_text(run_dir: Path, cfg: RunConfig, exclude: list[str], placement: Placement | None = None) -> str:
    ex = spare_executor(run_dir, cfg, 0, exclude, placement)
    text = ex._executor._make_submission_file_text("python -u -m submitit.core._submit RUN_DIR/submitit", "UID")
    return text.replace(str(Path(run_dir)), "RUN_DIR")


def submit_spare(
    run_dir: Path,
    cfg: RunConfig,
    job_index: int,
    first_standby: int,
    exclude: list[str],
    placement: Placement | None = None,
) -> str:
    """Submit spare job ``job_index``; its id. :class:`SlurmError` when sbatch fails (the job may still
    exist: slurmctld can accept a request whose sbatch already gave up; without its submitit
    pickle such a job ends by itself within a minute)."""
    ex = spare_executor(run_dir, cfg, job_index, exclude, placement)
    try:
        job = ex.submit(spare_main, str(run_dir), first_standby, cfg.parallel.ranks_per_node, wants_monitors(cfg))
    except (FailedJobError, subprocess.SubprocessError, OSError) as exc:
        raise SlurmError(f"sbatch of spare job {job_index} failed: {str(exc).strip()[-300:]}") from exc
    return str(job.job_id)


def spare_main(run_dir: str, first_standby: int, count: int, monitor: bool = True) -> int:
    """Body of a spare job: run ``count`` standby agents (and the node's monitor) until they end.

    submitit's handler of its timeout signal (SIGUSR2, 90 s before the time limit) would end a spare
    it cannot checkpoint: it is ignored here (this runs in submitit's main thread), as in the agents;
    the controller renews a spare ``slurm.spare_renew_s`` before its end."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    env = dict(os.environ)
    agent = [sys.executable, "-m", "tmslurm.agent.main", "--run-dir", run_dir]
    watcher = (
        [subprocess.Popen([sys.executable, "-m", "tmslurm.slurm.proc.orphan", "--run-dir", run_dir], env=env)]
        if monitor
        else []
    )
    procs = [subprocess.Popen([*agent, "--standby", str(first_standby + i)], env=env) for i in range(count)]
    rc = max(p.wait() for p in procs)
    for p in watcher:  # it ends on "finish"; a spare whose standbys all ended needs no monitor either
        p.terminate()
        p.wait()
    return rc
