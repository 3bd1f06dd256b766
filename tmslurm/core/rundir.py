"""The run directory: every file name of a run in one place.

Contract: :class:`RunDir` names each file a run keeps (``config.json``, ``token``,
``controller.json``, ``jobs.json``, ``events.jsonl``, ``summary.json``, ``requeue.json``, ``snapshot.json``,
``steps.jsonl``, ``adopt.json``, ``spawner.json``, ``controller-lost.json``, ``job-ending.json``, ``logs/``, ``final/``,
``checkpoints/``, ``sandbox/``); no other module spells these names. :meth:`RunDir.create` makes the directory mode 0700
(the token, checkpoints and logs inside are the owner's alone). It does no other I/O.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def config(self) -> Path:
        return self.path / "config.json"

    @property
    def token(self) -> Path:
        return self.path / "token"

    @property
    def controller(self) -> Path:
        """Where the controller advertises its address (host, port, store_port)."""
        return self.path / "controller.json"

    @property
    def jobs(self) -> Path:
        """Slurm: the main job's id as submitted."""
        return self.path / "jobs.json"

    @property
    def events(self) -> Path:
        return self.path / "events.jsonl"

    @property
    def summary(self) -> Path:
        return self.path / "summary.json"

    @property
    def requeue(self) -> Path:
        """The state a requeued job's next incarnation picks up."""
        return self.path / "requeue.json"

    @property
    def snapshot(self) -> Path:
        """The controller's last committed step, rewritten after commits (what a requeue redoes)."""
        return self.path / "snapshot.json"

    @property
    def steps(self) -> Path:
        """The step log, one committed step per line, appended off the controller's loop."""
        return self.path / "steps.jsonl"

    @property
    def spawner(self) -> Path:
        """On Slurm: what the spawner launched (steps, spare jobs), for a restarted controller."""
        return self.path / "spawner.json"

    @property
    def adopt(self) -> Path:
        """Written by the supervisor for a restarted controller: which processes are still alive."""
        return self.path / "adopt.json"

    @property
    def controller_lost(self) -> Path:
        """Claimed (O_EXCL) by the node monitor that requeues a job whose controller was lost."""
        return self.path / "controller-lost.json"

    @property
    def job_ending(self) -> Path:
        """Written when the job was told it ends (SIGUSR1, SIGTERM): the next job can tell a planned
        end whose checkpoint never completed (the grace time too short) from a clean one."""
        return self.path / "job-ending.json"

    def job_ending_archive(self, t: float) -> Path:
        return self.path / f"job-ending-{int(t)}.json"

    def controller_lost_archive(self, t: float) -> Path:
        return self.path / f"controller-lost-{int(t)}.json"

    def requeue_archive(self, t: float) -> Path:
        return self.path / f"requeue-{int(t)}.json"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    def log(self, who: str) -> Path:
        return self.logs / f"{who}.log"

    @property
    def final(self) -> Path:
        return self.path / "final"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / f"step_{step:06d}"

    def sandbox(self, role: str) -> Path:
        """The recording of a role's first step that standbys replay."""
        return self.path / "sandbox" / f"{role}.pt"

    def create(self) -> None:
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.path, 0o700)
