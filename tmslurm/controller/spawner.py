"""Process spawners: how the controller starts, fences and stops agent processes.

Contract: a spawner starts a worker for a rank or a standby, both running
``python -m tmslurm.agent.main``; :meth:`fence` makes the process it started for a worker rank
or a standby index unable to come back (SIGKILL through its own handle, also delivered to a
SIGSTOPped process). A spawner never signals a pid it did not start itself, whatever an agent
reports: there is no pid argument. :meth:`stop_all` ends everything it started and waits for it.
With :func:`wants_monitors`, the first process placed on a node also starts that node's monitor
(``--monitor``), which stays until the run ends. :class:`LocalSpawner` runs processes on this host
(``cluster=local``); the Slurm spawner in
``tmslurm.slurm`` implements the same interface with ``srun`` steps. Agent output goes to
``<run_dir>/logs/<who>.log``. With ``runtime.fork_agents`` (the default) :class:`LocalSpawner` forks
ranks and standbys from a zygote that imported torch once (:mod:`tmslurm.controller.zygote_client`); they
are its own children all the same, and fresh processes where the zygote cannot be used.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Protocol

from tmslurm.controller.zygote_client import Forked, Zygote
from tmslurm.core.config import RunConfig, wants_monitors
from tmslurm.core.rundir import RunDir

log = logging.getLogger(__name__)


class Spawner(Protocol):
    def spawn_worker(self, rank: int, incarnation: int) -> bool: ...
    def spawn_standby(self, index: int) -> None: ...
    def fence(self, kind: str, ident: int) -> None: ...
    def stop_all(self, grace_s: float = 0.0) -> None:
        """End every process/step/job this spawner started, after up to ``grace_s`` for them to exit on their own."""

    def node_of_rank(self, rank: int) -> str: ...
    def pending_standbys(self) -> list[int]:
        """Standby ids whose allocation was asked for and may still start (a queued spare job): a
        restarted controller keeps expecting them. [] where every live one is listed by the supervisor."""

    def take_lost_standbys(self) -> list[int]:
        """Standby ids asked for whose allocation is known to be gone without them: a submission that
        failed (a Slurm outage), a spare job that ended. Each is returned once; the controller stops
        expecting it, so ``standby.replenish`` asks for another. [] where a process is the allocation."""


def agent_env(cfg: RunConfig) -> dict[str, str]:
    env = dict(os.environ)
    threads = str(cfg.train.threads)
    env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, PYTHONUNBUFFERED="1")
    return env


def local_node(cfg: RunConfig, rank: int) -> str:
    """The local "node" of a rank: ``local<k>`` with ``parallel.ranks_per_node`` ranks each."""
    return f"local{rank // cfg.parallel.ranks_per_node}"


class LocalSpawner:
    def __init__(self, run_dir: Path, cfg: RunConfig) -> None:
        self.run_dir = Path(run_dir)
        self.cfg = cfg
        self.procs: list[subprocess.Popen | Forked] = []
        self.handles: dict[tuple[str, int], subprocess.Popen | Forked] = {}
        self.monitored: set[str] = set()
        RunDir(self.run_dir).logs.mkdir(parents=True, exist_ok=True)
        self.zygote = Zygote(agent_env(cfg), RunDir(self.run_dir).log("zygote")) if cfg.runtime.fork_agents else None
        """Forks ranks and standbys from one process that imported torch once (monitors import none)."""

    def pending_standbys(self) -> list[int]:
        return []  # a local standby is a process from the start: the supervisor lists it

    def take_lost_standbys(self) -> list[int]:
        return []

    def node_of_rank(self, rank: int) -> str:
        return local_node(self.cfg, rank)

    def alive(self) -> list[tuple[str, int]]:
        """(kind, ident) of every worker and standby started here whose process still runs."""
        return sorted(key for key, proc in self.handles.items() if proc.poll() is None)

    def _start(self, who: str, args: list[str], node: str) -> subprocess.Popen | Forked:
        if wants_monitors(self.cfg) and node not in self.monitored:  # the node's monitor, once per node
            self.monitored.add(node)
            self._start(f"monitor-{node}", ["--monitor"], node)
        argv = ["--run-dir", str(self.run_dir), *args, "--node", node]
        log_path = RunDir(self.run_dir).log(who)
        proc: subprocess.Popen | Forked | None = None
        if self.zygote is not None and args[0] != "--monitor":
            proc = self.zygote.spawn(argv, agent_env(self.cfg), log_path)
        if proc is None:
            with open(log_path, "ab") as logf:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "tmslurm.agent.main", *argv],
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    env=agent_env(self.cfg),
                    start_new_session=True,
                )
        self.procs.append(proc)
        return proc

    def spawn_worker(self, rank: int, incarnation: int) -> bool:
        self.handles[("worker", rank)] = self._start(
            f"rank{rank}.{incarnation}", ["--rank", str(rank)], self.node_of_rank(rank)
        )
        return True

    def spawn_standby(self, index: int) -> None:
        self.handles[("standby", index)] = self._start(f"standby{index}", ["--standby", str(index)], f"spare{index}")

    def fence(self, kind: str, ident: int) -> None:
        proc = self.handles.get((kind, ident))
        if proc is None:
            log.warning("no process of ours for %s %d: nothing to fence", kind, ident)
            return
        if proc.poll() is None:
            proc.kill()  # Popen.kill: only our own child, and never after it was reaped

    def stop_all(self, grace_s: float = 0.0) -> None:
        if self.zygote is not None:
            self.zygote.close()
        wait_for_exit(self.procs, grace_s)
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log.error("process %d did not exit after SIGKILL", p.pid)
        self.procs.clear()

    def reap(self) -> None:
        self.procs = [p for p in self.procs if p.poll() is None]


def wait_for_exit(procs: list[subprocess.Popen] | list[subprocess.Popen | Forked], grace_s: float) -> None:
    """Wait until every process in ``procs`` exited, or ``grace_s`` passed (whichever is first)."""
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return
