"""The new rank's side of a live shadow's check: the fingerprints compared behind its first step.

Contract: a :class:`PendingCheck` is made when a standby took a rank's slot from a live shadow
(:func:`~tmslurm.comm.shadow.follow` returned at the switch step's update). It runs
:func:`~tmslurm.comm.shadow.check` on a background thread at once, while the rank computes its
first step: the check only reads the state, and nothing writes it before that step commits.
:meth:`PendingCheck.settle` is called before the first step's vote. It waits for the verdict and
returns a :class:`Checked`. On a mismatch it first receives the leaver's whole state into the
runner (:func:`~tmslurm.comm.shadow.repair`); the step computed on the wrong copy is then aborted
and redone by every rank (the worker does not vote, the controller aborts the step). A check that
cannot finish (the leaver gone, a timeout) raises CommError from :meth:`settle`: the state is
unchecked and must never commit. :func:`settle_before_vote` is what the worker calls: it reports
the verdict (``shadow_checked``), raises CommAborted on a mismatch, and ends the process when there
is no verdict (the run then recovers the rank as a failure).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tmslurm.comm.shadow import check, repair
from tmslurm.core.errors import CommAborted, CommError
from tmslurm.wire.messages import Msg, ShadowChecked

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Checked:
    """The verdict: equal or not, the check's own seconds (behind the first step), how long the
    vote waited for it, and the bytes and seconds of a repair (0 when equal)."""

    matched: bool
    verify_s: float
    wait_s: float
    bytes: int
    transfer_s: float


class PendingCheck:
    def __init__(self, epoch: int, pg: Any, runner: Any, timeout_s: float) -> None:
        self.epoch = epoch
        self.pg = pg
        self.runner = runner
        self.timeout_s = timeout_s
        self.matched: bool | None = None
        self.error: BaseException | None = None
        self.verify_s = 0.0
        self.thread = threading.Thread(target=self._run, name="shadow-check", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        t0 = time.monotonic()
        try:
            self.matched = check(self.pg, self.runner, self.timeout_s, lambda: False)
        except BaseException as exc:  # raised from settle() on the rank's thread
            self.error = exc
        self.verify_s = time.monotonic() - t0

    def settle(self) -> Checked:
        """Wait for the verdict; on a mismatch repair the runner's state first."""
        t0 = time.monotonic()
        self.thread.join(self.timeout_s + 5.0)
        wait_s = time.monotonic() - t0
        if self.thread.is_alive():
            raise CommError(f"the shadow's check did not end within {self.timeout_s:.0f}s")
        if self.error is not None or self.matched is None:
            raise CommError(f"the shadow's check failed: {self.error}")
        if self.matched:
            return Checked(True, self.verify_s, wait_s, 0, 0.0)
        t1 = time.monotonic()
        nbytes = repair(self.pg, self.runner, self.timeout_s, lambda: False)
        return Checked(False, self.verify_s, wait_s, nbytes, time.monotonic() - t1)


def settle_before_vote(pending: PendingCheck, rank: int, step: int, send: Callable[[Msg], None]) -> None:
    """Before the first step's vote: the verdict. Equal: report it and return. Different: report it
    (the state is repaired) and raise CommAborted, so the step is dropped and redone. No verdict:
    exit, unchecked."""
    try:
        got = pending.settle()
    except CommError as exc:
        log.error("rank %d: its shadow could not be compared with the leaver (%s); exiting unchecked", rank, exc)
        os._exit(3)
    send(
        ShadowChecked(
            epoch=pending.epoch,
            rank=rank,
            step=step,
            matched=got.matched,
            verify_s=got.verify_s,
            wait_s=got.wait_s,
            bytes=got.bytes,
            transfer_s=got.transfer_s,
        )
    )
    if not got.matched:
        log.error(
            "rank %d: its shadow DIFFERED from the leaver; received the whole state (%d bytes); step %d is redone",
            rank,
            got.bytes,
            step,
        )
        raise CommAborted(f"step {step} ran on a shadow that differed")
