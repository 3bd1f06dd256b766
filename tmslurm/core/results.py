"""What a run leaves for its readers, typed: ``summary.json`` (:class:`Summary`) and the records of
``events.jsonl`` (:class:`JournalEntry`), with the events they carry (:class:`Event`).

Contract: :func:`load_summary` and :func:`load_journal` read the file and return the typed value.
A missing or unreadable file, a line of ``events.jsonl`` that is not a JSON object (a torn line too) or
a value of the wrong type raises ``error`` (a :class:`~tmslurm.core.errors.TmslurmError` type, the
caller's own if it has one) naming the file (and the line) and the first bad fields; nothing else is
raised for bad input. :meth:`Summary.parse` and :meth:`JournalEntry.parse` do the same for an object
already decoded.

Which unknown fields are accepted follows what the producers write:
- :class:`Summary` and its parts refuse a field they do not declare (the controller's
  :mod:`~tmslurm.controller.summary` writes a fixed set); fields a summary of an older version may lack
  have defaults.
- :class:`Event` declares the fields every event has and keeps the others (its parts, which depend
  on its kind: :data:`~tmslurm.controller.events.PARTS`, a restart's, a shadow's) as extras, read with
  :meth:`Event.part`.
- :class:`JournalEntry` declares ``t``, ``type`` and the fields several types share; the rest of a
  record depends on its type and is kept as extras (:meth:`JournalEntry.extra`).
Models are frozen. This module imports no other tmslurm layer than core.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from tmslurm.core.errors import TmslurmError
from tmslurm.core.jsonfile import read_json_object

PAUSE_PARTS = (
    "before_fault_s",
    "detect_s",
    "pick_s",
    "phase1_s",
    "phase2_s",
    "transfer_s",
    "verify_wait_s",
    "first_step_s",
)
"""The parts of a switch's or recovery's downtime that people are shown, in the order they happen
(the controller's event record may carry more, e.g. ``apply_s``, ``verify_s``, which overlap these)."""

M = TypeVar("M", bound="Record")


def _first_errors(exc: ValidationError, most: int = 3) -> str:
    """``field.path: message`` of the first bad fields, one line."""
    errs = exc.errors()
    parts = [f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in errs[:most]]
    return "; ".join(parts) + (f" (and {len(errs) - most} more)" if len(errs) > most else "")


class Record(BaseModel):
    """A fixed record: unknown fields are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def parse(cls: type[M], data: Any, where: str, error: type[TmslurmError] = TmslurmError) -> M:
        """``data`` as this record; ``error`` naming ``where`` and the first bad fields otherwise."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise error(f"{where}: not a valid {cls.__name__.lower()}: {_first_errors(exc)}") from None

    def record(self) -> dict[str, Any]:
        """The fields as they were written (unset defaults left out), extras included: JSON-ready."""
        return self.model_dump(mode="json", exclude_unset=True)


class OpenRecord(Record):
    """A record whose producers write fields that vary (by kind or type): unknown ones are kept."""

    model_config = ConfigDict(extra="allow", frozen=True)

    def extra(self, key: str) -> Any:
        """A field this model does not declare, None when absent."""
        return (self.model_extra or {}).get(key)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


# ---- events -------------------------------------------------------------------------------------
class Event(OpenRecord):
    """One interruption of the run (a switch, a restart, a requeue, a controller restart)."""

    kind: str
    """``planned``, ``unexpected``, ``restart``, ``controller_restart``, a job boundary, ..."""
    cause: str | None = None
    epoch: int | None = None
    ranks: list[int] = []
    node: str | None = None
    """The nodes it took ranks from, comma-separated."""
    standby: str | None = None
    """The standbys that took the ranks over, comma-separated."""
    status: str | None = None
    """``open``, ``switched``, ``done`` (``cancelled`` never reaches the summary)."""
    notice_t: float | None = None
    switched_t: float | None = None
    first_step_t: float | None = None
    last_commit_t: float | None = None
    target_step: int | None = None
    from_checkpoint_step: int | None = None
    lost_steps: int | None = None
    gap_s: float | None = None
    downtime_s: float | None = None
    pause_s: float | None = None
    other_s: float | None = None

    def part(self, name: str) -> float | None:
        """A part of the event (``detect_s``, ``phase2_s``, ..., or a declared duration) as a finite
        number, None when absent, null or not numeric."""
        value = getattr(self, name) if name in type(self).model_fields else self.extra(name)
        return _number(value)

    def has(self, name: str) -> bool:
        """Whether the producer wrote ``name`` (even as null)."""
        return name in self.model_fields_set or name in (self.model_extra or {})


# ---- summary.json -------------------------------------------------------------------------------
class RunLayout(Record):
    dp: int
    pp: int
    tp: int = 1
    zero: int = 0


class StepRecord(Record):
    """One committed step of the step log."""

    step: int
    t_end: float
    """Epoch seconds of the commit."""
    dt: float
    """The slowest rank's step time."""
    loss: float | None = None
    epoch: int = 0
    peak_rss_mb: dict[int, float] = {}
    """Ranks whose peak resident set changed since it was last logged (MiB)."""
    commit_s: float | None = None
    ckpt_s: float | None = None


class StandbyRecord(Record):
    id: str
    node: str | None = None
    roles: dict[str, dict[str, Any]] = {}
    """Each shape class the standby is warm for, with its warm-up report (the agent's, variable)."""


class Memory(Record):
    standby_rss_mb: float | None = None
    standby_peak_rss_mb: float | None = None
    largest_rank_peak_rss_mb: float | None = None


class PendingNotice(Record):
    """A notice the run had not acted on when it ended (:class:`~tmslurm.core.notices.Notice`)."""

    kind: str
    node: str | None = None
    rank: int | None = None
    source: str
    reason: str = ""
    deadline: float | None = None
    slurm_state: str = ""
    time: float
    role: str = ""


class JobRecord(Record):
    """One Slurm job of the run's chain (the last one has ``ended_by`` None)."""

    incarnation: int
    job_id: str | None = None
    ended_by: str | None = None
    cause: str | None = None
    ended_at_step: int | None = None
    lost_steps: int | None = None


class StopRecord(Record):
    """How a run ended by ``tmslurm stop`` stopped."""

    checkpoint_step: int
    """The step of its last checkpoint, taken with its final commit: ``train.resume_from`` goes on
    from there."""


class Summary(Record):
    """``summary.json``: what a finished run reports (see :mod:`tmslurm.controller.summary`)."""

    run_id: str
    layout: RunLayout
    steps: int
    """Steps committed: the step count the run ended at."""
    resumed_from_step: int = 0
    final_params_sha256: str | None
    """None when the replicas diverged (or the run failed before its end)."""
    final_state_sha256: str | None
    stage_digests: list[str | None] = []
    stage_state_digests: list[str | None] = []
    replicas_equal: bool = True
    diverging: list[Any] = []
    replica_mismatch_steps: list[int] = []
    loss_first: float | None = None
    loss_last: float | None = None
    median_step_s: float | None = None
    state_bytes: dict[int, int] = {}
    optimizer_bytes: dict[int, int] = {}
    buddy_cost: dict[int, dict[str, Any]] = {}
    step_log: list[StepRecord] = []
    """Empty in a summary trimmed to its events (test fixtures)."""
    events: list[Event]
    standbys: list[StandbyRecord] = []
    memory: Memory = Memory()
    pending_notices: list[PendingNotice] = []
    gray: dict[str, Any] | None = None
    """The gray-failure watch's report (its settings, evictions, peak ratios), None when it is off."""
    links: dict[str, Any] | None = None
    """The link probes' report, None when they are off."""
    restart_mode: str = "tmslurm"
    failed: str | None = None
    """Why the run failed, None when it did not."""
    stopped: StopRecord | None = None
    """Set when ``tmslurm stop`` ended the run (it checkpointed first), None otherwise."""
    main_job_id: str | None = None
    spare_job_ids: list[str] = []
    jobs: list[JobRecord] = []

    @property
    def finished_ok(self) -> bool:
        """The run ended with a final hash (its replicas agreed) and did not fail."""
        return self.final_params_sha256 is not None and self.failed is None


# ---- events.jsonl -------------------------------------------------------------------------------
class JournalEntry(OpenRecord):
    """One line of ``events.jsonl``: its time and type, the fields several types share, and the
    type's own fields as extras."""

    t: float
    type: str
    kind: str | None = None
    epoch: int | None = None
    step: int | None = None
    rank: int | None = None
    ranks: list[int] | None = None
    node: str | None = None
    nodes: list[str] | None = None
    agent: str | None = None
    pid: int | None = None
    index: int | None = None
    """A fault's index in ``faults``."""
    from_step: int | None = None
    """A restart's or a resumed job's checkpoint step."""
    lost_steps: int | None = None
    redo_steps: int | None = None

    def event(self) -> Event:
        """The event an ``event``/``event_begin``/``event_open`` line carries (the line without ``t`` and ``type``)."""
        data = self.record()
        data.pop("t", None)
        data.pop("type", None)
        return Event.model_validate(data)


def load_summary(path: Path, error: type[TmslurmError] = TmslurmError) -> Summary:
    """The run summary in ``path``; ``error`` naming the file otherwise (see the module's contract)."""
    return Summary.parse(read_json_object(path, "run summary", error), str(path), error)


def load_journal(path: Path, error: type[TmslurmError] = TmslurmError) -> list[JournalEntry]:
    """Every record of an ``events.jsonl``; ``error`` naming the file and line otherwise."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        raise error(f"{path}: missing (is this the run directory of a run?)") from None
    except OSError as exc:
        raise error(f"{path}: unreadable: {exc}") from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise error(f"{path}:{n}: not a JSON object: {line[:120]!r}")
        out.append(JournalEntry.parse(data, f"{path}:{n}", error))
    return out
