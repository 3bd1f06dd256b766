"""The Slurm spawner: ranks as ``srun`` steps of the main job, standbys in one-node spare jobs.

Contract (same interface as :class:`~tmslurm.controller.spawner.LocalSpawner`):
- a rank runs as its own step of the main job: ``srun --jobid=J -N1 -n1 -w NODE --no-kill
  --kill-on-bad-exit=0 --overlap python -m tmslurm.agent.main --rank R``, so it can end (after a
  migration) or die without touching any other step, and its node can then be cut out of the job;
- spares are separate one-node jobs submitted with submitit (``--no-requeue``: a lost spare just
  ends and is replaced), each running ``ranks_per_node`` standby agents and the node's monitor; new
  spares exclude nodes known to be bad;
- the first rank step on a node of the main job is preceded by that node's monitor, a step of its
  own (``python -m tmslurm.slurm.proc.orphan``: it also requeues the job if the controller is lost);
- a rank restarted after its node left the job (checkpoint-restart fallback) runs as a step of a
  spare job instead, placed on the lane once the spare jobs were read (ended ones forgotten: a spare
  job ends with its standbys); while none is up it waits for one (:meth:`waiting_ranks`);
- a spare whose sbatch failed (after :data:`RESUBMIT_AFTER_S`) or whose job ended is handed to the
  controller once by :meth:`take_lost_standbys`: it stops expecting those standbys and asks again;
- :meth:`fence` kills only what it launched: a rank's own step (``scancel --signal=KILL`` of that
  step) or a standby's spare job; :meth:`stop_all` ends every step and cancels every spare job.
- Nothing the controller's thread calls waits on Slurm: spare submission (with the node-state read
  that picks the nodes to exclude), reading spare jobs' nodes, node give-back and a standby's fence
  run in order on the :class:`~tmslurm.slurm.lane.Lane`; a rank's fence runs on ``background`` (in
  parallel, a dead node's ``scancel`` can take seconds). A rank spawned on the controller's thread
  avoids the nodes known bad so far (the lane refreshes which ones healed). Results the controller
  needs come back through a callback (:meth:`release_node`'s ``released``).
Slurm command failures are logged and never raised into the controller's loop.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tmslurm.controller.spawner import agent_env, wait_for_exit
from tmslurm.core.config import RunConfig, wants_monitors
from tmslurm.core.errors import SlurmError
from tmslurm.core.rundir import RunDir
from tmslurm.slurm.client import SlurmClient
from tmslurm.slurm.hostlist import expand_hostlist
from tmslurm.slurm.lane import Lane
from tmslurm.slurm.parse import OK, classify
from tmslurm.slurm.placement import Placement, placement_from_config
from tmslurm.slurm.spawnstate import RecordWriter, Spare, SpawnRecord
from tmslurm.slurm.submit import spare_renew_lead, submit_spare

log = logging.getLogger(__name__)
LIVE_JOB_STATES = ("PENDING", "CONFIGURING", "RUNNING", "RESIZING", "SUSPENDED", "REQUEUED")
"""Job states in which a spare job may still run a step (any other: it ended or is ending)."""
RESUBMIT_AFTER_S = 15.0
"""A spare whose sbatch failed is asked for again after this long (a slurmctld outage is not hammered)."""


class SlurmSpawner:
    def __init__(
        self,
        run_dir: Path,
        cfg: RunConfig,
        client: SlurmClient,
        job_id: str,
        nodes: list[str],
        *,
        background: Callable[[Callable[[], None], str], None] | None = None,
        lane: Lane | None = None,
        record: SpawnRecord | None = None,
        placement: Placement | None = None,
    ) -> None:
        self.placement = placement or placement_from_config(cfg)
        """Where spares go (and a resubmitted main job): the main job's own placement."""
        self.background = background or _daemon_thread  # runs Slurm commands the caller must not wait for
        self.lane = lane or Lane()  # the other Slurm commands, in order, off the controller's thread
        self.lock = threading.Lock()  # spares, bad_nodes and main_nodes are shared with the lane
        self.run_dir = Path(run_dir)
        self.cfg = cfg
        self.client = client
        self.job_id = job_id
        self.rpn = cfg.parallel.ranks_per_node
        self.rank_node = {r: nodes[r // self.rpn] for r in range(cfg.parallel.dp * cfg.parallel.pp * cfg.parallel.tp)}
        self.main_nodes = list(nodes)
        self.steps: list[subprocess.Popen] = []
        self.rank_steps: dict[int, tuple[str, str]] = {}  # rank -> (job, step name) of its latest step
        self.spares: dict[str, dict[str, Any]] = {}
        self.bad_nodes: set[str] = set()
        self.unconfirmed: set[str] = set()
        """Bad by our own liveness, not yet by Slurm: a node that Slurm still calls fine a second after
        it went silent is not healed (Slurm notices only after SlurmdTimeout); it heals once Slurm
        has called it unhealthy and then fine again."""
        self.monitored: set[tuple[str, str]] = set()  # (job, node) with a monitor step
        self.waiting: dict[int, tuple[int, float]] = {}
        """Ranks of a restart with no spare allocation up yet: rank -> (incarnation, since, monotonic);
        each starts in the first spare job whose node becomes known (:meth:`_place_waiting`)."""
        self.renew_lead = spare_renew_lead(cfg)
        """Seconds before a spare's limit at which :meth:`expiring` names it; None: no renewal."""
        self.ever_bad: set[str] = set()
        """Nodes that were bad at some point of this controller's life: one may have been dropped from
        the main job since, so a rank restarted there is placed on the lane after Slurm was read."""
        self.lost_standbys: list[tuple[int, float]] = []
        """(standby id, monotonic time) of allocations gone without their standbys: a failed sbatch, an
        ended spare job. Handed to the controller by :meth:`take_lost_standbys`, a failed sbatch only
        after :data:`RESUBMIT_AFTER_S` (so a Slurm outage is not hammered)."""
        if record is not None:  # a restarted controller takes over what its predecessor launched
            self._restore(record)
        self.writer = RecordWriter(RunDir(self.run_dir).spawner)
        RunDir(self.run_dir).logs.mkdir(parents=True, exist_ok=True)

    def _restore(self, record: SpawnRecord) -> None:
        self.rank_node.update(record.rank_node)
        self.rank_steps = dict(record.rank_steps)
        self.spares = {j: s.model_dump() for j, s in record.spares.items()}
        self.main_nodes = list(record.main_nodes)
        self.bad_nodes = set(record.bad_nodes)
        self.ever_bad = set(record.bad_nodes)
        self.unconfirmed = set(record.unconfirmed)
        self.monitored = set(record.monitored)

    def record(self) -> SpawnRecord:
        with self.lock:
            return SpawnRecord(
                main_job_id=self.job_id,
                ranks_per_node=self.rpn,
                rank_node=dict(self.rank_node),
                rank_steps=dict(self.rank_steps),
                spares={j: Spare(**s) for j, s in self.spares.items()},
                main_nodes=list(self.main_nodes),
                bad_nodes=sorted(self.bad_nodes),
                unconfirmed=sorted(self.unconfirmed),
                monitored=sorted(self.monitored),
            )

    def _changed(self) -> None:
        """Hand the new record to the writer (``spawner.json``, off this thread)."""
        self.writer.offer(self.record())

    def node_of_rank(self, rank: int) -> str:
        return self.rank_node[rank]

    # ---- ranks --------------------------------------------------------------------------------
    def _srun(self, job_id: str, node: str, who: str, args: list[str], module: str = "tmslurm.agent.main") -> None:
        if wants_monitors(self.cfg) and (job_id, node) not in self.monitored:  # the node's monitor: a step of its own
            with self.lock:
                self.monitored.add((job_id, node))
            self._srun(job_id, node, f"monitor-{node}", [], module="tmslurm.slurm.proc.orphan")
        if args[:1] == ["--rank"]:
            with self.lock:
                self.rank_steps[int(args[1])] = (job_id, f"tmslurm-{who}")
        log_path = RunDir(self.run_dir).log(who)
        cmd = [
            "srun",
            f"--jobid={job_id}",
            "-N1",
            "-n1",
            f"-w{node}",
            "--no-kill",
            "--kill-on-bad-exit=0",
            "--overlap",
            f"--job-name=tmslurm-{who}",
            "--output",
            str(log_path),
            sys.executable,
            "-m",
            module,
            "--run-dir",
            str(self.run_dir),
            *args,
        ]
        env = {
            k: v
            for k, v in agent_env(self.cfg).items()
            if not k.startswith(
                ("SLURM_STEP", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NNODES", "SLURM_TASKS_PER", "SLURM_CPU")
            )
        }
        with open(log_path.with_suffix(".srun"), "ab") as err:
            self.steps.append(
                subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, start_new_session=True)
            )
        self._changed()

    def spawn_worker(self, rank: int, incarnation: int) -> bool:
        """Start rank's step on its node when that node is the main job's and healthy (or leaving
        with no spare up: a draining node still runs steps). Else the rank is placed on the lane,
        once the spare jobs were looked at (ended ones forgotten, started ones learnt): on the spare
        it restarted on before if that still runs, else on one no rank uses; while none is up it
        waits (:meth:`waiting_ranks`). False when it has nowhere to run at all (no spare job that is
        queued, or up on a healthy node and free or its own)."""
        node = self.rank_node[rank]
        with self.lock:
            self.waiting.pop(rank, None)  # an earlier restart's wait is over: this one places it
            in_main, suspect = node in self.main_nodes, node in self.ever_bad or node in self.bad_nodes
            spares = any(
                s.get("node") is None
                or (s["node"] not in self.bad_nodes and (not s.get("used_for_restart") or s["node"] == node))
                for s in self.spares.values()
            )
        self.lane.submit(self.still_bad, "refresh-bad-nodes")
        if in_main and not suspect:  # a node that never failed here: still the main job's, start at once
            self._srun(self.job_id, node, f"rank{rank}.{incarnation}", ["--rank", str(rank)])
            return True
        if not in_main and not spares:
            log.error("rank %d has no node to restart on (node %s left the job; no spare allocation)", rank, node)
            return False
        with self.lock:
            self.waiting[rank] = (incarnation, time.monotonic())
        self.lane.submit(self._refresh_and_place, f"place-rank{rank}")
        return True

    def _start_on_spare(self, rank: int, incarnation: int, spare: dict[str, Any]) -> None:
        with self.lock:
            spare["used_for_restart"] = True
            self.rank_node[rank] = spare["node"]
        self._srun(spare["job_id"], spare["node"], f"rank{rank}.{incarnation}", ["--rank", str(rank)])

    def _refresh_and_place(self) -> None:
        self._refresh_spares()
        self._place_waiting()

    def _refresh_main_nodes(self) -> None:
        """Forget main-job nodes Slurm no longer lists (a --no-kill job drops a node that failed): no
        rank may be started there as a step of the main job once the node is repaired."""
        try:
            job = self.client.job(self.job_id)
        except SlurmError as exc:
            log.warning("cannot read the main job %s: %s", self.job_id, exc)
            return
        if job is None or not job.nodes:
            return
        with self.lock:
            gone = [n for n in self.main_nodes if n not in job.nodes]
            self.main_nodes = [n for n in self.main_nodes if n in job.nodes]
        if gone:
            log.info("nodes %s are no longer in job %s (Slurm dropped them)", ",".join(gone), self.job_id)
            self._changed()

    def _refresh_spares(self) -> None:
        """Learn the nodes of spare jobs that started and forget those that ended (a spare job ends
        with its standbys, and a rank restarted into it then: no rank may be started there again)."""
        self._refresh_main_nodes()
        with self.lock:
            ids = list(self.spares)
        changed = False
        for job_id in ids:
            try:
                job = self.client.job(job_id)
            except SlurmError as exc:
                log.warning("cannot read spare job %s: %s", job_id, exc)
                continue
            with self.lock:
                info = self.spares.get(job_id)
                if info is None:
                    continue
                if job is None or job.state.upper() not in LIVE_JOB_STATES:
                    del self.spares[job_id]
                    self._lose_standbys(info["index"], time.monotonic() - RESUBMIT_AFTER_S)
                    changed = True
                    log.info("spare job %s ended (%s): forgotten", job_id, "gone" if job is None else job.state)
                elif job.nodes and info["node"] is None:
                    info["node"] = job.nodes[0]
                    info["end"] = job.end_time.timestamp() if job.end_time else None
                    changed = True
        if changed:  # spawner.json is written only when something changed (this runs every 20 steps)
            self._changed()

    def _place_waiting(self) -> None:
        """Start waiting ranks (on the lane, after Slurm was read): each on its own node while that is
        still the main job's and either healthy or no spare is up (a draining node still runs steps);
        else on the spare it restarted on before if that still runs, else on a started spare job no
        rank uses."""
        while True:
            with self.lock:
                rank = min(self.waiting, default=None)
                if rank is None:
                    return
                node, bad = self.rank_node[rank], self.bad_nodes
                up = any(
                    s.get("node") and s["node"] not in bad and not s.get("used_for_restart")
                    for s in self.spares.values()
                )
                if node in self.main_nodes and (node not in bad or not up):
                    incarnation, _ = self.waiting.pop(rank)
                    home = True
                else:
                    home = False
            if home:
                if node in bad:
                    log.warning("rank %d restarts on %s (leaving, but no spare allocation is up)", rank, node)
                self._srun(self.job_id, node, f"rank{rank}.{incarnation}", ["--rank", str(rank)])
                continue
            with self.lock:
                spare = next(
                    (
                        s
                        for s in self.spares.values()
                        if s.get("node") == node and node not in bad and s.get("used_for_restart")
                    ),
                    None,
                ) or next(
                    (
                        s
                        for s in self.spares.values()
                        if s.get("node") and s["node"] not in bad and not s.get("used_for_restart")
                    ),
                    None,
                )
                if spare is None:
                    return
                incarnation, _ = self.waiting.pop(rank)
            log.info("rank %d starts on %s (spare job %s)", rank, spare["node"], spare["job_id"])
            self._start_on_spare(rank, incarnation, spare)

    def pending_standbys(self) -> list[int]:
        """The standby ids of every spare job not known to have ended (queued, starting or running)."""
        with self.lock:
            return sorted(s["index"] * self.rpn + i for s in self.spares.values() for i in range(self.rpn))

    def take_lost_standbys(self) -> list[int]:
        """Standby ids whose allocation is gone without them (see :attr:`lost_standbys`), each once."""
        now = time.monotonic()
        with self.lock:
            due = [i for i, t in self.lost_standbys if now - t >= RESUBMIT_AFTER_S]
            self.lost_standbys = [(i, t) for i, t in self.lost_standbys if now - t < RESUBMIT_AFTER_S]
        return due

    def _lose_standbys(self, job_index: int, t: float) -> None:
        """(lock held) The standbys of spare job ``job_index`` will not come from it."""
        self.lost_standbys += [(job_index * self.rpn + i, t) for i in range(self.rpn)]

    def waiting_ranks(self) -> dict[int, float]:
        """Ranks still waiting for a spare allocation, with how long (seconds)."""
        now = time.monotonic()
        with self.lock:
            return {r: now - since for r, (_, since) in self.waiting.items()}

    # ---- spares -------------------------------------------------------------------------------
    def spawn_standby(self, index: int) -> None:
        """Standby ``index`` lives in spare job ``index // ranks_per_node``; submit it when first needed
        (on the lane: returns at once)."""
        job_index = index // self.rpn
        if index % self.rpn:
            return
        self.lane.submit(lambda: self._submit_spare(index, job_index), f"submit-spare{job_index}")

    def _submit_spare(self, index: int, job_index: int) -> None:
        exclude = self.still_bad()
        try:
            job_id = submit_spare(
                self.run_dir, self.cfg, job_index, first_standby=index, exclude=exclude, placement=self.placement
            )
        except SlurmError as exc:
            log.error(
                "cannot submit spare job %d: %s; the controller asks again in %.0fs", job_index, exc, RESUBMIT_AFTER_S
            )
            with self.lock:
                self._lose_standbys(job_index, time.monotonic())
            return
        with self.lock:
            self.spares[job_id] = {"job_id": job_id, "index": job_index, "node": None, "exclude": exclude}
        self._changed()
        log.info("spare job %s submitted (standbys %d..%d)", job_id, index, index + self.rpn - 1)

    def still_bad(self) -> list[str]:
        """Nodes that had a notice and are still not healthy now (a repaired node is usable again).
        Reads Slurm's node states: blocking, run on the lane only."""
        with self.lock:
            bad = sorted(self.bad_nodes)
        if not bad:
            return []
        try:
            infos = {n.name: n for n in self.client.nodes(bad)}
        except SlurmError as exc:
            log.warning("cannot read node states (%s); excluding every node that had a notice", exc)
            return bad
        ok = {name for name, info in infos.items() if classify(info) == OK}
        with self.lock:
            confirmed = self.unconfirmed & (set(infos) - ok)  # Slurm sees it too now
            self.unconfirmed -= confirmed
            healed = ok - self.unconfirmed
            self.bad_nodes -= healed
            bad = sorted(self.bad_nodes)
        if healed or confirmed:
            self._changed()
        return bad

    def add_bad_node(self, node: str, *, confirmed: bool = True) -> None:
        """``confirmed=False``: found dead by our liveness, Slurm may not know yet (:attr:`unconfirmed`)."""
        with self.lock:
            new = node not in self.bad_nodes
            self.bad_nodes.add(node)
            self.ever_bad.add(node)
            if not confirmed and new:
                self.unconfirmed.add(node)
        if new:
            self._changed()

    def expiring(self, now: float) -> list[int]:
        """The standbys of running spare jobs whose time limit ends within the renewal lead and
        that were not named before (each spare once; no Slurm command: called from the loop)."""
        lead = self.renew_lead
        out: list[int] = []
        if lead is None:
            return out
        with self.lock:
            for info in self.spares.values():
                if info.get("end") is not None and not info.get("renewing") and info["end"] - now <= lead:
                    info["renewing"] = True
                    out += [info["index"] * self.rpn + i for i in range(self.rpn)]
        if out:
            self._changed()
        return out

    def spare_job_ids(self) -> list[str]:
        with self.lock:
            return list(self.spares)

    def note_spare_node(self, node: str) -> None:
        """Learn the nodes of spare jobs that started, and let pending ones use nodes that healed since
        they were submitted (on the lane: returns at once)."""
        self.lane.submit(self._note_spare_nodes, "note-spare-nodes")

    def _note_spare_nodes(self) -> None:
        self._refresh_spares()
        with self.lock:
            unconfirmed = bool(self.unconfirmed)
        if unconfirmed:  # learn as soon as Slurm flags a node we found dead, so that it can heal later
            self.still_bad()
        self._unexclude_healed()
        self._place_waiting()

    def _unexclude_healed(self) -> None:
        """A pending spare submitted while a node was bad would never run there once it is repaired
        (a small cluster, or the node it is waiting for): drop healed nodes from its exclusions."""
        with self.lock:
            pending = {
                j: list(s.get("exclude") or [])
                for j, s in self.spares.items()
                if s["node"] is None and s.get("exclude")
            }
        if not pending:
            return
        bad = set(self.still_bad())
        for job_id, exclude in pending.items():
            keep = sorted(set(exclude) & bad)
            if keep == sorted(exclude):
                continue
            try:
                self.client.update_job_excludes(job_id, keep)
            except SlurmError as exc:  # it may have started or ended meanwhile: the next call sees it
                log.warning("cannot update the excluded nodes of spare job %s: %s", job_id, exc)
                continue
            log.info("spare job %s may now use %s (healed)", job_id, ",".join(sorted(set(exclude) - bad)))
            with self.lock:
                if job_id in self.spares:
                    self.spares[job_id]["exclude"] = keep
            self._changed()

    def _job(self, job_id: str) -> Any:
        try:
            return self.client.job(job_id)
        except SlurmError as exc:
            log.warning("cannot read job %s: %s", job_id, exc)
            return None

    # ---- fencing and the end ------------------------------------------------------------------
    def fence(self, kind: str, ident: int) -> None:
        """Kill what we launched for it: a rank's own step (``scancel --signal=KILL J.S``), a
        standby's spare job (``scancel``). Never a pid an agent reported.

        Runs in a thread of its own and returns at once: Slurm's commands for a step on a node that
        went silent block for seconds (measured on the failure lab: ~6 s), and the caller does not
        need to wait, because a fenced process is already shut out by its stale epoch."""
        if kind == "worker" and ident in self.rank_steps:
            log.info("fencing rank %d's step", ident)
            step = self.rank_steps[ident]
            self.background(lambda: self._kill_step(*step), f"fence-{kind}{ident}")
        elif kind == "standby":
            with self.lock:  # forgotten at once: a restart placing ranks right now must not pick this job
                job = next((j for j, s in self.spares.items() if s["index"] == ident // self.rpn), None)
                if job is not None:
                    self.spares.pop(job)
            if job is not None:
                self._changed()
                log.info("fencing spare job %s of standby %d", job, ident)
                self.lane.submit(lambda: self._cancel(job), f"fence-{kind}{ident}")
            else:  # on the lane: after its spare job's submission, which may still be queued
                self.lane.submit(lambda: self._fence_spare(ident), f"fence-{kind}{ident}")

    def _fence_spare(self, ident: int) -> None:
        with self.lock:
            job = next((j for j, s in self.spares.items() if s["index"] == ident // self.rpn), None)
        if job is not None:
            log.info("fencing spare job %s of standby %d", job, ident)
            self._cancel(job)
            with self.lock:  # gone: no restart may launch a rank into it (its step would never start)
                self.spares.pop(job, None)
            self._changed()

    def _cancel(self, job: str) -> None:
        try:
            self.client.cancel(job)
        except SlurmError as exc:
            log.warning("cannot cancel spare job %s: %s", job, exc)

    def _kill_step(self, job: str, name: str) -> None:
        try:
            out = subprocess.run(
                ["squeue", "-h", "-s", "-j", job, "-o", "%i %j"], capture_output=True, text=True, timeout=15
            )
            steps = [line.split()[0] for line in out.stdout.splitlines() if line.split()[1:2] == [name]]
            for step in steps:
                subprocess.run(["scancel", "--signal=KILL", step], capture_output=True, timeout=15)
        except (subprocess.TimeoutExpired, OSError, IndexError) as exc:  # a dead node: Slurm ends the step anyway
            log.warning("fencing step %s of job %s failed: %s", name, job, exc)

    def release_node(self, node: str, released: Callable[[str], None]) -> None:
        """Cut ``node`` out of the main job (it becomes DRAINED if it was draining), on the lane;
        ``released(node)`` is called from the lane once Slurm accepted it."""
        self.lane.submit(lambda: self._release(node, released), f"release-{node}")

    def _release(self, node: str, released: Callable[[str], None]) -> None:
        with self.lock:
            rest = [n for n in self.main_nodes if n != node]
            if node not in self.main_nodes:
                return
        try:
            self.client.update_job_nodelist(self.job_id, rest)
        except SlurmError as exc:
            self._refresh_main_nodes()  # a --no-kill job loses a node that died: Slurm may have done it
            with self.lock:
                dropped = node not in self.main_nodes
            if not dropped:
                log.error("cannot release node %s from job %s: %s", node, self.job_id, exc)
                return
            log.info("node %s had left job %s already (Slurm dropped it)", node, self.job_id)
            released(node)
            return
        with self.lock:
            self.main_nodes = [n for n in self.main_nodes if n != node]
        self._changed()
        log.info("node %s released from job %s", node, self.job_id)
        released(node)

    def stop_all(self, grace_s: float = 0.0) -> None:
        """At the end (off the loop): let queued Slurm commands finish, give the rank steps up to
        ``grace_s`` to end on their own, then end everything."""
        with self.lock:
            self.waiting.clear()
        if not self.lane.flush(60.0):
            log.warning("queued Slurm commands still running after 60s; stopping anyway")
        for job_id in self.spare_job_ids():
            try:
                self.client.cancel(job_id)
            except SlurmError as exc:
                log.warning("cannot cancel spare job %s: %s", job_id, exc)
        wait_for_exit(self.steps, grace_s)
        for p in self.steps:
            if p.poll() is None:
                p.terminate()
        for p in self.steps:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        self.steps.clear()

    def reap(self) -> None:
        self.steps = [p for p in self.steps if p.poll() is None]


def job_nodes() -> list[str]:
    """The nodes of the allocation we run in (SLURM_JOB_NODELIST), in order."""
    text = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if not text:
        raise SlurmError("SLURM_JOB_NODELIST is not set: the main job entry must run inside a Slurm allocation")
    return expand_hostlist(text)


def _daemon_thread(work: Callable[[], None], name: str) -> None:
    threading.Thread(target=work, name=name, daemon=True).start()
