"""Which run a Slurm job belongs to: the run tag in every job's ``--comment``, and a job id -> run directory.

Contract:
- :func:`run_comment` is the comment every job of a run carries: ``tmslurm run=<name> dir=<abs path>``.
  Both values are percent-encoded (:func:`urllib.parse.quote`: spaces, quotes, ``|``, ``%`` and
  control characters become ``%XX``), so the comment is three whitespace-free words that survive
  ``#SBATCH`` quoting, ``scontrol -o`` and ``sacct --parsable2``; ordinary paths read unchanged.
- :func:`parse_run_tag` reads a comment back: a :class:`RunTag`, or None when the comment is not a
  tmslurm one. A comment of an older tmslurm (``tmslurm run=<name>``, no ``dir=``) gives a tag whose
  ``dir`` is None.
- :func:`parse_job_record` (``scontrol show job J``, multi-line: ``Comment=`` sits alone on its line)
  and :func:`parse_sacct_record` (``sacct -X -j J --parsable2 -o SACCT_RECORD_FIELDS``) give a
  :class:`JobRecord`, or None when the output holds no such job; malformed output raises
  :class:`~tmslurm.core.errors.SlurmParseError`. Nothing here runs a process.
- :func:`run_dir_of` derives the run directory from a record: the tag's ``dir=``, else (an older
  tmslurm job) submitit's output file ``<run_dir>/submitit/<id>_0_log.out`` when that directory has
  the tag's run name. It raises :class:`~tmslurm.core.errors.TmslurmError` naming the job for a job that
  is not a tmslurm job or whose record does not say where its run is.
- :func:`resolve_job` asks Slurm through a :class:`~tmslurm.slurm.api.SlurmClient` (any
  :class:`RecordSource`): slurmctld first,
  then accounting (a job slurmctld forgot). Every failure is a TmslurmError naming the job: not a
  job id, unknown to Slurm, Slurm's commands missing or failing (the client's message names the
  command), not a tmslurm job, or a run directory that does not exist on this machine.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import quote, unquote

from tmslurm.core.errors import SlurmError, TmslurmError
from tmslurm.slurm.parse import parse_error, scontrol_records

_JOB_ID = re.compile(r"^\d+(?:[_+]\d+)?$")
_SAFE = "/:@+,.~_-="
_TAG = re.compile(r"^tmslurm run=(\S+)(?: dir=(\S+))?$")
SACCT_RECORD_FIELDS = ("JobID", "State", "WorkDir", "Comment")
"""``sacct -o`` fields of :func:`parse_sacct_record`; Comment last (free text: it may hold ``|``)."""


@dataclass(frozen=True)
class RunTag:
    """The run named in a job's comment; ``dir`` is None for a comment without ``dir=``."""

    name: str
    dir: Path | None


@dataclass(frozen=True)
class JobRecord:
    """What Slurm says of a job that locates its run: comment, working directory, standard output
    (``""`` when Slurm does not say, e.g. ``sacct`` has no output path)."""

    job_id: str
    state: str
    comment: str
    work_dir: str
    std_out: str


def run_comment(run_dir: Path) -> str:
    """The ``--comment`` of every job of a run (``squeue -o '%.10i %.16j %k'`` shows which run a spare serves)."""
    path = os.path.abspath(run_dir)
    return f"tmslurm run={quote(Path(path).name, safe=_SAFE)} dir={quote(path, safe=_SAFE)}"


def parse_run_tag(comment: str) -> RunTag | None:
    """``tmslurm run=<name>[ dir=<path>]`` -> RunTag; anything else (no comment, another tool's) -> None."""
    m = _TAG.match(comment.strip())
    if not m:
        return None
    return RunTag(unquote(m.group(1)), Path(unquote(m.group(2))) if m.group(2) else None)


def parse_job_record(text: str, job_id: str, cmd: str = "scontrol show job") -> JobRecord | None:
    """The job ``job_id`` (or, for an array/het job asked by its id, the first record) in multi-line
    ``scontrol show job`` output; None when there is none."""
    records = scontrol_records(text, "JobId", cmd)
    if not records:
        return None
    line, f = next(((line, f) for line, f in records if f.get("JobId") == job_id), records[0])
    if "JobState" not in f:
        raise parse_error(cmd, line, "record lacks JobState (truncated output?)")
    return JobRecord(
        f["JobId"],
        f["JobState"],
        _value(f.get("Comment", "")),
        _value(f.get("WorkDir", "")),
        _value(f.get("StdOut", "")),
    )


def parse_sacct_record(text: str, job_id: str, cmd: str = "sacct --parsable2") -> JobRecord | None:
    """The allocation row of ``job_id`` in ``sacct -X --parsable2 -o JobID,State,WorkDir,Comment``
    (header line first); None when accounting has no such job."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    if lines[0].split("|") != list(SACCT_RECORD_FIELDS):
        raise parse_error(cmd, lines[0], f"expected the header {'|'.join(SACCT_RECORD_FIELDS)}")
    rows = [line.split("|", len(SACCT_RECORD_FIELDS) - 1) for line in lines[1:]]
    for row in rows:
        if len(row) != len(SACCT_RECORD_FIELDS):
            raise parse_error(cmd, "|".join(row), f"expected {len(SACCT_RECORD_FIELDS)} '|'-separated fields")
    match = [r for r in rows if r[0] == job_id] or rows
    if not match:
        return None
    jid, state, work_dir, comment = match[-1]  # a requeued job has one row per run: the last is current
    return JobRecord(jid, state, _value(comment), _value(work_dir), "")


def run_dir_of(record: JobRecord) -> Path:
    """The run directory of a tmslurm job (see the module's contract)."""
    tag = parse_run_tag(record.comment)
    if tag is None:
        said = f"its comment is {record.comment!r}" if record.comment else "it has no comment"
        raise TmslurmError(
            f"Slurm job {record.job_id} is not a tmslurm job ({said}; tmslurm jobs carry "
            "'tmslurm run=<name> dir=<run dir>'). Pass the run directory instead"
        )
    if tag.dir is not None:
        return tag.dir
    out = Path(record.std_out) if record.std_out else None
    if out is not None and out.is_absolute() and out.parent.name == "submitit" and out.parent.parent.name == tag.name:
        return out.parent.parent
    raise TmslurmError(
        f"Slurm job {record.job_id} belongs to run {tag.name!r}, but its record does not say where "
        "the run directory is (a tmslurm older than dir= in the comment). Pass the run directory instead"
    )


class RecordSource(Protocol):
    """What :func:`resolve_job` asks: the two record queries of :class:`~tmslurm.slurm.api.SlurmClient`."""

    def job_record(self, job_id: str | int) -> JobRecord | None: ...

    def accounted_job(self, job_id: str | int) -> JobRecord | None: ...


def resolve_job(client: RecordSource, job_id: str) -> Path:
    """The run directory of Slurm job ``job_id`` (the main job or any spare of the run)."""
    if not _JOB_ID.match(job_id):
        raise TmslurmError(f"{job_id!r} is not a Slurm job id (e.g. 1234)")
    try:
        record = client.job_record(job_id) or _accounted(client, job_id)
    except SlurmError as exc:
        raise TmslurmError(f"cannot ask Slurm about job {job_id}: {exc}") from None
    path = run_dir_of(record)
    if not path.is_dir():
        raise TmslurmError(
            f"Slurm job {job_id} belongs to the run directory {path}, which does not exist on this "
            "machine (a file system it does not mount?)"
        )
    return path


def _accounted(client: RecordSource, job_id: str) -> JobRecord:
    """A job slurmctld does not know: ask accounting."""
    try:
        record = client.accounted_job(job_id)
    except SlurmError as exc:
        raise TmslurmError(
            f"Slurm job {job_id} is unknown to slurmctld, and accounting could not be asked: {exc}"
        ) from None
    if record is None:
        raise TmslurmError(f"Slurm job {job_id} is unknown to Slurm (neither slurmctld nor accounting knows it)")
    if not record.comment:
        raise TmslurmError(
            f"Slurm job {job_id} has ended and accounting keeps no comment for it (slurmdbd stores "
            "comments only with AccountingStoreFlags=job_comment). Pass the run directory instead"
        )
    return record


def _value(text: str) -> str:
    return "" if text.strip() in ("", "(null)", "None", "N/A") else text.strip()
