"""The Slurm spawner: ranks as ``srun`` steps of the main job, standbys in one-node spare jobs.

Contract (same interface as :class:`~tmslurm.runtime.spawner.LocalSpawner`):
- a rank runs as its own step of the main job: ``srun --jobid=J -N1 -n1 -w NODE --no-kill
  --kill-on-bad-exit=0 --overlap python -m tmslurm.runtime.agent --rank R``, so it can end (after a
  migration) or die without touching any other step, and its node can then be cut out of the job;
- spares are separate one-node jobs submitted with submitit (``--no-requeue``: a lost spare just
  ends and is replaced), each running ``ranks_per_node`` standby agents; new spares exclude nodes
  known to be bad;
- a rank restarted after its node left the job (checkpoint-restart fallback) runs as a step of a
  spare job instead;
- :meth:`fence` kills only what it launched: a rank's own step (``scancel --signal=KILL`` of that
  step) or a standby's spare job; :meth:`stop_all` ends every step and cancels every spare job.
Slurm command failures are logged and never raised into the controller's loop.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from tmslurm.config import RunConfig
from tmslurm.errors import SlurmError
from tmslurm.rundir import RunDir
from tmslurm.runtime.spawner import agent_env
from tmslurm.slurm.client import SlurmClient
from tmslurm.slurm.hostlist import expand_hostlist
from tmslurm.slurm.parse import OK, classify
from tmslurm.slurm.submit import submit_spare

log = logging.getLogger(__name__)


class SlurmSpawner:
    def __init__(self, run_dir: Path, cfg: RunConfig, client: SlurmClient, job_id: str, nodes: list[str], *,
                 background: Callable[[Callable[[], None], str], None] | None = None) -> None:
        self.background = background or _daemon_thread  # runs Slurm commands the caller must not wait for
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
        self.spare_counter = 0
        RunDir(self.run_dir).logs.mkdir(parents=True, exist_ok=True)

    def node_of_rank(self, rank: int) -> str:
        return self.rank_node[rank]

    # ---- ranks --------------------------------------------------------------------------------
    def _srun(self, job_id: str, node: str, who: str, args: list[str]) -> None:
        if args[:1] == ["--rank"]:
            self.rank_steps[int(args[1])] = (job_id, f"tmslurm-{who}")
        log_path = RunDir(self.run_dir).log(who)
        cmd = ["srun", f"--jobid={job_id}", "-N1", "-n1", f"-w{node}", "--no-kill", "--kill-on-bad-exit=0", "--overlap",
               f"--job-name=tmslurm-{who}", "--output", str(log_path), sys.executable, "-m", "tmslurm.runtime.agent",
               "--run-dir", str(self.run_dir), *args]
        env = {k: v for k, v in agent_env(self.cfg).items() if not k.startswith(("SLURM_STEP", "SLURM_NTASKS", "SLURM_NPROCS",
                                                                                  "SLURM_NNODES", "SLURM_TASKS_PER", "SLURM_CPU"))}
        with open(log_path.with_suffix(".srun"), "ab") as err:
            self.steps.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, start_new_session=True))

    def spawn_worker(self, rank: int, incarnation: int) -> bool:
        """Start rank's step on its node; off a bad node onto a spare when one is there; False when
        the rank has nowhere to run (its node left the job and no spare allocation is up)."""
        node = self.rank_node[rank]
        if node in self.main_nodes and node not in self.still_bad():
            self._srun(self.job_id, node, f"rank{rank}.{incarnation}", ["--rank", str(rank)])
            return True
        spare = next((s for s in self.spares.values() if s.get("node") and not s.get("used_for_restart")), None)
        if spare is None:
            if node in self.main_nodes:  # a draining node still belongs to the job: restart there
                log.warning("rank %d restarts on %s (leaving, but no spare allocation is up)", rank, node)
                self._srun(self.job_id, node, f"rank{rank}.{incarnation}", ["--rank", str(rank)])
                return True
            log.error("rank %d has no node to restart on (node %s left the job; no spare allocation)", rank, node)
            return False
        spare["used_for_restart"] = True
        self.rank_node[rank] = spare["node"]
        self._srun(spare["job_id"], spare["node"], f"rank{rank}.{incarnation}", ["--rank", str(rank)])
        return True

    # ---- spares -------------------------------------------------------------------------------
    def spawn_standby(self, index: int) -> None:
        """Standby ``index`` lives in spare job ``index // ranks_per_node``; submit it when first needed."""
        job_index = index // self.rpn
        if index % self.rpn:
            return
        try:
            job_id = submit_spare(self.run_dir, self.cfg, job_index, first_standby=index, exclude=self.still_bad())
        except SlurmError as exc:
            log.error("cannot submit spare job %d: %s", job_index, exc)
            return
        self.spares[job_id] = {"job_id": job_id, "index": job_index, "node": None}
        log.info("spare job %s submitted (standbys %d..%d)", job_id, index, index + self.rpn - 1)

    def still_bad(self) -> list[str]:
        """Nodes that had a notice and are still not healthy now (a repaired node is usable again)."""
        if not self.bad_nodes:
            return []
        try:
            infos = {n.name: n for n in self.client.nodes(sorted(self.bad_nodes))}
        except SlurmError as exc:
            log.warning("cannot read node states (%s); excluding every node that had a notice", exc)
            return sorted(self.bad_nodes)
        healed = {name for name, info in infos.items() if classify(info) == OK}
        self.bad_nodes -= healed
        return sorted(self.bad_nodes)

    def spare_job_ids(self) -> list[str]:
        return list(self.spares)

    def note_spare_node(self, node: str) -> None:
        for info in self.spares.values():
            if info["node"] is None:
                job = self._job(info["job_id"])
                if job is not None and job.nodes:
                    info["node"] = job.nodes[0]

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
            work, what = (lambda step=self.rank_steps[ident]: self._kill_step(*step)), f"rank {ident}'s step"
        elif kind == "standby":
            job = next((j for j, s in self.spares.items() if s["index"] == ident // self.rpn), None)
            if job is None:
                return
            work, what = (lambda: self._cancel(job)), f"spare job {job} of standby {ident}"
        else:
            return
        log.info("fencing %s", what)
        self.background(work, f"fence-{kind}{ident}")

    def _cancel(self, job: str) -> None:
        try:
            self.client.cancel(job)
        except SlurmError as exc:
            log.warning("cannot cancel spare job %s: %s", job, exc)

    def _kill_step(self, job: str, name: str) -> None:
        try:
            out = subprocess.run(["squeue", "-h", "-s", "-j", job, "-o", "%i %j"], capture_output=True, text=True, timeout=15)
            steps = [line.split()[0] for line in out.stdout.splitlines() if line.split()[1:2] == [name]]
            for step in steps:
                subprocess.run(["scancel", "--signal=KILL", step], capture_output=True, timeout=15)
        except (subprocess.TimeoutExpired, OSError, IndexError) as exc:  # a dead node: Slurm ends the step anyway
            log.warning("fencing step %s of job %s failed: %s", name, job, exc)

    def release_node(self, node: str) -> bool:
        """Cut ``node`` out of the main job (it becomes DRAINED if it was draining)."""
        if node not in self.main_nodes:
            return False
        rest = [n for n in self.main_nodes if n != node]
        try:
            self.client.update_job_nodelist(self.job_id, rest)
        except SlurmError as exc:
            log.error("cannot release node %s from job %s: %s", node, self.job_id, exc)
            return False
        self.main_nodes = rest
        return True

    def stop_all(self) -> None:
        for job_id in list(self.spares):
            try:
                self.client.cancel(job_id)
            except SlurmError as exc:
                log.warning("cannot cancel spare job %s: %s", job_id, exc)
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
