"""The node monitor on Slurm, and what it does when the controller is lost: requeue the main job.

Contract: ``python -m tmslurm.slurm.proc.orphan --run-dir D`` runs the node's
:class:`~tmslurm.agent.monitor.Monitor` (a step of the main job on each of its nodes; a process of
each spare job). When its link declares the controller lost (connection closed, or silent for
``runtime.controller_lost_s``), a monitor of the main job (``SLURM_JOB_ID`` equal to
``controller.json``'s ``main_job_id``) of a run that has neither finished (``summary.json``) nor
requeued itself (``requeue.json``) makes sure the controller is really gone before it acts, so a
monitor cut off from a live controller never requeues a healthy run:
- the controller's port refuses connections (the process is dead, its host alive): gone;
- it cannot be reached (no answer: the host is silent, or this node is cut off): gone only once
  Slurm itself says the job's batch host is ``NOT_RESPONDING``/``DOWN`` or the job no longer runs
  (polled every 2 s, at most ``max_wait_s``; a controller that answers meanwhile cancels it);
- it answers a ``status`` request: alive, nothing is done.
Then it claims ``controller-lost.json`` with ``O_EXCL`` (one monitor acts per loss), writes there
when, where and why (synced to disk first: the requeue ends this monitor's own step, often before
``scontrol`` returns), runs ``scontrol requeue <main job>`` and, if still alive, adds its result. The job's next
incarnation resumes from the latest complete checkpoint and records the loss as an event (see
:meth:`~tmslurm.controller.restarts.Restarts.resume_after_requeue`). A failing ``scontrol`` is
written in the claim and the monitor's log; nothing here raises.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tmslurm.agent.link import hello, node_name
from tmslurm.agent.monitor import run_monitor
from tmslurm.core.config import from_dict
from tmslurm.core.errors import ProtocolError, SlurmError, TmslurmError
from tmslurm.core.jsonfile import write_json_atomic
from tmslurm.core.logs import LOG_CONTEXT, setup_logging
from tmslurm.core.rundir import RunDir
from tmslurm.slurm.client import SlurmClient, make_client
from tmslurm.wire.messages import StatusRequest
from tmslurm.wire.protocol import Channel, read_token

log = logging.getLogger(__name__)


def requeue_orphaned_job(
    run_dir: Path,
    node: str,
    why: str,
    scontrol: str = "scontrol",
    max_wait_s: float = 900.0,
    client: SlurmClient | None = None,
) -> bool:
    """Requeue the main job whose controller was lost, if this monitor is the one to do it."""
    rd, job = RunDir(run_dir), os.environ.get("SLURM_JOB_ID")
    try:
        main = str(json.loads(rd.controller.read_text()).get("main_job_id"))
    except (OSError, ValueError) as exc:
        log.warning("not requeueing: cannot read %s: %s", rd.controller, exc)
        return False
    if job is None or main != job or rd.summary.exists() or rd.requeue.exists():
        return False
    if not controller_gone(run_dir, job, max_wait_s, client):
        return False
    try:
        fd = os.open(rd.controller_lost, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return False  # another monitor acts
    claim = {"t": time.time(), "node": node, "why": why, "main_job_id": job}
    with os.fdopen(fd, "w") as f:  # before the requeue: it ends this monitor's own step, often before scontrol returns
        json.dump(claim, f)
        f.flush()
        os.fsync(f.fileno())
    try:
        out = subprocess.run([scontrol, "requeue", job], capture_output=True, text=True, timeout=60)
        claim.update(requeue_rc=out.returncode, requeue_output=(out.stdout + out.stderr).strip()[-500:])
    except (OSError, subprocess.TimeoutExpired) as exc:
        claim.update(requeue_rc=None, requeue_output=str(exc)[-500:])
    try:
        write_json_atomic(rd.controller_lost, claim)
    except OSError as exc:
        log.error("cannot add the requeue's result to %s: %s", rd.controller_lost, exc)
    log.warning(
        "the controller of job %s was lost (%s): requeue rc=%s %s",
        job,
        why,
        claim["requeue_rc"],
        claim["requeue_output"],
    )
    return claim["requeue_rc"] == 0


def probe_controller(run_dir: Path, timeout_s: float = 3.0) -> str:
    """``alive`` (it answered a status request), ``refused`` (nothing listens) or ``unreachable``."""
    try:
        addr = json.loads(RunDir(run_dir).controller.read_text())
        sock = socket.create_connection((addr["host"], int(addr["port"])), timeout=timeout_s)
    except ConnectionRefusedError:
        return "refused"
    except (OSError, ValueError, KeyError):
        return "unreachable"
    ch = Channel(sock)
    try:
        sock.settimeout(timeout_s)
        ch.send(StatusRequest(token=read_token(run_dir)))
        reply = ch.recv()
    except (OSError, ProtocolError, TmslurmError):
        reply = None
    finally:
        ch.close()
    return "alive" if isinstance(reply, dict) and reply.get("type") == "status" else "unreachable"


def controller_gone(run_dir: Path, job_id: str, max_wait_s: float, client: SlurmClient | None = None) -> bool:
    """True once the controller is known dead (see the module's contract); False if it is alive or
    Slurm never confirmed its host gone within ``max_wait_s``."""
    deadline = time.monotonic() + max_wait_s
    while True:
        state = probe_controller(run_dir)
        if state != "unreachable":
            log.info("controller probe: %s", state)
            return state == "refused"
        if _batch_host_gone(client or make_client("cli"), job_id):
            return True
        if time.monotonic() > deadline:
            log.error(
                "the controller is unreachable but Slurm still counts its host alive after %.0fs: not requeueing",
                max_wait_s,
            )
            return False
        time.sleep(2.0)


def _batch_host_gone(client: SlurmClient, job_id: str) -> bool:
    try:
        job = client.job(job_id)
        if job is None or job.state != "RUNNING" or not job.batch_host:
            return True
        hosts = client.nodes([job.batch_host])
        if not hosts:
            return True
        (host,) = hosts
    except (SlurmError, ValueError) as exc:  # slurmctld unreachable from here: decide nothing
        log.warning("cannot read job %s from Slurm: %s", job_id, exc)
        return False
    return bool(host.states & {"NOT_RESPONDING", "DOWN"})


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # the job's time limit is near: the controller's business
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # submitit's timeout signal to a spare: renewed by the controller
    ap = argparse.ArgumentParser(prog="tmslurm-monitor")
    ap.add_argument("--run-dir", required=True, type=Path)
    ap.add_argument("--node", default=None)
    args = ap.parse_args(argv)
    setup_logging()
    LOG_CONTEXT.update(run=args.run_dir.name, who="monitor")
    node = node_name(args.node)
    try:
        link, welcome = hello(
            args.run_dir, "monitor", 0, node, on_lost=lambda why: requeue_orphaned_job(args.run_dir, node, why)
        )
    except TmslurmError as exc:
        log.error("%s", exc)
        return 2
    return run_monitor(args.run_dir, link, node, from_dict(welcome.config), welcome.address.host)


if __name__ == "__main__":
    sys.exit(main())
