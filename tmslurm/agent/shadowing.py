"""The leaving rank's side of live shadowing for one planned switch (the wire is comm/shadow.py).

Contract: a :class:`LeaverShadow` is made when a ``prepare`` names this rank as a leaver with
``shadow: true``. At the first commit after its transfer group is built (phase 1, in the
background) it sends its state after that step (``START``, :meth:`after_commit`). For every later
step it sends the reduced gradient as soon as the all-reduce is done (``GRAD``,
:meth:`after_reduce`: it travels while the votes are collected), then the decision (``COMMIT``
in :meth:`before_apply`, so the standby's update runs alongside the leaver's, or ``DROP`` in
:meth:`dropped`), all on a background thread; the switch step's ``COMMIT`` says it is the last.
:meth:`before_apply` waits for a pending ``START`` before the optimizer changes what it reads;
that wait is the per-step cost of following. At the switch, :attr:`live` says whether the standby
holds a shadow: then the leaver reports that it left at once and :meth:`settle` sends its
fingerprint afterwards (``END``; a mismatch sends the whole state), while the new rank runs its
first step, which cannot commit before the standby compared (agent/shadowcheck.py). When the
shadow never started, :meth:`send_whole` sends the whole state in the pause (``FULL``).
:meth:`cancel` stops it (the switch was cancelled). Send failures raise CommError from
:meth:`before_apply`, :meth:`settle` and :meth:`send_whole`; a failure before the switch ends the
shadow and the worker treats it as a failed step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tmslurm.comm.fabric import BackgroundBuild
from tmslurm.comm.shadow import ShadowSender, send_full
from tmslurm.core.errors import CommError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HandOver:
    """What the switch sent: whether a shadow was used, matched (None: not compared yet), the bytes
    sent, steps followed, wait."""

    shadowed: bool
    matched: bool | None
    bytes: int
    steps: int
    wait_s: float


class LeaverShadow:
    def __init__(self, epoch: int, build: BackgroundBuild, xfer: str, timeout_s: float) -> None:
        self.epoch = epoch
        self.build = build
        self.xfer = xfer
        self.timeout_s = timeout_s
        self.sender: ShadowSender | None = None
        self.failed: str | None = None
        self.posted: int | None = None
        """The step whose gradient was sent and is not decided yet."""
        self.last_posted = False
        """The switch step's ``COMMIT`` was posted: the standby has left :func:`follow` with the state."""

    def after_reduce(self, step: int, runner: Any) -> None:
        """Step ``step``'s gradient is reduced (not yet decided): send it."""
        if self.sender is not None and not self.failed and runner.reduced is not None:
            self.sender.grads(step, runner.reduced)
            self.posted = step

    def dropped(self, step: int) -> None:
        """Step ``step`` was aborted: the standby drops its gradient."""
        if self.sender is not None and not self.failed and self.posted == step:
            self.sender.decided(step, committed=False)
            self.posted = None

    def before_apply(self, step: int, runner: Any, poll: Callable[[], None], last: bool = False) -> None:
        """Step ``step`` commits (``last``: with the switch): tell the standby and wait for a pending
        ``START``; a failed send ends the shadow (the step itself stands)."""
        if self.sender is None or self.failed:
            return
        try:
            if self.posted == step:
                self.sender.decided(step, committed=True, last=last)
                self.posted = None
                self.last_posted = last
            self.sender.wait(poll, state_only=True)
        except CommError as exc:
            self.failed = str(exc)
            self.sender.cancel()
            log.warning("shadow of epoch %d failed: %s", self.epoch, exc)

    def after_commit(self, step: int, runner: Any) -> None:
        """``step`` steps are committed and applied: start the shadow once the group is built."""
        if self.failed or self.sender is not None:
            return
        if not self.build.done() or self.build.error is not None or self.xfer not in self.build.result:
            return
        self.sender = ShadowSender(self.build.result[self.xfer].pg, self.timeout_s)
        self.sender.start(step, runner.state())
        log.info("shadowing from step %d (epoch %d)", step, self.epoch)

    @property
    def live(self) -> bool:
        """The standby holds a shadow that took the switch step's update."""
        return self.last_posted and not self.failed and self.sender is not None

    def pending(self) -> HandOver:
        """What a live shadow's switch moved in the pause: nothing; compared later."""
        assert self.sender is not None
        return HandOver(True, None, 0, self.sender.steps, self.sender.waited_s)

    def settle(self, step: int, runner: Any) -> HandOver:
        """After the switch: send the fingerprint of the state at ``step``; on a mismatch the whole state."""
        if not self.live or self.sender is None:
            raise CommError(f"no live shadow to settle (failed: {self.failed})")
        matched, nbytes = self.sender.finish(step, runner.state())
        if not matched:
            log.error(
                "shadow of epoch %d DIFFERED from this rank's state at step %d: sent the whole state (%d bytes)",
                self.epoch,
                step,
                nbytes,
            )
        return HandOver(True, matched, nbytes, self.sender.steps, self.sender.waited_s)

    def send_whole(self, pg: Any, step: int, runner: Any) -> HandOver:
        """No shadow took the switch step (never started, or started too late): the whole state, in the
        pause, after whatever was posted before (the standby reads the frames in order)."""
        if self.failed:
            raise CommError(f"the shadow failed earlier: {self.failed}")
        if self.sender is not None:
            self.sender.close()
        return HandOver(False, False, send_full(pg, step, runner.state(), self.timeout_s), 0, 0.0)

    def cancel(self) -> None:
        if self.sender is not None:
            self.sender.cancel()
