"""A leaving rank hands its slot over: phase 2 of a planned switch that names this rank in a move.

Contract: :func:`hand_over` runs on the leaver's step-loop thread, once, right before the process
exits. With a live shadow (agent/shadowing.py) the standby already holds the state: ``left`` goes
out at once (the pause ends there), then the fingerprint is settled while the new rank runs its
first step; a settle that fails is logged, and the new rank, which cannot commit a step unchecked,
goes too (agent/shadowcheck.py). A shadow that never went live sends the whole state in the pause;
without a shadow the state goes over the transfer pair (comm/transfer.py), the test fault
``when: transfer`` firing midway. ``left`` then follows. A whole-state send that fails raises CommError
to the caller, as before this module existed (the process ends; the controller sees it go).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from tmslurm.agent.faults import FaultPlan
from tmslurm.agent.link import Link
from tmslurm.agent.shadowing import HandOver, LeaverShadow
from tmslurm.comm.fabric import GroupHandle
from tmslurm.comm.transfer import send_state
from tmslurm.core.errors import CommError
from tmslurm.train.schedule import StageRunner
from tmslurm.wire.messages import Left

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Leaver:
    """The leaving rank as the hand-over needs it."""

    link: Link
    runner: StageRunner
    faults: FaultPlan
    rank: int
    dp: int
    step: int
    timeout_s: float
    """runtime.collective_timeout_s: the longest wait of one send."""
    apply_s: float
    """The switch step's optimizer update (every step's gap holds one: reported, not charged)."""


def hand_over(me: Leaver, xfer: GroupHandle, shadow: LeaverShadow | None, t0: float) -> None:
    """Hand ``me`` over through ``xfer`` (or ``shadow``, this switch's); ``t0``: phase 2 began."""
    t1 = time.monotonic()
    if shadow is not None and shadow.live:
        _send_left(me, shadow.pending(), t0, t1)
        try:
            h = shadow.settle(me.step, me.runner)
            log.info(
                "rank %d's shadow at step %d: %s (%d bytes sent after)",
                me.rank,
                me.step,
                "equal" if h.matched else "DIFFERENT",
                h.bytes,
            )
        except CommError as exc:  # the new rank cannot commit a step unchecked: it goes too
            log.error("could not settle rank %d's shadow: %s", me.rank, exc)
        return
    if shadow is not None:
        h = shadow.send_whole(xfer.pg, me.step, me.runner)
    else:
        sent = send_state(
            xfer.pg,
            1,
            {"state": me.runner.state_for(me.dp), "step": me.step},
            me.timeout_s,
            midway=lambda: me.faults.during_transfer(me.step),
        )
        h = HandOver(False, False, sent, 0, 0.0)
    _send_left(me, h, t0, t1)


def _send_left(me: Leaver, h: HandOver, t0: float, t1: float) -> None:
    me.link.send(
        Left(
            rank=me.rank,
            step=me.step,
            transfer_s=time.monotonic() - t1,
            phase2_s=t1 - t0,
            bytes=h.bytes,
            shadowed=h.shadowed,
            shadow_steps=h.steps,
            shadow_wait_s=h.wait_s,
            apply_s=me.apply_s,
        )
    )
    log.info("handed rank %d over at step %d (%d bytes, shadowed: %s); exiting", me.rank, me.step, h.bytes, h.shadowed)
