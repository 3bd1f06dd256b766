"""The schema of an injected fault (``faults=[{step, kind, rank}]``) and how an entry reads.

Contract: :class:`FaultConfig` is one entry of ``RunConfig.faults``; :func:`fault_ranks` and
:func:`fault_amount` give the ranks an entry hits and its amount with the kind's default. The rules an
entry must follow are checked in :mod:`.validation`. Nothing here raises.

It lives in the config package, not beside the code that injects faults (tmslurm/agent/faults.py and
the controller's fault plans): the controller reads it too, and neither core nor the controller may
import agent/.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FAULT_KINDS = (
    "drain",
    "kill",
    "stop",
    "hang",
    "hiccup",
    "slow",
    "node_down",
    "power_off",
    "partition",
    "throttle",
    "slowlink",
    "corrupt_shadow",
)
CLUSTER_FAULTS = (
    "node_down",
    "power_off",
    "partition",
    "throttle",
    "slowlink",
)  # driven through Slurm / the failure lab
FAULT_AMOUNTS = {"throttle": "30", "slowlink": "20mbit", "hiccup": "2", "slow": "0.2"}
"""The default ``amount`` of the fault kinds that take one (a CPU percent, a link rate)."""


@dataclass(kw_only=True)
class FaultConfig:
    """One injected fault, an entry of ``faults``: for tests, benchmarks and the demo."""

    step: int
    """Step at which the fault fires."""
    kind: str
    """What happens to the rank: drain, kill, stop, hang, hiccup, slow, node_down, power_off, partition,
    throttle, slowlink or corrupt_shadow (FAULT_KINDS).

    - ``drain``: a maintenance notice for the rank's node (a planned move);
    - ``kill``: SIGKILL of the rank's process (see ``when``);
    - ``stop``: SIGSTOP of the rank's process, a hung process that holds its sockets open;
    - ``hang``: the rank's training thread stops just before voting while its heartbeats go on;
    - ``hiccup``: the rank's training thread stalls ``amount`` seconds (default 2) in the middle of
      ``step``, once, then goes on;
    - ``slow``: from ``step`` on, every step of the rank stalls ``amount`` seconds (default 0.2) in
      its middle: a slow rank in one process (the lab's ``throttle`` slows a whole node); neither
      hiccup nor slow starts a detection clock: they are not failures;
    - ``node_down``: ``scontrol update state=down`` of the rank's node (cluster=slurm);
    - ``power_off``: the failure lab powers the rank's node off, silent: no FIN, no RST
      (cluster=slurm with ``slurm.lab_command``);
    - ``partition``: the failure lab cuts the rank's node off the network, its processes live on
      (cluster=slurm with ``slurm.lab_command``);
    - ``throttle``: the failure lab caps the node's CPU at ``amount`` percent of one CPU (a gray,
      slow node that stays up);
    - ``slowlink``: the failure lab limits both directions of the node's link to ``amount`` (tc tbf);
    - ``corrupt_shadow``: a test of the shadow's check: the standby that shadows the rank in a
      planned switch flips one bit of its copy before the switch, which must fall back to a full
      transfer (``step`` is not used)."""
    rank: int = 0
    """Training rank hit by the fault (its node for drain, node_down and the lab's faults)."""
    ranks: list[int] = field(default_factory=list)
    """Several training ranks hit by this one fault (overrides ``rank``): the lab's faults act on
    all their nodes at the same instant (one command), kill/stop hit each rank at the same point of
    the same step, drain/node_down notice each node."""
    amount: str = ""
    """throttle: percent of one CPU, 1..1000 (empty: 30); slowlink: a rate as tc writes it, such as
    20mbit or 500kbit (empty: 20mbit); hiccup and slow: seconds (empty: 2 and 0.2). Other kinds take none."""
    when: str = "midstep"
    """kill/stop/hiccup: midstep (between forward and backward of ``step``), recover (when the rank
    is told to take part in a recovery at or after ``step``: a second failure during a switch),
    transfer (in the middle of a state transfer the rank sends at or after ``step``, once its header
    is out: a recovery's source or a planned move's leaver) or join (the standby joining as the rank
    is hit in the middle of receiving its state, at or after ``step``)."""


def fault_ranks(f: FaultConfig) -> list[int]:
    """The ranks one fault entry hits: ``ranks`` when given, else ``[rank]``."""
    return list(f.ranks) if f.ranks else [f.rank]


def fault_amount(f: FaultConfig) -> str:
    """The entry's ``amount``, or its kind's default (empty for kinds that take none)."""
    return f.amount or FAULT_AMOUNTS.get(f.kind, "")
