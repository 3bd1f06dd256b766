"""What the load generator records: every message sent and received, stamped, by type and step or epoch.

Contract: :class:`Recorder` keeps, per (message type, step or epoch), the first and last time
(monotonic) and the count. A receipt is stamped with the kernel's receive time of the packet that
carried it (:func:`arrival_m`, from ``SO_TIMESTAMPNS``), falling back to the time of the read.
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass, field

from tmslurm.wire.messages import (
    Abort,
    Aborted,
    Activate,
    Cancel,
    Decision,
    Join,
    Joined,
    Msg,
    Prepare,
    Prepared,
    Recover,
    Recovered,
    Switched,
    Vote,
)

SO_TIMESTAMPNS = 35
"""Linux's SO_TIMESTAMPNS (= SCM_TIMESTAMPNS; not exported by Python's socket module): the kernel
stamps each received packet, so a receipt is timed when it reached the agent's socket, not when
this one thread came round to read it (at thousands of agents that wait was most of the latency)."""
ANC_SIZE = socket.CMSG_SPACE(16)


def arrival_m(anc: list[tuple[int, int, bytes]]) -> float:
    """When the first packet of a read arrived (monotonic), from its kernel timestamp; now without one."""
    for level, kind, raw in anc:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(raw) >= 16:
            sec, nsec = struct.unpack("qq", raw[:16])
            return sec + nsec * 1e-9 - (time.time() - time.monotonic())
    return time.monotonic()


@dataclass
class Stamp:
    first: float
    last: float
    count: int = 1

    def add(self, t: float) -> None:
        self.last = max(self.last, t)
        self.count += 1


def key_of(msg: Msg) -> int:
    """What a message is about: its step (decision, vote) or its epoch; -1 for the others."""
    if isinstance(msg, (Decision, Vote)):
        return msg.step
    if isinstance(
        msg, (Abort, Prepare, Join, Activate, Recover, Cancel, Prepared, Switched, Aborted, Recovered, Joined)
    ):
        return msg.epoch
    return -1


@dataclass
class Recorder:
    sent: dict[tuple[str, int], Stamp] = field(default_factory=dict)
    recv: dict[tuple[str, int], Stamp] = field(default_factory=dict)

    @staticmethod
    def mark(table: dict[tuple[str, int], Stamp], msg: Msg, t: float) -> Stamp:
        key = (msg.type, key_of(msg))  # type: ignore[attr-defined]
        stamp = table.get(key)
        if stamp is None:
            stamp = table[key] = Stamp(t, t)
        else:
            stamp.add(t)
        return stamp
