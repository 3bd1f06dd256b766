"""The main job's batch task: controller, rank steps, spares, Slurm watcher, node give-back.

Contract: ``python -m tmslurm.slurm.job [--run-dir D] [OVERRIDE ...]`` (what
``scripts/tmslurm.sbatch`` runs) or :func:`main_job` (what ``tmslurm-launch cluster=slurm`` submits)
runs inside the main allocation, on its batch host. It starts the controller, one ``--no-kill`` step
per rank, the spare jobs, and a :class:`~tmslurm.slurm.watcher.SlurmWatcher` over the job's and the
spares' nodes whose notices drive planned switches (drain, reboot ASAP, maintenance reservation) and
failures (DOWN, NOT_RESPONDING, FAIL). After a planned switch empties a node, the node is cut out of
the job (``scontrol update jobid=J nodelist=...``) so a draining node becomes DRAINED while training
goes on. A drain of the batch host itself cannot be handled by a switch (the job ends with it): the
run checkpoints, then requeues itself excluding that node, and the requeued job resumes exactly from
that checkpoint. Exit status 0 when the run finished.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from tmslurm.config import RunConfig, compose_config, from_dict, num_nodes
from tmslurm.errors import SlurmError, TmslurmError
from tmslurm.rundir import RunDir
from tmslurm.runtime.protocol import read_token

log = logging.getLogger(__name__)


def _advertise_host(client: Any, node: str) -> str:
    try:
        info = client.nodes([node])
        addr = info[0].raw.get("NodeAddr") if info else None
        return addr or socket.gethostbyname(socket.gethostname())
    except (SlurmError, OSError):
        return "127.0.0.1"


def main_job(run_dir: str) -> dict[str, Any]:
    """Entry of the main job's single batch task (submitted by tmslurm-launch)."""
    from tmslurm.logs import setup_logging

    setup_logging()
    cfg = from_dict(json.loads(RunDir(Path(run_dir)).config.read_text()))
    return run_in_allocation(cfg, Path(run_dir))


def run_in_allocation(cfg: RunConfig, run_dir: Path) -> dict[str, Any]:
    from tmslurm.controller import Controller, ControlServer
    from tmslurm.slurm.client import make_client
    from tmslurm.slurm.hooks import SlurmHooks
    from tmslurm.slurm.spawner import SlurmSpawner, job_nodes
    from tmslurm.slurm.watcher import NodeWatch, SlurmWatcher
    from tmslurm.topology import Layout
    from tmslurm.train.ckpt_index import latest_complete

    job_id = os.environ["SLURM_JOB_ID"]
    nodes = job_nodes()
    client = make_client(cfg.slurm.backend)
    rundir = RunDir(run_dir)
    token = read_token(run_dir)
    if latest_complete(run_dir, Layout.from_config(cfg).shard_names) is not None and not cfg.train.resume_from:
        cfg.train.resume_from = str(run_dir)  # a requeued main job resumes from its own checkpoint
        log.info("resuming from the run directory's latest checkpoint (requeued job)")
    spawner = SlurmSpawner(run_dir, cfg, client, job_id, nodes)
    watch = NodeWatch({n: "main" for n in nodes})
    server = ControlServer.open(_advertise_host(client, nodes[0]))
    ctl = Controller(cfg, run_dir, spawner, SlurmHooks(client, spawner, watch, job_id, nodes[0]), server.address)
    rundir.controller.write_text(json.dumps({**server.address, "main_job_id": job_id, "pid": os.getpid()}))
    watcher = SlurmWatcher(client, watch, cfg.slurm.poll_interval_s, on_notice=lambda n: _on_slurm_notice(ctl, n))
    if cfg.slurm.watch:
        watcher.start()
    try:
        return ctl.run(server, token)
    finally:
        if cfg.slurm.watch:
            watcher.stop(timeout=5)


def _on_slurm_notice(ctl: Any, notice: Any) -> None:
    ctl.submit_notice(dataclasses.replace(notice, reason=f"{notice.slurm_state} {notice.reason}".strip()))


def submit_main(run_dir: Path, cfg: RunConfig) -> str:
    from tmslurm.slurm.submit import main_executor

    ex = main_executor(run_dir, cfg)
    try:
        job = ex.submit(main_job, str(run_dir))
    except Exception as exc:  # submitit raises its own failure types around sbatch
        raise SlurmError(f"sbatch of the main job failed: {exc}") from None
    return str(job.job_id)


def launch_slurm(cfg: RunConfig) -> str:
    from tmslurm.runprep import prepare_run_dir
    from tmslurm.runtime.protocol import write_token

    run_dir = prepare_run_dir(cfg)
    write_token(run_dir)
    job_id = submit_main(run_dir, cfg)
    RunDir(run_dir).jobs.write_text(json.dumps({"main_job_id": job_id, "submitted_t": time.time()}))
    print(f"main job {job_id}: {num_nodes(cfg.parallel)} nodes, dp={cfg.parallel.dp} pp={cfg.parallel.pp}, "
          f"{cfg.standby.count} spare job(s) submitted by the run itself")
    print(f"run directory: {run_dir}")
    print(f"watch it:      tmslurm status {run_dir}")
    return job_id


def main(argv: list[str] | None = None) -> int:
    from tmslurm.runprep import prepare_run_dir, warn_unprotected
    from tmslurm.logs import setup_logging
    from tmslurm.runtime.protocol import write_token

    argv = list(sys.argv[1:] if argv is None else argv)
    setup_logging()
    try:
        if argv[:1] == ["--run-dir"]:
            run_dir = Path(argv[1])
            cfg = from_dict(json.loads(RunDir(run_dir).config.read_text()))
        else:
            cfg = compose_config(["cluster=slurm", *argv])
            warn_unprotected(cfg)
            if not cfg.run_dir:
                cfg.run_dir = f"runs/job{os.environ.get('SLURM_JOB_ID', int(time.time()))}"
            requeued = RunDir(Path(cfg.run_dir)).token.exists()
            run_dir = Path(cfg.run_dir).resolve() if requeued else prepare_run_dir(cfg)
            if not requeued:
                write_token(run_dir)
        summary = run_in_allocation(cfg, run_dir)
        return 0 if summary.get("final_params_sha256") else 1
    except TmslurmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
