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

import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from tmslurm.config import RunConfig, compose_config, from_dict
from tmslurm.errors import SlurmError, TmslurmError

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
    from tmslurm.runtime.agent import setup_logging

    setup_logging()
    cfg = from_dict(json.loads((Path(run_dir) / "config.json").read_text()))
    return run_in_allocation(cfg, Path(run_dir))


def run_in_allocation(cfg: RunConfig, run_dir: Path) -> dict[str, Any]:
    from tmslurm.runtime.controller import Controller
    from tmslurm.slurm.client import make_client
    from tmslurm.slurm.spawner import SlurmSpawner, job_nodes
    from tmslurm.slurm.watcher import NodeWatch, SlurmWatcher
    from tmslurm.topology import Layout
    from tmslurm.train.checkpoint import latest_complete

    job_id = os.environ["SLURM_JOB_ID"]
    nodes = job_nodes()
    client = make_client(cfg.slurm.backend)
    token = (run_dir / "token").read_text().strip()
    if latest_complete(run_dir, Layout.from_config(cfg).shard_names) is not None and not cfg.train.resume_from:
        cfg.train.resume_from = str(run_dir)  # a requeued main job resumes from its own checkpoint
        log.info("resuming from the run directory's latest checkpoint (requeued job)")
    ctl = Controller(cfg, run_dir, token, lambda c: SlurmSpawner(run_dir, cfg, client, job_id, nodes),
                     host=_advertise_host(client, nodes[0]))
    ctl.main_job_id = job_id
    ctl.batch_host = nodes[0]
    addr = ctl.start_servers()
    (run_dir / "controller.json").write_text(json.dumps({**addr, "main_job_id": job_id}))
    watch = NodeWatch({n: "main" for n in nodes})
    watcher = SlurmWatcher(client, watch, cfg.slurm.poll_interval_s, on_notice=lambda n: _on_slurm_notice(ctl, n))
    ctl.on_step.append(lambda step: _refresh(ctl, watch))
    ctl.on_switched.append(lambda plan: _release_nodes(ctl, plan))
    ctl.inject_fault = lambda fault: _inject(ctl, client, fault)
    ctl.notice_filter = lambda notice: _notice_filter(ctl, notice)
    ctl.requeue_hook = lambda exclude: _requeue(job_id, exclude)
    if cfg.slurm.watch:
        watcher.start()
    try:
        return ctl.run()
    finally:
        if cfg.slurm.watch:
            watcher.stop(timeout=5)


def _refresh(ctl: Any, watch: Any) -> None:
    ctl.spare_job_ids = ctl.spawner.spare_job_ids()
    if ctl.step % 20 == 0:  # a blocking scontrol per unknown spare: not on every step
        ctl.spawner.note_spare_node("")
    watch.set_nodes(ctl.nodes())


def _requeue(job_id: str, exclude: list[str]) -> None:
    """Requeue our own job (Slurm kills this batch task), then keep it off ``exclude``."""
    import subprocess

    for cmd in (["scontrol", "requeue", job_id],
                *([["scontrol", "update", f"jobid={job_id}", f"ExcNodeList={','.join(exclude)}"]] if exclude else [])):
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        except (subprocess.TimeoutExpired, OSError) as exc:
            log.error("%s failed: %s", " ".join(cmd), exc)
            continue
        if r.returncode != 0:
            log.error("%s failed: %s", " ".join(cmd), r.stderr.strip())


def _notice_filter(ctl: Any, notice: dict[str, Any]) -> bool:
    """Runs on the controller thread for every notice (watcher, admin, strigger): remember bad nodes
    so new spares avoid them; divert a maintenance of the batch host to checkpoint + requeue."""
    node = notice.get("node")
    if node:
        ctl.spawner.bad_nodes.add(node)
    if node and node == ctl.batch_host and notice["kind"] == "maintenance":
        ctl.checkpoint_and_requeue(node, notice.get("reason", ""))
        return True
    return False


def _on_slurm_notice(ctl: Any, notice: Any) -> None:
    ctl.submit_notice({"kind": notice.kind, "node": notice.node, "source": "slurm", "deadline": notice.deadline,
                       "reason": f"{notice.slurm_state} {notice.reason}".strip(), "t": notice.time})


def _release_nodes(ctl: Any, plan: Any) -> None:
    """After a switch, give back every node of the job left without ranks (never the batch host)."""
    for node in {n for n in str(plan.info.get("event", {}).get("node", "")).split(",") if n}:
        if ctl.ranks_of_node(node) or node == ctl.batch_host:
            continue
        if ctl.spawner.release_node(node):
            ctl.journal.write("node_released", node=node, job=ctl.main_job_id)
            log.info("node %s released from job %s", node, ctl.main_job_id)


def _inject(ctl: Any, client: Any, fault: dict[str, Any]) -> None:
    """Faults on Slurm go through Slurm: drain -> scontrol drain; node_down -> scontrol down."""
    node = ctl.spawner.node_of_rank(fault["rank"])
    state = "drain" if fault["kind"] == "drain" else "down"
    try:
        client.update_node(node, state, reason=f"tmslurm-fault-{fault['kind']}")
        ctl.journal.write("fault", kind=fault["kind"], rank=fault["rank"], node=node, via="scontrol")
    except SlurmError as exc:
        log.error("cannot inject %s on %s: %s", fault["kind"], node, exc)


def main(argv: list[str] | None = None) -> int:
    from tmslurm.launch import prepare_run_dir
    from tmslurm.runtime.agent import setup_logging
    from tmslurm.runtime.protocol import write_token

    argv = list(sys.argv[1:] if argv is None else argv)
    setup_logging()
    try:
        if argv[:1] == ["--run-dir"]:
            run_dir = Path(argv[1])
            cfg = from_dict(json.loads((run_dir / "config.json").read_text()))
        else:
            cfg = compose_config(["cluster=slurm", *argv])
            if not cfg.run_dir:
                cfg.run_dir = f"runs/job{os.environ.get('SLURM_JOB_ID', int(time.time()))}"
            requeued = Path(cfg.run_dir, "token").exists()
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
