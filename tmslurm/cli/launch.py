"""``tmslurm-launch``: the Hydra entry point. Plans the run and starts it locally or on Slurm.

Contract: ``tmslurm-launch [--cfg job | --check] [--help] [OVERRIDE ...]`` (``--help``: the groups and keys,
:mod:`tmslurm.cli.launch_help`) composes the config from Hydra
overrides (``parallel.dp=2 model=small faults='[{step:10,kind:drain,rank:1}]'``), validates it, and

- ``--cfg job`` prints the resolved config as YAML and exits 0 (the benchmark-only ``bench`` section
  only when one of its keys was changed);
- ``cluster=local`` runs a supervisor here (:mod:`tmslurm.run.supervisor`), which runs the controller
  as a child process (restarting it if it dies) and every rank and standby as a process on this
  host, and exits 0 when the run finished with its final hash (``<run_dir>/summary.json``
  written);
- ``cluster=slurm`` submits the main job and the spares (see :mod:`tmslurm.slurm.proc.job`).
- ``--check`` validates and exits 0 (one ``config ok`` line), writing nothing: the config, the run
  directory to be (:func:`~tmslurm.run.prepare.check_run_dir`) and, inside a Slurm job, its node
  count against the layout (:func:`~tmslurm.slurm.allocation.check_allocation`); what
  ``scripts/tmslurm.sbatch`` runs first.
A bad override prints one ``error:`` line naming the override and exits 2; nothing is started, and
every refusal comes before the run directory is created or anything is submitted.
``tmslurm-launch --prepared RUN_DIR`` runs a ``cluster=local`` run whose directory
:func:`~tmslurm.run.prepare.prepare_run_dir` already wrote (``config.json`` and the token), as
:func:`tmslurm.launch` does in a child process; it exits as above.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from tmslurm.cli.guard import guarded
from tmslurm.core.config import BENCH_SECTIONS, RunConfig, compose_config, from_dict, num_nodes, to_dict, world_size
from tmslurm.core.errors import TmslurmError
from tmslurm.core.results import Summary, load_summary
from tmslurm.core.rundir import RunDir
from tmslurm.run.prepare import prepare_run_dir, warn_unprotected
from tmslurm.wire.protocol import write_token

log = logging.getLogger(__name__)


def shown(cfg: RunConfig) -> dict[str, Any]:
    """The config as ``--cfg job`` prints it: without the benchmark-only sections left at their defaults."""
    data, default = to_dict(cfg), to_dict(RunConfig())
    return {k: v for k, v in data.items() if k not in BENCH_SECTIONS or v != default[k]}


def run_local(cfg: RunConfig) -> Summary:
    """Run the whole job on this host under a supervisor (it restarts a controller that dies); the summary."""
    return supervise_local(cfg, prepare_local(cfg))


def prepare_local(cfg: RunConfig) -> Path:
    """The run directory of a local run, written (config and token) and ready for :func:`supervise_local`."""
    run_dir = prepare_run_dir(cfg)
    write_token(run_dir)
    return run_dir


def supervise_local(cfg: RunConfig, run_dir: Path) -> Summary:
    """Run the prepared ``run_dir`` on this host under a supervisor; the summary."""
    import socket

    from tmslurm.controller.server import open_store
    from tmslurm.controller.spawner import LocalSpawner
    from tmslurm.run.supervisor import Supervisor, log_as_supervisor

    host = "127.0.0.1"
    sup = Supervisor(cfg, run_dir, LocalSpawner(run_dir, cfg), socket.create_server((host, 0)), open_store(host), host)
    log_as_supervisor(RunDir(run_dir))
    log.info(
        "run %s: %d ranks (dp=%d pp=%d tp=%d), %d standby(s); logs in %s/logs",
        run_dir.name,
        world_size(cfg.parallel),
        cfg.parallel.dp,
        cfg.parallel.pp,
        cfg.parallel.tp,
        cfg.standby.count,
        run_dir,
    )
    rc = sup.run()
    if not RunDir(run_dir).summary.is_file():
        raise TmslurmError(f"the run ended without a summary (controller status {rc}); see {RunDir(run_dir).events}")
    summary = load_summary(RunDir(run_dir).summary)
    print_summary(summary, run_dir)
    return summary


def print_summary(summary: Summary, run_dir: Path) -> None:
    num = lambda v: "?" if v is None else f"{v:.4f}"  # noqa: E731
    print(
        f"run {run_dir}: {summary.steps} steps, loss {num(summary.loss_first)} -> {num(summary.loss_last)}, "
        f"median step {num(summary.median_step_s)}s"
    )
    for ev in summary.events:
        down = "?" if ev.downtime_s is None else f"{ev.downtime_s:.3f}s"
        print(f"  event {ev.kind:<12} ranks={ev.ranks} downtime={down}")
    print(f"final_params_sha256 {summary.final_params_sha256}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--help" in argv or "-h" in argv:
        return guarded(_help)
    if argv[:1] == ["--check"]:
        return guarded(lambda: check(argv[1:]))
    if argv[:1] == ["--prepared"] and len(argv) == 2:
        return guarded(lambda: _run_prepared(Path(argv[1])))
    show = False
    if "--cfg" in argv:
        i = argv.index("--cfg")
        show = True
        del argv[i : i + (2 if i + 1 < len(argv) and argv[i + 1] in ("job", "all") else 1)]
    return guarded(lambda: _launch(argv, show))


def _help() -> int:
    from tmslurm.cli.launch_help import usage

    print(usage())
    return 0


def check(overrides: list[str]) -> int:
    """``--check``: compose and validate the config, and check what :func:`_launch` would refuse
    before it writes the run directory (a finished run there, a resume_from without a checkpoint)
    and, inside a Slurm job, the allocation's nodes against the layout; nothing is written."""
    from tmslurm.run.prepare import check_run_dir, run_dir_of

    cfg = compose_config(overrides)
    check_run_dir(cfg, run_dir_of(cfg))
    where = ""
    if cfg.cluster == "slurm":
        from tmslurm.slurm.allocation import check_allocation

        have = check_allocation(cfg)
        where = "" if have is None else f" (this job has {have} node(s))"
    p = cfg.parallel
    print(f"config ok: {world_size(p)} ranks on {num_nodes(p)} node(s){where}, cluster={cfg.cluster}")
    return 0


def _launch(argv: list[str], show: bool) -> int:
    from tmslurm.core.logs import setup_logging

    cfg = compose_config(argv)
    if show:
        from omegaconf import OmegaConf

        print(OmegaConf.to_yaml(OmegaConf.create(shown(cfg))))
        return 0
    setup_logging()
    warn_unprotected(cfg)
    if cfg.cluster == "local":
        summary = run_local(cfg)
        return 0 if summary.final_params_sha256 else 1
    from tmslurm.slurm.proc.job import launch_slurm

    launch_slurm(cfg)
    return 0


def _run_prepared(run_dir: Path) -> int:
    from tmslurm.core.jsonfile import read_json_object
    from tmslurm.core.logs import setup_logging

    setup_logging()
    cfg = from_dict(read_json_object(RunDir(run_dir).config, "run config"))
    summary = supervise_local(cfg, run_dir)
    return 0 if summary.final_params_sha256 else 1


if __name__ == "__main__":
    sys.exit(main())
