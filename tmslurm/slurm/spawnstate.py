"""What the Slurm spawner launched, kept on disk so a restarted controller can take it over.

Contract: on Slurm the run's processes are Slurm steps and spare jobs, which outlive the controller
process that launched them (``srun`` runs in a session of its own, a spare job is its own job), and
fencing goes by Slurm's identity of what was launched (``scancel`` of a step or a job), never by a
pid. A controller that the supervisor restarts therefore takes them over from a
:class:`SpawnRecord`: each rank's node and latest step, the spare jobs (standby indices, node, used
for a restart), the main job's nodes still held, the nodes with a notice, the (job, node) pairs
that have a monitor.

- :class:`RecordWriter` writes the newest record to ``spawner.json`` off the caller's thread
  (atomically: a temporary file, then ``os.replace``); a failed write is logged and the next offer
  writes again.
- :func:`read_record` reads it back: None when there is none, :class:`~tmslurm.core.errors.TmslurmError`
  naming the file when it is not a valid record.
- :func:`live_processes` says which ranks and standbys still run, from the record and what Slurm
  lists (:func:`slurm_listing`); when Slurm cannot be asked it returns None and the caller decides.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tmslurm.core.errors import TmslurmError

log = logging.getLogger(__name__)


class _Rec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Spare(_Rec):
    job_id: str
    index: Annotated[int, Field(ge=0)]
    """The spare job's index: it runs standbys ``index * ranks_per_node`` and up."""
    node: str | None = None
    used_for_restart: bool = False
    exclude: list[str] = []
    """The nodes it was submitted to avoid (bad then); cleared of healed ones while it is pending."""
    end: float | None = None
    """When its time limit runs out (Unix time), learned once it runs."""
    renewing: bool = False
    """A replacement was asked for because ``end`` is near (``slurm.spare_renew_s``)."""


class SpawnRecord(_Rec):
    main_job_id: str
    ranks_per_node: Annotated[int, Field(ge=1)]
    rank_node: dict[int, str]
    rank_steps: dict[int, tuple[str, str]]
    """rank -> (job, step name) of its latest step."""
    spares: dict[str, Spare]
    main_nodes: list[str]
    bad_nodes: list[str]
    unconfirmed: list[str] = []
    """Bad nodes found dead by our own liveness that Slurm has not yet reported as unhealthy."""
    monitored: list[tuple[str, str]]


def read_record(path: Path) -> SpawnRecord | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        return SpawnRecord.model_validate_json(text)
    except ValidationError as exc:
        raise TmslurmError(f"{path} is not a spawner record: {exc.errors(include_url=False)[:1]}") from None


class RecordWriter:
    """Writes the newest offered record to ``path`` on a thread of its own."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.cond = threading.Condition()
        self.pending: SpawnRecord | None = None
        self.thread = threading.Thread(target=self._loop, name="spawner-record", daemon=True)
        self.thread.start()

    def offer(self, record: SpawnRecord) -> None:
        with self.cond:
            self.pending = record
            self.cond.notify()

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until the newest offer is on disk; False after ``timeout_s``."""
        with self.cond:
            return self.cond.wait_for(lambda: self.pending is None, timeout_s)

    def _loop(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.pending is not None)
                record = self.pending
            if record is None:  # wait_for returned with a pending record, so never; narrows the type
                continue
            self._write(record)
            with self.cond:
                if self.pending is record:
                    self.pending = None
                    self.cond.notify_all()

    def _write(self, record: SpawnRecord) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            tmp.write_text(record.model_dump_json())
            os.replace(tmp, self.path)
        except OSError as exc:
            log.error("cannot write %s: %s", self.path, exc)


def slurm_listing(jobs: list[str], timeout_s: float = 15.0) -> tuple[set[str], set[tuple[str, str]]] | None:
    """(running jobs, running (job, step name) pairs) among ``jobs``; None when squeue fails."""
    if not jobs:
        return set(), set()
    ids = ",".join(jobs)
    try:
        running = subprocess.run(
            ["squeue", "-h", "-j", ids, "-t", "R", "-o", "%i"], capture_output=True, text=True, timeout=timeout_s
        )
        steps = subprocess.run(
            ["squeue", "-h", "-s", "-j", ids, "-o", "%i %j"], capture_output=True, text=True, timeout=timeout_s
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("cannot list the run's jobs and steps: %s", exc)
        return None
    if running.returncode or steps.returncode:
        log.warning("squeue failed: %s", (running.stderr + steps.stderr).strip()[-300:])
        return None
    return parse_listing(running.stdout, steps.stdout)


def parse_listing(running: str, steps: str) -> tuple[set[str], set[tuple[str, str]]]:
    """Parse ``squeue -o %i`` (jobs) and ``squeue -s -o "%i %j"`` (steps ``J.S NAME``) output."""
    jobs = {line.strip() for line in running.splitlines() if line.strip()}
    pairs = set()
    for line in steps.splitlines():
        parts = line.split()
        if len(parts) == 2 and "." in parts[0]:
            pairs.add((parts[0].split(".", 1)[0], parts[1]))
    return jobs, pairs


def live_processes(record: SpawnRecord, listing: tuple[set[str], set[tuple[str, str]]] | None) -> list[tuple[str, int]]:
    """(kind, ident) of every rank whose latest step and every standby whose spare job still runs.

    Without a listing (Slurm could not be asked), every rank and standby of the record: the restarted
    controller then waits for each to come back and fences the ones that do not."""
    rpn = record.ranks_per_node
    standbys = [("standby", s.index * rpn + i) for s in record.spares.values() for i in range(rpn)]
    if listing is None:
        return sorted([("worker", r) for r in record.rank_steps] + standbys)
    jobs, steps = listing
    workers = [("worker", r) for r, (job, name) in record.rank_steps.items() if (job, name) in steps]
    return sorted(
        workers
        + [("standby", s.index * rpn + i) for s in record.spares.values() if s.job_id in jobs for i in range(rpn)]
    )


def record_jobs(record: SpawnRecord) -> list[str]:
    """Every job the record names: the main job and the spare jobs."""
    return [record.main_job_id, *record.spares]


class SlurmOwner:
    """The supervisor's :class:`~tmslurm.run.supervisor.Owner` on Slurm: reads ``spawner.json``.

    Slurm, not this process, holds the steps and spare jobs; the controller launches and fences them.
    :meth:`alive` says which ranks and standbys still run (for ``adopt.json``); :meth:`stop_all`
    (no controller is left) cancels the spare jobs that still run (the main job's steps end with
    the batch script). An unreadable record is logged and counts as empty."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _record(self) -> SpawnRecord | None:
        try:
            return read_record(self.path)
        except TmslurmError as exc:
            log.error("%s", exc)
            return None

    def alive(self) -> list[tuple[str, int]]:
        record = self._record()
        return [] if record is None else live_processes(record, slurm_listing(record_jobs(record)))

    def stop_all(self, grace_s: float = 0.0) -> None:
        record = self._record()
        listing = slurm_listing(list(record.spares)) if record is not None and record.spares else None
        for job in sorted(listing[0] & set(record.spares)) if listing and record is not None else []:
            try:
                subprocess.run(["scancel", job], capture_output=True, timeout=30)
            except (OSError, subprocess.TimeoutExpired) as exc:
                log.warning("cannot cancel spare job %s: %s", job, exc)
