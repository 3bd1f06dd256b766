"""The controller on Slurm: the supervisor's child in the main job's batch step.

Contract: ``python -m tmslurm.slurm.proc.ctlmain --run-dir D --host H --listen-fd N --store-port P
[--adopt] [--resume-own]`` is started (and restarted) by the supervisor that
:mod:`tmslurm.slurm.proc.job` runs in the main allocation (``SLURM_JOB_ID`` and ``SLURM_JOB_NODELIST``
are inherited). It builds the Slurm spawner, hooks and watcher and serves on the supervisor's
listening socket and store (:mod:`tmslurm.controller.main`). ``--resume-own``: the job was requeued,
so the run resumes from the run directory's latest complete checkpoint (the supervisor decides it
once, for every incarnation). ``--adopt``: a previous controller died; this one takes over what it
launched (rank steps, spare jobs, released nodes) from ``spawner.json``
(:mod:`tmslurm.slurm.spawnstate`) and re-adopts the live agents. It launches and fences those
processes itself, by Slurm's identity (a step, a job), never by a pid. SIGTERM (Slurm preempting,
cancelling or requeueing the job) does not end the controller: a requeue's shutdown completes and
the supervisor does not take it for a death; unless the run is already leaving, it checkpoints at
the next step boundary within the grace time and then waits for Slurm's kill. SIGUSR1 (the time
limit is ``slurm.signal_lead_s`` away; from Slurm to every step's processes, or forwarded by the
supervisor when Slurm signalled only the batch shell) makes the run checkpoint at the next step
boundary and then do ``slurm.on_limit``. Spares are submitted in the main job's own placement
(:mod:`tmslurm.slurm.placement`). Exit statuses are
those of :mod:`tmslurm.controller.main`; an unreadable record or a missing allocation is status 2.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
from typing import Any

from tmslurm.controller.main import begin, build, finish
from tmslurm.controller.state import JobEnd
from tmslurm.core.errors import SlurmError, TmslurmError
from tmslurm.slurm.client import make_client
from tmslurm.slurm.placement import Placement, placement_from_config, placement_of
from tmslurm.slurm.proc.hooks import SlurmHooks
from tmslurm.slurm.proc.spawner import SlurmSpawner, job_nodes
from tmslurm.slurm.spawnstate import read_record
from tmslurm.slurm.watcher import NodeWatch, SlurmWatcher

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # until the controller exists: its default would end us
    start = begin(argv, spawn_fd=False, flags=("--resume-own",))
    if start is None:
        return 2
    signal.signal(signal.SIGTERM, _bypass_sigterm)
    cfg, rd = start.cfg, start.rundir
    try:
        record = read_record(rd.spawner) if start.order else None
        nodes = job_nodes()
        job_id = os.environ["SLURM_JOB_ID"]
    except (TmslurmError, KeyError) as exc:
        log.error("cannot start the controller of %s: %s", rd.path, exc)
        return 2
    if start.args.resume_own:
        cfg.train.resume_from = str(rd.path)
    client = make_client(cfg.slurm.backend)
    spawner = SlurmSpawner(
        rd.path, cfg, client, job_id, nodes, record=record, placement=_placement(client, job_id, cfg)
    )
    watch = NodeWatch({n: "main" for n in spawner.main_nodes})
    ctl, server = build(start, spawner, SlurmHooks(client, spawner, watch, job_id, nodes[0]))
    signal.signal(
        signal.SIGUSR1,
        lambda signum, frame: ctl.job_ending(JobEnd.TIME_LIMIT, "the job's time limit is near (SIGUSR1)"),
    )
    signal.signal(
        signal.SIGTERM,
        lambda signum, frame: ctl.job_ending(
            JobEnd.SIGTERM, "SIGTERM from Slurm: the job is preempted, cancelled or past its time limit"
        ),
    )
    watcher = SlurmWatcher(client, watch, cfg.slurm.poll_interval_s, on_notice=lambda n: _on_slurm_notice(ctl, n))
    if cfg.slurm.watch:
        watcher.start()
    try:
        return finish(ctl, server, start.token)
    finally:
        if cfg.slurm.watch:
            watcher.stop(timeout=5)
        spawner.writer.flush()


def _placement(client: Any, job_id: str, cfg: Any) -> Placement:
    """The main job's own placement (what its spares and its next job inherit); the config's when
    Slurm cannot say."""
    try:
        info = client.job(job_id)
    except SlurmError as exc:
        log.warning("cannot read job %s's placement (%s): spares use slurm.partition/account", job_id, exc)
        info = None
    placement = placement_of(info.raw) if info is not None else placement_from_config(cfg)
    log.info("spares go where the main job runs: %s", placement.describe())
    return placement


def _bypass_sigterm(signum: int, frame: Any) -> None:
    """Slurm sends SIGTERM to every process of the batch step when the job ends (a requeue, a cancel,
    the time limit): the controller finishes what it is doing (a requeue's shutdown: the lane, the
    spare jobs) instead of dying half-way and being restarted; Slurm's SIGKILL follows after KillWait."""
    log.warning("SIGTERM: the job is ending or being requeued; the controller goes on until it is done or killed")


def _on_slurm_notice(ctl: Any, notice: Any) -> None:
    ctl.submit_notice(dataclasses.replace(notice, reason=f"{notice.slurm_state} {notice.reason}".strip()))


if __name__ == "__main__":
    sys.exit(main())
