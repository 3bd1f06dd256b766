"""Pure parsers for Slurm's classic text output (22.05 and 24.11), hostlists and node-state semantics.

Contract:
- Every parser takes the command's stdout as text (and, for messages, the command line that made
  it) and returns plain dataclasses, tuples or dicts. Nothing here runs a process or reads a file.
- Empty output (and Slurm's ``No nodes|jobs|reservations in the system``) is valid: no rows.
- Malformed or unexpected output raises :class:`~tmslurm.core.errors.SlurmParseError` whose message
  names the command and quotes the offending line (truncated). A parser never lets a bare
  ``KeyError``/``IndexError``/``ValueError`` escape.
- Times are printed by Slurm in the local time zone without an offset (``SLURM_TIME_FORMAT=standard``,
  which :mod:`tmslurm.slurm.client` forces); they are returned as naive local ``datetime``.

Hostlists (``n[1-3,5]``) are expanded and compressed by :mod:`tmslurm.slurm.hostlist`, whose two
functions are re-exported here.

Formats handled: ``scontrol [-o] show node|job|res``, ``sacct --parsable2``, ``sbatch --parsable`` and
``sinfo --version`` (the tests' parsers of ``sinfo -N -O``, ``sinfo -T`` and ``squeue`` live beside
them, in tests/unit/slurm_text.py).

Node state classification (:func:`classify`) -- failure wins over maintenance wins over ok:

============  ================================================================================
failure       DOWN, NOT_RESPONDING (``*``), FAIL, FAILING, POWERED_DOWN (``~``), POWERING_DOWN
              (``%``), ERROR, INVAL, FUTURE -- e.g. DOWN+DRAIN and IDLE+DRAIN+NOT_RESPONDING are
              failures: the node is gone (or going) now, whatever was planned for it.
maintenance   DRAIN (any phase: DRAINING, DRAINED), REBOOT_REQUESTED (``@``), REBOOT_ISSUED
              (``^``), MAINT (``$``, an active maintenance reservation), POWER_DOWN (``!``,
              admin-requested power-down pending).
ok            everything else: IDLE, ALLOCATED, MIXED, COMPLETING, RESERVED, PLANNED, UNKNOWN
              (transient while slurmctld starts; a node that never registers becomes DOWN) ...
============  ================================================================================
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from tmslurm.core.errors import SlurmParseError
from tmslurm.slurm.hostlist import compress_hostlist, expand_hostlist  # noqa: F401 (re-exported)

# ----------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------

OK, MAINTENANCE, FAILURE = "ok", "maintenance", "failure"

FAILURE_STATES = frozenset(
    {"DOWN", "NOT_RESPONDING", "FAIL", "FAILING", "POWERED_DOWN", "POWERING_DOWN", "ERROR", "INVAL", "FUTURE"}
)
MAINTENANCE_STATES = frozenset(
    {"DRAIN", "DRAINING", "DRAINED", "REBOOT_REQUESTED", "REBOOT_ISSUED", "MAINT", "POWER_DOWN"}
)

# State suffixes of sinfo's compact/long formats (man sinfo, NODE STATE CODES).
_SUFFIX_FLAGS = {
    "*": "NOT_RESPONDING",
    "~": "POWERED_DOWN",
    "#": "POWERING_UP",
    "!": "POWER_DOWN",
    "%": "POWERING_DOWN",
    "$": "MAINT",
    "@": "REBOOT_REQUESTED",
    "^": "REBOOT_ISSUED",
    "-": "PLANNED",
}
# sinfo %t abbreviations -> Slurm's long names.
_COMPACT = {
    "ALLOC": "ALLOCATED",
    "MIX": "MIXED",
    "COMP": "COMPLETING",
    "DRNG": "DRAINING",
    "UNK": "UNKNOWN",
    "FUTR": "FUTURE",
    "RESV": "RESERVED",
    "NPC": "PERFCTRS",
    "POW_DN": "POWER_DOWN",
    "POW_UP": "POWERING_UP",
    "NO_RESPOND": "NOT_RESPONDING",
}
_SUFFIX_CHARS = "".join(_SUFFIX_FLAGS)
_STATE_WORD = re.compile(r"^[A-Z][A-Z_]*$")
_MAX_QUOTE = 160


@dataclass(frozen=True)
class NodeInfo:
    """One node as Slurm reports it. ``flags`` holds every state word but the base state."""

    name: str
    state: str  # full, upper case, e.g. "MIXED+DRAIN+REBOOT_REQUESTED"
    base_state: str  # e.g. "MIXED"
    flags: frozenset[str]  # e.g. {"DRAIN", "REBOOT_REQUESTED"}
    reason: str = ""  # without Slurm's " [user@time]" suffix
    raw: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    @property
    def states(self) -> frozenset[str]:
        """Base state and flags together."""
        return self.flags | {self.base_state}

    @property
    def drain_phase(self) -> str | None:
        """``"draining"`` (jobs still on it), ``"drained"`` (empty) or None when not draining."""
        if not self.states & {"DRAIN", "DRAINING", "DRAINED"}:
            return None
        busy = self.states & {"ALLOCATED", "MIXED", "COMPLETING", "DRAINING"}
        return "draining" if busy else "drained"


@dataclass(frozen=True)
class JobInfo:
    """One job from ``scontrol show job``. ``nodes`` is ``node_list`` expanded."""

    job_id: str
    state: str
    node_list: str
    nodes: list[str] = field(hash=False)
    batch_host: str | None
    restarts: int
    requeue: bool
    reason: str
    raw: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    end_time: datetime | None = None
    """When the job's time limit runs out (``EndTime``; None while Slurm does not know, e.g. pending)."""


@dataclass(frozen=True)
class Reservation:
    """One reservation. ``flags`` is empty when the source (``sinfo -T``) does not print them."""

    name: str
    start_time: datetime
    end_time: datetime
    nodes: list[str] = field(hash=False)
    flags: frozenset[str] = frozenset()
    node_list: str = ""
    state: str = ""
    raw: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    @property
    def is_maint(self) -> bool:
        return "MAINT" in self.flags


# ----------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------


def _quote(line: str) -> str:
    line = line.rstrip("\n")
    return repr(line if len(line) <= _MAX_QUOTE else line[:_MAX_QUOTE] + "...")


def parse_error(cmd: str, line: str, why: str) -> SlurmParseError:
    """A :class:`SlurmParseError` naming the command, the reason and the (truncated) line."""
    return SlurmParseError(f"cannot parse output of `{cmd}`: {why}; offending line: {_quote(line)}")


# ----------------------------------------------------------------------------------------------
# Node states
# ----------------------------------------------------------------------------------------------


def parse_state(text: str) -> tuple[str, frozenset[str]]:
    """Split a state like ``MIXED+DRAIN``, ``idle+drain``, ``down*`` or ``drng`` into (base, flags).

    Words are upper-cased, sinfo abbreviations expanded and suffix symbols (``*~#!%$@^-``) turned
    into flags. Raises ValueError for an empty state or a word that is not ``[A-Za-z_]+``.
    """
    words: list[str] = []
    flags: set[str] = set()
    for token in text.strip().split("+"):
        stripped = token.rstrip(_SUFFIX_CHARS)
        flags.update(_SUFFIX_FLAGS[sym] for sym in token[len(stripped) :])
        word = _COMPACT.get(stripped.upper(), stripped.upper())
        if not _STATE_WORD.match(word):
            raise ValueError(f"bad node state {text!r}")
        words.append(word)
    base = words[0]
    flags.update(words[1:])
    if base in ("DRAINING", "DRAINED"):
        flags.add("DRAIN")
    return base, frozenset(flags - {base})


def classify(node: NodeInfo | str | Iterable[str]) -> str:
    """``"ok"``, ``"maintenance"`` or ``"failure"`` for a node or its states (see module table).

    Accepts a NodeInfo, a state string (``"IDLE+DRAIN"``, ``"down*"``) or an iterable
    of state words. Failure wins over maintenance, maintenance over ok. A malformed state string
    raises ValueError (parsers have already rejected those with SlurmParseError).
    """
    if isinstance(node, NodeInfo):
        states = node.states
    elif isinstance(node, str):
        states = _state_words(node)
    else:
        states = frozenset(w for s in node for w in _state_words(s))
    if states & FAILURE_STATES:
        return FAILURE
    if states & MAINTENANCE_STATES:
        return MAINTENANCE
    return OK


def _state_words(word: str) -> frozenset[str]:
    base, flags = parse_state(word)
    return flags | {base}


# ----------------------------------------------------------------------------------------------
# scontrol show node|job|res (one record per block, or per line with -o)
# ----------------------------------------------------------------------------------------------

_KEY_VALUE = re.compile(r"^([A-Za-z][A-Za-z0-9_/:.]*)=(.*)$", re.S)
# Keys whose value may contain spaces; in multi-line output each sits alone on its line.
_FREE_TEXT = (
    "Reason",
    "Comment",
    "Extra",
    "OS",
    "Command",
    "WorkDir",
    "StdErr",
    "StdIn",
    "StdOut",
    "AdminComment",
    "SystemComment",
)
_EMPTY = re.compile(r"^No \w+ in the system$")
_NULL = ("", "(null)", "None", "N/A")


def scontrol_records(text: str, first_key: str, cmd: str) -> list[tuple[str, dict[str, str]]]:
    """Split ``scontrol show`` output into (first line, {key: value}) records starting at ``first_key=``."""
    blocks: list[list[str]] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or _EMPTY.match(stripped):
            continue
        if stripped.startswith(first_key + "="):
            blocks.append([stripped])
        elif not blocks:
            raise parse_error(cmd, line, f"expected a record starting with {first_key}=")
        else:
            blocks[-1].append(stripped)
    return [(block[0], _record_fields(block, cmd)) for block in blocks]


def _record_fields(lines: list[str], cmd: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in lines:
        m = _KEY_VALUE.match(line)
        if not m:
            raise parse_error(cmd, line, "expected Key=Value pairs")
        if m.group(1) in _FREE_TEXT:
            fields[m.group(1)] = m.group(2).strip()
            continue
        _split_pairs(line, fields)
    return fields


def _split_pairs(line: str, fields: dict[str, str]) -> None:
    key = None
    for token in line.split():
        m = _KEY_VALUE.match(token)
        if m:
            key = m.group(1)
            fields[key] = m.group(2)
        elif key is not None:  # a value with spaces, e.g. OS=Linux 6.1 #1 SMP in -o output
            fields[key] = f"{fields[key]} {token}"


def _require(fields: Mapping[str, str], keys: Iterable[str], cmd: str, line: str) -> None:
    missing = [k for k in keys if k not in fields]
    if missing:
        raise parse_error(cmd, line, f"record lacks {', '.join(missing)} (truncated output?)")


def _strip_reason_stamp(reason: str) -> str:
    return re.sub(r"\s*\[[^\[\]@]*@[^\[\]]*\]$", "", reason).strip()


def _null(value: str) -> str:
    return "" if value.strip() in _NULL else value.strip()


def _nodes(node_list: str, cmd: str, line: str) -> list[str]:
    try:
        return expand_hostlist(node_list)
    except SlurmParseError as exc:
        raise parse_error(cmd, line, str(exc)) from None


def parse_nodes(text: str, cmd: str = "scontrol show node") -> list[NodeInfo]:
    """Parse ``scontrol show node`` or ``scontrol -o show node`` output."""
    nodes = []
    for line, f in scontrol_records(text, "NodeName", cmd):
        _require(f, ("NodeName", "State"), cmd, line)
        try:
            base, flags = parse_state(f["State"])
        except ValueError as exc:
            raise parse_error(cmd, line, str(exc)) from None
        reason = _strip_reason_stamp(_null(f.get("Reason", "")))
        nodes.append(NodeInfo(f["NodeName"], f["State"], base, flags, reason, f))
    return nodes


def parse_jobs(text: str, cmd: str = "scontrol show job") -> list[JobInfo]:
    """Parse ``scontrol show job`` or ``scontrol -o show job`` output (one or more jobs)."""
    jobs = []
    for line, f in scontrol_records(text, "JobId", cmd):
        _require(f, ("JobId", "JobState", "Restarts"), cmd, line)
        node_list = _null(f.get("NodeList", ""))
        if not f["Restarts"].isdigit() or f.get("Requeue", "0") not in ("0", "1"):
            raise parse_error(cmd, line, "Restarts must be a count and Requeue 0 or 1")
        jobs.append(
            JobInfo(
                job_id=f["JobId"],
                state=f["JobState"],
                node_list=node_list,
                nodes=_nodes(node_list, cmd, line),
                batch_host=_null(f.get("BatchHost", "")) or None,
                restarts=int(f["Restarts"]),
                requeue=f.get("Requeue") == "1",
                reason=_null(f.get("Reason", "")),
                raw=f,
                end_time=_end_time(f, cmd, line),
            )
        )
    return jobs


def _end_time(f: Mapping[str, str], cmd: str, line: str) -> datetime | None:
    try:
        return parse_time(f.get("EndTime", "Unknown"))
    except ValueError:
        raise parse_error(cmd, line, f"EndTime={f.get('EndTime')!r} is not a time") from None


def parse_time(value: str) -> datetime | None:
    """``2026-12-02T10:44:06`` -> naive local datetime; ``Unknown``/``None``/``N/A``/empty -> None.

    Raises ValueError for anything else.
    """
    if value.strip() in (*_NULL, "Unknown"):
        return None
    return datetime.strptime(value.strip(), "%Y-%m-%dT%H:%M:%S")


def _times(start: str, end: str, cmd: str, line: str) -> tuple[datetime, datetime]:
    try:
        t0, t1 = parse_time(start), parse_time(end)
    except ValueError:
        t0 = t1 = None
    if t0 is None or t1 is None:
        raise parse_error(
            cmd,
            line,
            f"bad start/end time {start!r}/{end!r} (need YYYY-MM-DDTHH:MM:SS;"
            " is SLURM_TIME_FORMAT set to something else?)",
        )
    return t0, t1


def parse_reservations(text: str, cmd: str = "scontrol show res") -> list[Reservation]:
    """Parse ``scontrol show res`` or ``scontrol -o show res`` output."""
    out = []
    for line, f in scontrol_records(text, "ReservationName", cmd):
        _require(f, ("ReservationName", "StartTime", "EndTime", "Nodes"), cmd, line)
        start, end = _times(f["StartTime"], f["EndTime"], cmd, line)
        node_list = _null(f["Nodes"])
        flags = frozenset(x.strip().upper() for x in _null(f.get("Flags", "")).split(",") if x.strip())
        out.append(
            Reservation(
                f["ReservationName"], start, end, _nodes(node_list, cmd, line), flags, node_list, f.get("State", ""), f
            )
        )
    return out


# ----------------------------------------------------------------------------------------------
# sinfo
# ----------------------------------------------------------------------------------------------


def parse_version(text: str, cmd: str = "sinfo --version") -> str:
    """``slurm 22.05.8`` -> ``"22.05.8"``."""
    m = re.fullmatch(r"\s*slurm(?:-wlm)?\s+(\d+\.\d+(?:\.\d+)?\S*)\s*", text)
    if not m:
        raise parse_error(cmd, text, "expected 'slurm <major>.<minor>.<micro>'")
    return m.group(1)


# ----------------------------------------------------------------------------------------------
# squeue, sacct, sbatch
# ----------------------------------------------------------------------------------------------


def parse_sacct(text: str, cmd: str = "sacct --parsable2") -> list[dict[str, str]]:
    """Parse ``sacct --parsable2`` (with its header line) into one dict per row, keyed by header."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    header = lines[0].split("|")
    if not all(re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", h) for h in header):
        raise parse_error(cmd, lines[0], "expected a header line of field names joined by |")
    rows = []
    for line in lines[1:]:
        cols = line.split("|")
        if len(cols) != len(header):
            raise parse_error(cmd, line, f"expected {len(header)} fields {header}, got {len(cols)}")
        rows.append(dict(zip(header, cols)))
    return rows


def parse_sbatch_parsable(text: str, cmd: str = "sbatch --parsable") -> str:
    """``"123"`` or ``"123;cluster"`` -> ``"123"``."""
    m = re.fullmatch(r"\s*(\d+)(?:;\S+)?\s*", text)
    if not m:
        raise parse_error(cmd, text, "expected a job id ('<id>' or '<id>;<cluster>')")
    return m.group(1)
