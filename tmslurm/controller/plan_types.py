"""The two plans the controller carries out: a planned switch and a recovery.

Contract: a :class:`Move` names one rank's joiner (and state source); a :class:`PlannedSwitch` moves ranks that must
leave (a notice) to warm standbys in two phases: ``waiting`` names who still has to report phase 1 (``ready`` when
empty), ``applied`` once a commit decision carried it, then ``waiting`` names the leavers and joiners still to finish. A
:class:`Recovery` replaces dead ranks: first it waits for every alive rank's ``aborted`` report
(``statuses``) until ``deadline``, then (``applied``) for ``recovered`` / ``joined``. Both carry the
epoch they rebuild groups at, their moves, the groups to rebuild, their timestamps and measured
parts, and the event record they fill in (``event``). Plain data: no I/O, nothing raised.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tmslurm.wire.messages import Join, Prepare


@dataclass
class Move:
    """One rank's move: who joins in its place and, after a failure, which DP peer sends its state."""

    rank: int
    joiner: str
    source: int | None = None

    @property
    def xfer(self) -> str:
        return f"xfer/r{self.rank}"


@dataclass
class Plan:
    """What a switch rebuilds: the epoch (new group generation), the moves, the groups. The
    controller's :class:`PlannedSwitch` and :class:`Recovery` have these fields too."""

    kind: str
    epoch: int
    moves: list[Move]
    groups: list[str]

    @property
    def ranks(self) -> list[int]:
        return [m.rank for m in self.moves]


@dataclass
class _Plan:
    epoch: int
    moves: list[Move]
    groups: list[str]
    reason: str
    waiting: set[str] = field(default_factory=set)
    applied: bool = False
    times: dict[str, float] = field(default_factory=dict)
    parts: dict[str, float] = field(default_factory=dict)
    event: dict[str, Any] | None = None
    target_step: int | None = None
    node: str | None = None

    @property
    def ranks(self) -> list[int]:
        return [m.rank for m in self.moves]

    def joiners(self) -> set[str]:
        return {m.joiner for m in self.moves if m.joiner}

    def part(self, name: str, seconds: float | None) -> None:
        """Keep the slowest participant's time for a part."""
        if seconds is not None:
            self.parts[name] = max(self.parts.get(name, 0.0), float(seconds))


@dataclass
class PlannedSwitch(_Plan):
    kind: str = "planned"
    source: str = ""
    ready: bool = False
    deferred: dict[int | str, Prepare | Join] = field(default_factory=dict)
    """switch_mode=full: the phase-1 messages (by rank, or joiner's agent id),
    sent only with the commit that applies the switch."""
    bytes: int = 0
    shadow: bool = False
    """Each joiner follows its leaver as a live shadow until the switch (no state moves in the pause)."""
    shadow_pending: set[str] = field(default_factory=set)
    """Joiners that have not yet reported ``shadow_ready``."""
    shadow_until: float = 0.0
    """Wall time after which the switch goes ahead without waiting for every shadow to catch up
    (the rest of the leaver's state then travels in the pause, still in order)."""

    def may_switch(self, now: float) -> bool:
        """Ready for the commit that applies it: phase 1 done and, with shadows, caught up (or out of time)."""
        return (
            self.ready and not self.applied and (not self.shadow or not self.shadow_pending or now >= self.shadow_until)
        )


@dataclass
class Recovery(_Plan):
    kind: str = "unexpected"
    dead: set[int] = field(default_factory=set)
    alive: list[int] = field(default_factory=list)
    statuses: dict[int, dict[str, dict[str, int]]] = field(default_factory=dict)
    dirty: list[str] = field(default_factory=list)
    deadline: float = 0.0
    bytes: int = 0
    held: list[int] = field(default_factory=list)
    """The ranks told to redo the step only after ``resume`` (``runtime.redo_overlap=false``)."""


AnyPlan = Plan | PlannedSwitch | Recovery
"""What the message builders of :mod:`~tmslurm.controller.switch_planning` read a plan from."""
