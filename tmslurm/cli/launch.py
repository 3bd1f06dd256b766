"""``tmslurm-launch``: the Hydra entry point. Plans the run and starts it locally or on Slurm.

Contract: ``tmslurm-launch [--cfg job] [--help] [OVERRIDE ...]`` (``--help``: the groups and keys,
:mod:`tmslurm.cli.launch_help`) composes the config from Hydra
overrides (``parallel.dp=2 model=small faults='[{step:10,kind:drain,rank:1}]'``), validates it, and

- ``--cfg job`` prints the resolved config as YAML and exits 0 (the benchmark-only ``bench`` section
  only when one of its keys was changed);
- ``cluster=local`` runs a supervisor here (:mod:`tmslurm.run.supervisor`), which runs the controller
  as a child process (restarting it if it dies) and every rank and standby as a process on this
  host, and exits 0 when the run finished with its final hash (``<run_dir>/summary.json``
  written);
- ``cluster=slurm`` submits the main job and the spares (see :mod:`tmslurm.slurm.proc.job`).
A bad override prints one ``error:`` line naming the override and exits 2; nothing is started.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

from tmslurm.core.config import BENCH_SECTIONS, RunConfig, compose_config, to_dict, world_size
from tmslurm.core.errors import TmslurmError
from tmslurm.core.rundir import RunDir
from tmslurm.run.prepare import prepare_run_dir, warn_unprotected
from tmslurm.wire.protocol import write_token

log = logging.getLogger(__name__)


def shown(cfg: RunConfig) -> dict[str, Any]:
    """The config as ``--cfg job`` prints it: without the benchmark-only sections left at their defaults."""
    data, default = to_dict(cfg), to_dict(RunConfig())
    return {k: v for k, v in data.items() if k not in BENCH_SECTIONS or v != default[k]}


def run_local(cfg: RunConfig) -> dict[str, Any]:
    """Run the whole job on this host under a supervisor (it restarts a controller that dies); the summary."""
    import socket

    from tmslurm.controller.server import open_store
    from tmslurm.controller.spawner import LocalSpawner
    from tmslurm.run.supervisor import Supervisor, log_as_supervisor

    run_dir = prepare_run_dir(cfg)
    write_token(run_dir)
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
    try:
        summary = json.loads(RunDir(run_dir).summary.read_text())
    except (OSError, ValueError):
        raise TmslurmError(
            f"the run ended without a summary (controller status {rc}); see {RunDir(run_dir).events}"
        ) from None
    print_summary(summary, run_dir)
    return summary


def print_summary(summary: dict[str, Any], run_dir: Path) -> None:
    print(
        f"run {run_dir}: {summary['steps']} steps, loss {summary['loss_first']:.4f} -> {summary['loss_last']:.4f}, "
        f"median step {summary['median_step_s']:.3f}s"
    )
    for ev in summary["events"]:
        down = ev.get("downtime_s")
        print(f"  event {ev['kind']:<12} ranks={ev.get('ranks')} downtime={'?' if down is None else f'{down:.3f}s'}")
    print(f"final_params_sha256 {summary['final_params_sha256']}")


def main(argv: list[str] | None = None) -> int:
    from tmslurm.core.logs import setup_logging

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--help" in argv or "-h" in argv:
        from tmslurm.cli.launch_help import usage

        print(usage())
        return 0
    show = False
    if "--cfg" in argv:
        i = argv.index("--cfg")
        show = True
        del argv[i : i + (2 if i + 1 < len(argv) and argv[i + 1] in ("job", "all") else 1)]
    try:
        cfg = compose_config(argv)
        if show:
            from omegaconf import OmegaConf

            print(OmegaConf.to_yaml(OmegaConf.create(shown(cfg))))
            return 0
        setup_logging()
        warn_unprotected(cfg)
        if cfg.cluster == "local":
            summary = run_local(cfg)
            return 0 if summary["final_params_sha256"] else 1
        from tmslurm.slurm.proc.job import launch_slurm

        launch_slurm(cfg)
        return 0
    except TmslurmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
