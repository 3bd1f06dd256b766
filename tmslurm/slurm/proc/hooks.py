"""The Slurm side of :class:`~tmslurm.controller.hooks.ClusterHooks`: spares, node give-back, batch host.

Contract (called on the controller's thread, and none of them waits on Slurm: every command runs on
the spawner's :class:`~tmslurm.slurm.lane.Lane`; Slurm command failures are logged, never raised):
- :meth:`SlurmHooks.on_step` refreshes the watcher's node set at most every
  :data:`NODES_REFRESH_S` (building it walks every agent: at thousands of ranks and fast steps,
  once per step was work growing with N; the watcher polls far less often) and, every 20 steps,
  the spare jobs' nodes (one ``scontrol`` per unknown spare, on the lane);
- :meth:`release_nodes` cuts each node a switch emptied out of the main job (never the batch host),
  so a draining node becomes DRAINED while training goes on; ``released(node)`` comes from the lane;
- :meth:`inject_fault` raises an injected ``drain`` / ``node_down`` through ``scontrol`` (the
  watcher then sees it like a real one), and ``power_off`` / ``partition`` through the failure lab
  (:mod:`tmslurm.slurm.lab`, in a thread of its own);
- :meth:`is_batch_host` remembers every noticed node as bad (new spares avoid it until it is
  healthy) and says whether it is the batch host;
- :meth:`requeue` requeues the main job (Slurm ends this batch task), excluding nodes;
  :meth:`resubmit` submits the next job instead (``--dependency=afterany:<this job>``);
- :meth:`flush` (after the loop ended) waits for the lane, so a requeue is sent before exiting.
"""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from tmslurm.core.errors import SlurmError
from tmslurm.slurm.client import SlurmClient
from tmslurm.slurm.lab import LAB_FAULTS, inject_lab_fault
from tmslurm.slurm.proc.spawner import SlurmSpawner
from tmslurm.slurm.watcher import NodeWatch
from tmslurm.wire.messages import FaultSpec

log = logging.getLogger(__name__)
NODES_REFRESH_S = 0.25
"""The watcher's node set is rebuilt at most this often (a poll is every ``slurm.poll_interval_s``)."""
WAITING_POLL_S = 1.0
"""While restarted ranks wait for a spare allocation, look for started spare jobs this often."""


class SlurmHooks:
    def __init__(
        self, client: SlurmClient, spawner: SlurmSpawner, watch: NodeWatch, job_id: str, batch_host: str
    ) -> None:
        self.client = client
        self.spawner = spawner
        self.watch = watch
        self.job_id = job_id
        self.batch_host = batch_host
        self.nodes_refreshed_m = float("-inf")
        """When the watcher's node set was last rebuilt (monotonic)."""
        self.spares_polled_m = float("-inf")
        """When spare jobs were last looked at for ranks waiting to restart (monotonic)."""

    def on_step(self, step: int, nodes: Callable[[], dict[str, str]]) -> None:
        if step % 20 == 0:
            self.spawner.note_spare_node("")
        now = time.monotonic()
        if now - self.nodes_refreshed_m >= NODES_REFRESH_S:
            self.nodes_refreshed_m = now
            self.watch.set_nodes(nodes())

    def check_spares(self) -> None:
        self.spawner.note_spare_node("")  # on the Slurm lane: returns at once

    def release_nodes(self, nodes: list[str], released: Callable[[str], None]) -> None:
        for node in nodes:
            if node != self.batch_host:
                self.spawner.release_node(node, released)

    def inject_fault(self, fault: FaultSpec, fired: Callable[[float, list[str]], None]) -> bool:
        nodes = list(dict.fromkeys(self.spawner.node_of_rank(r) for r in fault.ranks))
        if fault.kind in LAB_FAULTS:
            inject_lab_fault(self.spawner.cfg, fault.kind, nodes, fault.amount, fired)
            return True
        for node in nodes:
            self.spawner.lane.submit(partial(self._update_node, node, fault.kind), f"inject-{fault.kind}")
        return True

    def _update_node(self, node: str, kind: str) -> None:
        try:
            self.client.update_node(node, "drain" if kind == "drain" else "down", reason=f"tmslurm-fault-{kind}")
            log.info("fault %s injected on %s through scontrol", kind, node)
        except SlurmError as exc:
            log.error("cannot inject %s on %s: %s", kind, node, exc)

    def is_batch_host(self, node: str | None) -> bool:
        if node:
            self.spawner.add_bad_node(node)
        return bool(node) and node == self.batch_host

    def node_lost(self, node: str) -> None:
        self.spawner.add_bad_node(node, confirmed=False)

    def expiring_standbys(self, now: float) -> list[int]:
        return self.spawner.expiring(now)

    def waiting_ranks(self) -> dict[int, float]:
        waiting = self.spawner.waiting_ranks()
        now = time.monotonic()
        if waiting and now - self.spares_polled_m >= WAITING_POLL_S:  # look for the spare they wait for
            self.spares_polled_m = now
            self.spawner.note_spare_node("")
        return waiting

    def can_requeue(self) -> bool:
        return True

    def requeue(self, exclude: list[str]) -> bool:
        self.spawner.lane.submit(lambda: self._requeue(exclude), "requeue")
        return True

    def resubmit(self) -> bool:
        self.spawner.lane.submit(self._resubmit, "resubmit")
        return True

    def _resubmit(self) -> None:
        from tmslurm.slurm.proc.job import submit_next

        try:
            job_id = submit_next(
                self.spawner.run_dir, self.spawner.cfg, after=self.job_id, placement=self.spawner.placement
            )
        except SlurmError as exc:
            log.error(
                "cannot resubmit the run: %s; resume it by hand (tmslurm-launch ... train.resume_from=%s)",
                exc,
                self.spawner.run_dir,
            )
            return
        log.warning("next job %s submitted; it starts when job %s has ended", job_id, self.job_id)

    def flush(self, timeout_s: float) -> bool:
        return self.spawner.lane.flush(timeout_s)

    def _requeue(self, exclude: list[str]) -> None:
        cmds = [["scontrol", "requeue", self.job_id]]
        if exclude:
            cmds.append(["scontrol", "update", f"jobid={self.job_id}", f"ExcNodeList={','.join(exclude)}"])
        for cmd in cmds:
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            except (subprocess.TimeoutExpired, OSError) as exc:
                log.error("%s failed: %s", " ".join(cmd), exc)
                continue
            if r.returncode != 0:
                log.error("%s failed: %s", " ".join(cmd), r.stderr.strip())

    def status(self) -> dict[str, Any]:
        return {"main_job_id": self.job_id, "spare_job_ids": self.spawner.spare_job_ids()}
