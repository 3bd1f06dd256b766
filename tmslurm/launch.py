"""``tmslurm-launch``: the Hydra entry point. Plans the run and starts it locally or on Slurm.

Contract: ``tmslurm-launch [--cfg job] [--help] [OVERRIDE ...]`` composes the config from Hydra
overrides (``parallel.dp=2 model=small faults='[{step:10,kind:drain,rank:1}]'``), validates it, and

- ``--cfg job`` prints the resolved config as YAML and exits 0;
- ``cluster=local`` runs the controller here and every rank and standby as a process on this host,
  and exits 0 when the run finished (``<run_dir>/summary.json`` written);
- ``cluster=slurm`` submits the main job and the spares (see :mod:`tmslurm.slurm.submit`).
A bad override prints one ``error:`` line naming the override and exits 2; nothing is started.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from tmslurm.config import RunConfig, compose_config, to_dict
from tmslurm.errors import TmslurmError
from tmslurm.topology import Layout
from tmslurm.runtime.protocol import write_token

log = logging.getLogger(__name__)
USAGE = """usage: tmslurm-launch [--cfg job] [OVERRIDE ...]

Overrides are Hydra's: key=value (parallel.dp=2 parallel.pp=2 standby.count=1 train.steps=50
model=tiny|small cluster=local|slurm runtime.backend=gloo|nccl faults='[{step:10,kind:drain,rank:1}]').
"""


def prepare_run_dir(cfg: RunConfig) -> Path:
    run_dir = Path(cfg.run_dir or f"runs/{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    if (run_dir / "summary.json").exists():
        raise TmslurmError(f"run directory {run_dir} already holds a finished run; pass run_dir=<new dir>")
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(run_dir, 0o700)  # the token, checkpoints and logs inside are the owner's alone
    cfg.run_dir = str(run_dir)
    if cfg.train.resume_from:
        copy_latest_checkpoint(Path(cfg.train.resume_from), run_dir, Layout.from_config(cfg).shard_names)
    (run_dir / "config.json").write_text(json.dumps(to_dict(cfg), indent=1))
    return run_dir


def copy_latest_checkpoint(src: Path, run_dir: Path, shards: int | list[str]) -> int:
    """Copy the newest complete checkpoint of ``src`` into ``run_dir``; returns its step."""
    import shutil

    from tmslurm.train.checkpoint import checkpoint_dir, latest_complete

    step = latest_complete(src, shards)
    if step is None:
        raise TmslurmError(f"train.resume_from={src}: no complete checkpoint there (every stage needs meta.json)")
    if src.resolve() != run_dir.resolve():
        shutil.copytree(checkpoint_dir(src, step), checkpoint_dir(run_dir, step), dirs_exist_ok=True)
    return step


def run_local(cfg: RunConfig) -> dict[str, Any]:
    """Run the whole job on this host; returns the summary."""
    from tmslurm.runtime.controller import Controller
    from tmslurm.runtime.spawner import LocalSpawner

    run_dir = prepare_run_dir(cfg)
    token = write_token(run_dir)
    ctl = Controller(cfg, run_dir, token, lambda c: LocalSpawner(run_dir, cfg))
    addr = ctl.start_servers()
    (run_dir / "controller.json").write_text(json.dumps(addr))
    log.info("run %s: %d ranks (dp=%d pp=%d), %d standby(s); logs in %s/logs", run_dir.name, ctl.world,
             cfg.parallel.dp, cfg.parallel.pp, cfg.standby.count, run_dir)
    try:
        summary = ctl.run()
    finally:
        ctl.spawner.stop_all()
    print_summary(summary, run_dir)
    return summary


def print_summary(summary: dict[str, Any], run_dir: Path) -> None:
    print(f"run {run_dir}: {summary['steps']} steps, loss {summary['loss_first']:.4f} -> {summary['loss_last']:.4f}, "
          f"median step {summary['median_step_s']:.3f}s")
    for ev in summary["events"]:
        down = ev.get("downtime_s")
        print(f"  event {ev['kind']:<12} ranks={ev.get('ranks')} downtime={'?' if down is None else f'{down:.3f}s'}")
    print(f"final_params_sha256 {summary['final_params_sha256']}")


def main(argv: list[str] | None = None) -> int:
    from tmslurm.runtime.agent import setup_logging

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--help" in argv or "-h" in argv:
        print(USAGE)
        return 0
    show = False
    if "--cfg" in argv:
        i = argv.index("--cfg")
        show = True
        del argv[i:i + (2 if i + 1 < len(argv) and argv[i + 1] in ("job", "all") else 1)]
    try:
        cfg = compose_config(argv)
        if show:
            from omegaconf import OmegaConf

            print(OmegaConf.to_yaml(OmegaConf.create(to_dict(cfg))))
            return 0
        setup_logging()
        if cfg.cluster == "local":
            summary = run_local(cfg)
            return 0 if summary["final_params_sha256"] else 1
        from tmslurm.slurm.submit import launch_slurm

        launch_slurm(cfg)
        return 0
    except TmslurmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
