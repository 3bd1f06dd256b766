"""Injected faults of one training rank: the config's ``faults`` for this rank fire for real, at named
points of the worker's step loop, and nowhere else.

Contract:
- :class:`FaultPlan` is built complete from the ``welcome``'s :class:`~tmslurm.wire.messages.FaultSpec`
  list (the controller sends a worker only its own rank's faults not yet fired) and holds them in that
  order. :meth:`FaultPlan.none` is a plan with no fault: every call does nothing (a standby that
  joined gets it).
- The worker calls it at three points of the step loop, nothing more:
  :meth:`~FaultPlan.midstep` before computing step s returns the action the runner calls between
  the forward and the backward passes of s, for the first ``kill``/``stop`` fault of step s with
  ``when: midstep``, or None; :meth:`~FaultPlan.before_vote` just before the vote of step s (only
  while votes are on) hangs for the first ``hang`` fault of step s; :meth:`~FaultPlan.before_recovery`
  when a ``recover`` of the controller is about to be applied fires the first ``when: recover``
  fault of a step <= s.
- Firing a fault removes it from the plan (it fires at most once, also when a stopped process is
  continued or a failed step is redone), then sends :class:`~tmslurm.wire.messages.FaultFired` with
  the step it fired at. ``kill``/``stop`` then wait :data:`SETTLE_S` (so the controller reads the
  report first) and send this very process SIGKILL (``kill``) or SIGSTOP (any other kind: a
  continued process goes on where it stopped). ``hang`` blocks the calling (training) thread forever
  while the link's threads heartbeat on: the controller must find it by its missing progress.
- A fault whose point is never reached (the run ends first, a midstep action the step never got to
  because a collective failed before it) stays pending and may fire at a later call. Kinds the worker
  does not act on (``drain``, ``power_off``, ...: the controller injects those) are never fired here.
- Failure behaviour: a report that cannot reach the controller is dropped by the link (it never
  raises), and the fault is carried out all the same.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import Callable, Iterable

from tmslurm.wire.messages import FaultFired, FaultSpec, Msg

log = logging.getLogger(__name__)
SETTLE_S = 0.05
"""Between the ``fault`` report and the signal: the controller reads the report before the process goes."""
HANG_NAP_S = 3600.0


def signal_self(signum: int) -> None:
    os.kill(os.getpid(), signum)


def hang_forever() -> None:
    while True:
        time.sleep(HANG_NAP_S)


def _drop(msg: Msg) -> None:
    """The sender of a plan with no fault: it never sends."""


class FaultPlan:
    """This rank's pending faults and what firing one does (the effects are parameters for tests)."""

    def __init__(self, specs: Iterable[FaultSpec], rank: int, send: Callable[[Msg], None], *,
                 kill: Callable[[int], None] = signal_self, pause: Callable[[float], None] = time.sleep,
                 hang: Callable[[], None] = hang_forever) -> None:
        self.pending: list[FaultSpec] = list(specs)
        self.rank = rank
        self.send = send
        self.kill = kill
        self.pause = pause
        self.hang = hang

    @classmethod
    def none(cls) -> "FaultPlan":
        """A plan with no fault: every call does nothing."""
        return cls((), 0, _drop)

    # ---- the named points of the step loop --------------------------------------------------------
    def midstep(self, step: int) -> Callable[[], None] | None:
        """The action to run between the forward and backward passes of ``step``, or None."""
        due = [f for f in self.pending if f.step == step and f.kind in ("kill", "stop") and f.when == "midstep"]
        if not due:
            return None
        fault = due[0]
        return lambda: self._fire(fault, step)

    def before_vote(self, step: int) -> None:
        """Injected ``hang``: the training thread stops just before voting ``step``, the heartbeats go on."""
        due = [f for f in self.pending if f.step == step and f.kind == "hang"]
        if not due:
            return
        self.pending.remove(due[0])
        self.send(FaultFired(index=due[0].index, rank=self.rank, step=step, kind="hang"))
        log.warning("injecting fault hang at step %d: the training thread stops, heartbeats go on", step)
        self.hang()

    def before_recovery(self, step: int) -> None:
        """A ``when: recover`` fault of a step <= ``step`` fires as the rank is about to rebuild its groups."""
        due = [f for f in self.pending if f.when == "recover" and f.step <= step]
        if due:
            self._fire(due[0], step)

    # ---- firing -----------------------------------------------------------------------------------
    def _fire(self, fault: FaultSpec, step: int) -> None:
        self.pending.remove(fault)
        self.send(FaultFired(index=fault.index, rank=self.rank, step=step, kind=fault.kind))
        self.pause(SETTLE_S)
        log.warning("injecting fault %s at step %d", fault.kind, step)
        self.kill(signal.SIGKILL if fault.kind == "kill" else signal.SIGSTOP)
