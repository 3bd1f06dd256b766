"""Parsers of Slurm text that only the tests read: ``sinfo -N -h -O NodeList:W,StateComplete:W,Reason:W``
(fixed width), ``sinfo -T`` and ``squeue -h -o <fields joined by |>``.

The product reads Slurm through ``scontrol`` (:mod:`tmslurm.slurm.parse`); these read the recorded
sinfo and squeue samples of tests/fixtures/slurm, which drive the watcher tests with a second view of
the same node states. They follow :mod:`tmslurm.slurm.parse`'s contract: malformed output raises
:class:`~tmslurm.core.errors.SlurmParseError` naming the command and quoting the line.
"""

from __future__ import annotations

from typing import NamedTuple

from tmslurm.slurm.parse import NodeInfo, Reservation, _nodes, _null, _times, parse_error, parse_state

# Slurm's base states, then the long names sinfo uses as a whole state; the first found is the base.
_BASE_ORDER = (
    "DOWN",
    "IDLE",
    "ALLOCATED",
    "MIXED",
    "ERROR",
    "FUTURE",
    "UNKNOWN",
    "DRAINED",
    "DRAINING",
    "FAIL",
    "FAILING",
    "MAINT",
    "RESERVED",
    "PLANNED",
    "POWERED_DOWN",
)


class SinfoNode(NamedTuple):
    """One row of ``sinfo -N -h -O NodeList,StateComplete,Reason``; unpacks as (node, states, reason)."""

    node: str
    states: frozenset[str]
    reason: str

    def to_node_info(self) -> NodeInfo:
        """The row as a :class:`NodeInfo` (``raw`` empty), e.g. to feed the watcher from sinfo."""
        base = next((s for s in _BASE_ORDER if s in self.states), None) or sorted(self.states)[0]
        flags = frozenset(self.states - {base})
        state = "+".join([base, *sorted(flags)])
        return NodeInfo(self.node, state, base, flags, self.reason)


SINFO_NODE_WIDTHS = (40, 60, 80)


def sinfo_node_args(widths: tuple[int, int, int] = SINFO_NODE_WIDTHS) -> list[str]:
    """The sinfo arguments whose output :func:`parse_sinfo_nodes` reads with the same widths."""
    w1, w2, w3 = widths
    return ["-N", "-h", "-O", f"NodeList:{w1},StateComplete:{w2},Reason:{w3}"]


def parse_sinfo_nodes(
    text: str,
    widths: tuple[int, int, int] = SINFO_NODE_WIDTHS,
    cmd: str = "sinfo -N -h -O NodeList,StateComplete,Reason",
) -> list[SinfoNode]:
    """Parse fixed-width ``sinfo -N -h -O NodeList:W1,StateComplete:W2,Reason:W3`` rows.

    ``-O`` left-justifies each value in its column and cuts what does not fit (default width 20,
    too narrow for ``allocated+drain+reboot_requested``), so a node or state that fills its column
    may be truncated and is rejected. Reason ``none`` (sinfo's "no reason") becomes "".
    A node in several partitions appears once per partition.
    """
    w1, w2, _ = widths
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        node, state, reason = line[:w1], line[w1 : w1 + w2], line[w1 + w2 :].strip()
        if not node.strip() or " " in node.strip() or not state.strip() or " " in state.strip():
            raise parse_error(cmd, line, f"expected columns NodeList:{w1},StateComplete:{w2},Reason")
        if not node.endswith(" ") or (len(state) == w2 and not state.endswith(" ")):
            raise parse_error(cmd, line, "a value fills its column and may be truncated; widen it")
        try:
            base, flags = parse_state(state)
        except ValueError as exc:
            raise parse_error(cmd, line, str(exc)) from None
        rows.append(SinfoNode(node.strip(), flags | {base}, "" if reason == "none" else reason))
    return rows


def parse_sinfo_reservations(text: str, cmd: str = "sinfo -T") -> list[Reservation]:
    """Parse ``sinfo -T`` (header optional). Flags are not printed by sinfo: they come back empty."""
    out = []
    for line in text.splitlines():
        cols = line.split(None, 5)
        if not cols or cols[0] == "RESV_NAME":
            continue
        if len(cols) < 5:
            raise parse_error(cmd, line, "expected RESV_NAME STATE START_TIME END_TIME DURATION NODELIST")
        start, end = _times(cols[2], cols[3], cmd, line)
        node_list = _null(cols[5]) if len(cols) == 6 else ""
        out.append(Reservation(cols[0], start, end, _nodes(node_list, cmd, line), frozenset(), node_list, cols[1]))
    return out


SQUEUE_FORMAT = "%i|%T|%N|%D|%r"
SQUEUE_FIELDS = ("job_id", "state", "node_list", "num_nodes", "reason")


def parse_squeue(
    text: str, fields: tuple[str, ...] = SQUEUE_FIELDS, cmd: str = f"squeue -h -o {SQUEUE_FORMAT}"
) -> list[dict[str, str]]:
    """Parse ``squeue -h -o`` with ``|``-joined fields; the last field may itself contain ``|``."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cols = line.split("|", len(fields) - 1)
        if len(cols) != len(fields):
            raise parse_error(cmd, line, f"expected {len(fields)} '|'-separated fields {fields}")
        rows.append(dict(zip(fields, cols)))
    return rows
