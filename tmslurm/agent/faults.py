"""Injected faults of one training rank: the config's ``faults`` for this rank fire for real, at named
points of the worker's step loop, and nowhere else.

Contract:
- :class:`FaultPlan` is built complete from the ``welcome``'s :class:`~tmslurm.wire.messages.FaultSpec`
  list (the controller sends a worker only its own rank's faults not yet fired) and holds them in that
  order. :meth:`FaultPlan.none` is a plan with no fault: every call does nothing (a standby that
  joined gets it).
- The worker calls it at three points of the step loop, nothing more:
  :meth:`~FaultPlan.midstep` before computing step s returns the action the runner calls between
  the forward and the backward passes of s, for the first ``kill``/``stop``/``hiccup`` fault of
  step s with ``when: midstep`` and for every ``slow`` fault of a step <= s (it stalls every step
  from then on), or None; :meth:`~FaultPlan.before_vote` just before the vote of step s (only
  while votes are on) hangs for the first ``hang`` fault of step s; :meth:`~FaultPlan.before_recovery`
  when a ``recover`` of the controller is about to be applied fires the first ``when: recover``
  fault of a step <= s; :meth:`~FaultPlan.during_transfer`, called by a state transfer once its
  header is out (or in), fires the first ``when: transfer`` (the sender: a recovery's source, a
  planned move's leaver) or ``when: join`` (the joining standby, whose plan comes with its ``join``)
  fault.
- Firing a fault removes it from the plan (it fires at most once, also when a stopped process is
  continued or a failed step is redone), then sends :class:`~tmslurm.wire.messages.FaultFired` with
  the step it fired at. ``kill``/``stop`` then wait :data:`SETTLE_S` (so the controller reads the
  report first) and send this very process SIGKILL (``kill``) or SIGSTOP (any other kind: a
  continued process goes on where it stopped). ``hiccup`` stalls the training thread its amount of
  seconds and goes on; ``slow`` is reported once, when it starts. ``hang`` blocks the calling (training) thread forever
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
from collections.abc import Callable, Iterable

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

    def __init__(
        self,
        specs: Iterable[FaultSpec],
        rank: int,
        send: Callable[[Msg], None],
        *,
        kill: Callable[[int], None] = signal_self,
        pause: Callable[[float], None] = time.sleep,
        hang: Callable[[], None] = hang_forever,
    ) -> None:
        self.pending: list[FaultSpec] = list(specs)
        self.slowing: list[FaultSpec] = []
        """Fired ``slow`` faults: every step from theirs on stalls their amount."""
        self.rank = rank
        self.send = send
        self.kill = kill
        self.pause = pause
        self.hang = hang

    @classmethod
    def none(cls) -> FaultPlan:
        """A plan with no fault: every call does nothing."""
        return cls((), 0, _drop)

    # ---- the named points of the step loop --------------------------------------------------------
    def midstep(self, step: int) -> Callable[[], None] | None:
        """The action to run between the forward and backward passes of ``step``, or None."""
        for f in [f for f in self.pending if f.kind == "slow" and f.step <= step]:
            self.pending.remove(f)
            self.slowing.append(f)
            self.send(FaultFired(index=f.index, rank=self.rank, step=step, kind=f.kind))
            log.warning("injecting fault slow at step %d: every step stalls %ss from now on", step, f.amount)
        due = [
            f for f in self.pending if f.step == step and f.kind in ("kill", "stop", "hiccup") and f.when == "midstep"
        ]
        delay = sum(float(f.amount) for f in self.slowing)
        if not due and not delay:
            return None

        def act() -> None:
            if delay:
                self.pause(delay)
            if due:
                self._fire(due[0], step)

        return act

    def before_vote(self, step: int) -> None:
        """Injected ``hang``: the training thread stops just before voting ``step``, the heartbeats go on."""
        due = [f for f in self.pending if f.step == step and f.kind == "hang"]
        if not due:
            return
        self.pending.remove(due[0])
        self.send(FaultFired(index=due[0].index, rank=self.rank, step=step, kind="hang"))
        log.warning("injecting fault hang at step %d: the training thread stops, heartbeats go on", step)
        self.hang()

    def during_transfer(self, step: int | None, when: str = "transfer") -> None:
        """A ``when: transfer`` (a worker sending state) or ``when: join`` (a standby receiving it)
        fault of a step <= ``step`` (None: any step; the controller sent only due ones) fires in the
        middle of a state transfer."""
        due = [f for f in self.pending if f.when == when and (step is None or f.step <= step)]
        if due:
            self._fire(due[0], step if step is not None else due[0].step)

    def before_recovery(self, step: int) -> None:
        """A ``when: recover`` fault of a step <= ``step`` fires as the rank is about to rebuild its groups."""
        due = [f for f in self.pending if f.when == "recover" and f.step <= step]
        if due:
            self._fire(due[0], step)

    # ---- firing -----------------------------------------------------------------------------------
    def _fire(self, fault: FaultSpec, step: int) -> None:
        self.pending.remove(fault)
        self.send(FaultFired(index=fault.index, rank=self.rank, step=step, kind=fault.kind))
        if fault.kind == "hiccup":
            log.warning("injecting fault hiccup at step %d: the training thread stalls %ss", step, fault.amount)
            self.pause(float(fault.amount))
            return
        self.pause(SETTLE_S)
        log.warning("injecting fault %s at step %d", fault.kind, step)
        self.kill(signal.SIGKILL if fault.kind == "kill" else signal.SIGSTOP)
