"""The main job's batch task: controller, rank steps, spares, Slurm watcher, node give-back.

Contract: ``python -m tmslurm.slurm.proc.job [--run-dir D] [OVERRIDE ...]`` (what
``scripts/tmslurm.sbatch`` runs) or :func:`main_job` (what ``tmslurm-launch cluster=slurm`` submits)
runs inside the main allocation, on its batch host. It runs the supervisor
(:class:`~tmslurm.run.supervisor.Supervisor`: it holds the control socket and the rendezvous store and
restarts a controller that dies, up to ``runtime.controller_restarts`` times), whose child
controller (:mod:`tmslurm.slurm.proc.ctlmain`) starts one ``--no-kill`` step per rank, the spare jobs,
and a :class:`~tmslurm.slurm.watcher.SlurmWatcher` over the job's and the spares' nodes whose notices drive planned
switches (drain, reboot ASAP, maintenance reservation) and failures (DOWN, NOT_RESPONDING, FAIL). After a planned switch
empties a node, the node is cut out of the job (``scontrol update jobid=J nodelist=...``) so a draining node becomes
DRAINED while training goes on. A drain of the batch host itself cannot be handled by a switch (the job ends with it):
the run checkpoints, then requeues itself excluding that node, and the requeued job resumes exactly from that
checkpoint. Exit status 0 when the run finished.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tmslurm.core.config import RunConfig, compose_config, from_dict, num_nodes
from tmslurm.core.errors import SlurmError, TmslurmError
from tmslurm.core.rundir import RunDir

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
    from tmslurm.core.logs import setup_logging

    setup_logging()
    cfg = from_dict(json.loads(RunDir(Path(run_dir)).config.read_text()))
    return run_in_allocation(cfg, Path(run_dir))


def run_in_allocation(cfg: RunConfig, run_dir: Path) -> dict[str, Any]:
    """Run the supervisor here (the batch host) until the run ends; the summary (``failed`` and no
    final hash when the run ended without one)."""
    from tmslurm.controller.server import open_store
    from tmslurm.core.topology import Layout
    from tmslurm.run.supervisor import Child, Supervisor
    from tmslurm.slurm.client import make_client
    from tmslurm.slurm.proc.spawner import job_nodes
    from tmslurm.slurm.spawnstate import SlurmOwner
    from tmslurm.train.ckpt_index import latest_complete

    job_id = os.environ["SLURM_JOB_ID"]
    nodes = job_nodes()
    rundir = RunDir(run_dir)
    resume = latest_complete(run_dir, Layout.from_config(cfg).shard_names) is not None and not cfg.train.resume_from
    if resume:  # a requeued main job resumes from its own checkpoint
        log.info("resuming from the run directory's latest checkpoint (requeued job)")
    rundir.spawner.unlink(missing_ok=True)  # a previous job incarnation's steps are gone with it
    host = _advertise_host(make_client(cfg.slurm.backend), nodes[0])
    child = Child(
        module="tmslurm.slurm.proc.ctlmain",
        pipe=False,
        args=("--resume-own",) if resume else (),
        advert={"main_job_id": job_id},
    )
    sup = Supervisor(
        cfg, run_dir, SlurmOwner(rundir.spawner), socket.create_server((host, 0)), open_store(host), host, child
    )
    # SIGUSR1: the time limit is near. Slurm sends it to this process (the batch shell, --signal=B:)
    # or to every step's processes (--signal=, through submitit): either way the controller gets it.
    signal.signal(signal.SIGUSR1, lambda signum, frame: sup.forward(signum))
    # SIGTERM: preempted, cancelled or past the limit. Slurm signals every process of the job, but
    # this one may be the batch shell alone (sbatch scripts/tmslurm.sbatch): pass it on, never die of it.
    signal.signal(signal.SIGTERM, lambda signum, frame: sup.forward(signum))
    _label(job_id, run_dir)
    rc = sup.run()
    _await_slurm_end(rundir)
    try:
        return json.loads(rundir.summary.read_text())
    except (OSError, ValueError):
        return {"failed": f"the controller ended with status {rc} and wrote no summary", "final_params_sha256": None}


def _await_slurm_end(rundir: RunDir, limit_s: float = 600.0) -> None:
    """After a SIGTERM the run checkpointed and stopped (``requeue.json`` of kind ``job_end_sigterm``):
    Slurm is preempting (it requeues the job itself) or cancelling it. Ending the batch step now could
    complete the job instead, so wait for Slurm's kill (at most ``limit_s``)."""
    try:
        kind = json.loads(rundir.requeue.read_text()).get("kind")
    except (OSError, ValueError):
        return
    if kind != "job_end_sigterm":
        return
    log.warning("checkpoint complete; waiting for Slurm to requeue or end the job")
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        time.sleep(1.0)


def _label(job_id: str, run_dir: Path) -> None:
    """Give a main job submitted by hand (sbatch scripts/tmslurm.sbatch) the run's comment, as the
    spares have it; best effort (a job submitted by tmslurm-launch has it already)."""
    from tmslurm.slurm.runtag import run_comment

    try:
        subprocess.run(
            ["scontrol", "update", f"jobid={job_id}", f"comment={run_comment(run_dir)}"],
            capture_output=True,
            timeout=15,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("cannot set job %s's comment: %s", job_id, exc)


def submit_main(run_dir: Path, cfg: RunConfig, *, after: str | None = None, placement: Any = None) -> str:
    """Submit the main job (``after``: the job of this run it must wait for, a resubmission)."""
    from tmslurm.slurm.submit import main_executor

    ex = main_executor(run_dir, cfg, placement, after)
    try:
        job = ex.submit(main_job, str(run_dir))
    except Exception as exc:  # submitit raises its own failure types around sbatch
        raise SlurmError(f"sbatch of the main job failed: {exc}") from None
    return str(job.job_id)


def submit_next(run_dir: Path, cfg: RunConfig, *, after: str, placement: Any) -> str:
    """The run's next job (``slurm.on_limit=resubmit``): same run directory, same placement; it
    starts once job ``after`` has ended (``afterany``, not ``singleton``: the job name
    ``tmslurm-main`` is shared by every run of a user, and singleton would wait for all of them)."""
    job_id = submit_main(run_dir, cfg, after=after, placement=placement)
    jobs = RunDir(run_dir).jobs
    try:
        data = json.loads(jobs.read_text())
    except (OSError, ValueError):
        data = {}
    chain = [*data.get("chain", [data["main_job_id"]] if "main_job_id" in data else [after]), job_id]
    jobs.write_text(json.dumps({**data, "main_job_id": job_id, "chain": chain, "submitted_t": time.time()}))
    return job_id


def launch_slurm(cfg: RunConfig) -> str:
    from tmslurm.run.prepare import prepare_run_dir
    from tmslurm.wire.protocol import write_token

    if shutil.which("sbatch") is None:  # refused before the run directory is written
        raise SlurmError(
            "cluster=slurm needs Slurm's sbatch on PATH. Fix: launch from a Slurm login node, or pass cluster=local."
        )
    run_dir = prepare_run_dir(cfg)
    write_token(run_dir)
    job_id = submit_main(run_dir, cfg)
    RunDir(run_dir).jobs.write_text(json.dumps({"main_job_id": job_id, "submitted_t": time.time()}))
    print(
        f"main job {job_id}: {num_nodes(cfg.parallel)} nodes, dp={cfg.parallel.dp} pp={cfg.parallel.pp}, "
        f"{cfg.standby.count} spare job(s) submitted by the run itself"
    )
    print(f"run directory: {run_dir}")
    print(f"watch it:      tmslurm status {run_dir}")
    return job_id


def main(argv: list[str] | None = None) -> int:
    from tmslurm.core.logs import setup_logging
    from tmslurm.run.prepare import prepare_run_dir, warn_unprotected
    from tmslurm.slurm.allocation import check_allocation
    from tmslurm.wire.protocol import write_token

    argv = list(sys.argv[1:] if argv is None else argv)
    setup_logging()
    try:
        if argv[:1] == ["--run-dir"]:
            run_dir = Path(argv[1])
            cfg = from_dict(json.loads(RunDir(run_dir).config.read_text()))
        else:
            cfg = compose_config(["cluster=slurm", *argv])
            check_allocation(cfg)  # before the run directory: too few nodes for the layout
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
