"""What tmslurm asks of Slurm: the :class:`SlurmClient` interface both backends implement.

Contract: every method raises :class:`~tmslurm.core.errors.SlurmError` when Slurm cannot answer (with
:data:`HINT` in the message); expected "absent" answers (an unknown job) are not errors.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Sequence

from tmslurm.slurm.parse import JobInfo, NodeInfo, Reservation
from tmslurm.slurm.runtag import JobRecord

HINT = "is slurmctld reachable? check SLURM_CONF / scripts/local-slurm status"


class SlurmClient(abc.ABC):
    """What tmslurm asks of Slurm. Every method raises SlurmError when Slurm cannot answer."""

    @abc.abstractmethod
    def nodes(self, names: Sequence[str] | None = None) -> list[NodeInfo]:
        """States of the named nodes (all nodes when None); unknown names are skipped."""

    @abc.abstractmethod
    def job(self, job_id: str | int) -> JobInfo | None:
        """The job, or None when Slurm does not know it (any more)."""

    @abc.abstractmethod
    def job_record(self, job_id: str | int) -> JobRecord | None:
        """The job's comment, working directory and output path as slurmctld has them; None when it does
        not know the job (any more: a finished job is forgotten after ``MinJobAge``)."""

    @abc.abstractmethod
    def accounted_job(self, job_id: str | int) -> JobRecord | None:
        """The job as accounting has it (``sacct``: no output path); None when accounting has no such job.
        Raises SlurmError when accounting cannot answer (e.g. it is disabled)."""

    @abc.abstractmethod
    def reservations(self) -> list[Reservation]:
        """All reservations, with their flags (MAINT ...)."""

    @abc.abstractmethod
    def sacct(self, job_id: str | int) -> list[dict[str, str]]:
        """Accounting rows of the job and its steps, keyed by sacct field name."""

    @abc.abstractmethod
    def submit(self, script_path: str | os.PathLike, args: Sequence[str], script_args: Sequence[str] = ()) -> str:
        """``sbatch --parsable <args> <script> <script_args>``; returns the job id."""

    @abc.abstractmethod
    def cancel(self, job_id: str | int) -> None:
        """Cancel the job."""

    @abc.abstractmethod
    def update_job_nodelist(self, job_id: str | int, nodes: Sequence[str]) -> None:
        """Shrink a running job to ``nodes`` (``scontrol update jobid=J nodelist=...``)."""

    @abc.abstractmethod
    def update_job_excludes(self, job_id: str | int, nodes: Sequence[str]) -> None:
        """Set a pending job's excluded nodes (``scontrol update jobid=J ExcNodeList=...``; none: clear)."""

    @abc.abstractmethod
    def update_node(self, name: str, state: str, reason: str | None = None) -> None:
        """``scontrol update nodename=N state=S [reason=R]`` (DRAIN and DOWN need a reason)."""

    @abc.abstractmethod
    def version(self) -> str:
        """Slurm's version, e.g. ``"22.05.8"``."""
