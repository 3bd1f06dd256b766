"""What the controller's plans ask of a training rank beside its steps: switches, aborts, recoveries.

Contract (on the worker's main thread; :class:`~tmslurm.agent.worker.Worker` calls it between and
inside its steps):
- ``prepare`` (phase 1 of a planned switch): the groups of the new epoch are built in a background
  thread while training goes on, and ``prepared`` (with the build's error, if any) is sent when it
  is done; a leaver told to feed a live shadow starts one (:mod:`tmslurm.agent.shadowing`).
  ``cancel`` drops that build and the shadow. :meth:`RankPlans.switch` (phase 2, the commit
  decision carries the switch) installs the prepared groups and sends ``switched``; the leaving
  rank hands its state over (:mod:`tmslurm.agent.handover`) and exits (status 0) instead.
- ``abort`` raises :attr:`RankPlans.seen_abort`; :meth:`RankPlans.recover` answers every newer abort
  with ``aborted`` (the per-group op counts that tell the controller the dirty groups), then on the
  ``recover`` of the latest one builds the groups it names, installs them, sends this rank's state
  to each joiner it is the source of, sends ``recovered`` and the new groups, and (``hold``) waits for
  ``resume`` before the step is redone. A build or transfer that fails is reported
  (``comm_error``) and the rank waits for the next abort; a newer abort supersedes a recovery.
- ``finish`` ends the process once the in-flight checkpoint is written; any other message outside a
  plan is logged and ignored. Nothing here raises but what the fault plan injects.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from tmslurm.agent.build import peak_rss_mb
from tmslurm.agent.faults import FaultPlan
from tmslurm.agent.groupspec import groups_to_build, wait_built
from tmslurm.agent.handover import Leaver, hand_over
from tmslurm.agent.link import Link
from tmslurm.agent.shadowing import LeaverShadow
from tmslurm.comm.fabric import BackgroundBuild, Fabric, GroupHandle
from tmslurm.comm.transfer import send_state
from tmslurm.core.config import RunConfig
from tmslurm.core.errors import CommError
from tmslurm.core.topology import Layout
from tmslurm.train.async_checkpoint import AsyncCheckpointer
from tmslurm.train.schedule import StageRunner
from tmslurm.wire.messages import (
    Abort,
    Aborted,
    Cancel,
    CommErrorReport,
    Decision,
    Finish,
    Groups,
    OpStatus,
    Prepare,
    Prepared,
    Recover,
    Recovered,
    Resume,
    Switched,
    SwitchSpec,
)

log = logging.getLogger(__name__)


class RankPlans:
    def __init__(
        self,
        link: Link,
        cfg: RunConfig,
        layout: Layout,
        rank: int,
        runner: StageRunner,
        fabric: Fabric,
        faults: FaultPlan,
        saver: AsyncCheckpointer,
        epoch: int,
    ) -> None:
        self.link = link
        self.cfg = cfg
        self.layout = layout
        self.rank = rank
        self.runner = runner
        self.fabric = fabric
        self.faults = faults
        self.saver = saver
        self.prepared: dict[int, BackgroundBuild] = {}
        """Phase-1 builds of planned switches, by epoch."""
        self.shadow: LeaverShadow | None = None
        """This rank leaves in a planned switch with a live shadow (agent/shadowing.py)."""
        self.epoch = epoch
        """The epoch of the groups installed: this rank votes in it."""
        self.seen_abort = epoch
        """The newest abort epoch seen: above :attr:`epoch`, a recovery is due."""

    def report_groups(self, step: int) -> None:
        """Tell the controller which ProcessGroup object serves each group (tests check identity)."""
        self.link.send(
            Groups(
                rank=self.rank,
                step=step,
                epoch=self.epoch,
                ids={n: id(h.pg) for n, h in self.fabric.handles.items()},
                gens=self.fabric.generations(),
                peak_rss_mb=peak_rss_mb(),
            )
        )

    # ---- messages -----------------------------------------------------------------------------
    def poll_inbox(self) -> None:
        while not self.link.inbox.empty():
            self.dispatch(self.link.get())

    def dispatch(self, msg: Any) -> None:
        if isinstance(msg, Prepare):
            self._prepare(msg)
        elif isinstance(msg, Cancel):
            if self.prepared.pop(msg.epoch, None) is not None:
                log.info("switch of epoch %s cancelled", msg.epoch)
            if self.shadow is not None and self.shadow.epoch == msg.epoch:
                self.shadow.cancel()
                self.shadow = None
        elif isinstance(msg, Abort):
            self.seen_abort = max(self.seen_abort, msg.epoch)
        elif isinstance(msg, Finish):
            log.info("controller says finish")
            self.saver.wait()
            os._exit(0)
        elif not isinstance(msg, (Decision, Recover, Resume)):  # a resume for a rank not held: nothing to do
            log.warning("ignoring unexpected message %s", msg.type)

    def _prepare(self, msg: Prepare) -> None:
        epoch = msg.epoch
        gens, pairs = groups_to_build(msg)

        def done(build: BackgroundBuild) -> None:
            self.link.send(
                Prepared(
                    epoch=epoch,
                    rank=self.rank,
                    phase1_s=build.seconds,
                    error=None if build.error is None else str(build.error)[:300],
                )
            )

        self.prepared[epoch] = self.fabric.build_in_background(gens, pairs, done)
        xfer = f"xfer/r{self.rank}"
        if msg.shadow and xfer in pairs:
            self.shadow = LeaverShadow(epoch, self.prepared[epoch], xfer, self.cfg.runtime.collective_timeout_s)

    # ---- planned switch, phase 2 --------------------------------------------------------------
    def switch(self, switch: SwitchSpec, step: int, apply_s: float) -> None:
        """Install the groups prepared for ``switch`` and move to its epoch (a leaver hands over and
        exits); nothing when none were prepared. ``apply_s``: the last optimizer update's seconds (a
        leaver reports it)."""
        epoch = switch.epoch
        build = self.prepared.pop(epoch, None)
        if build is None:
            return
        t0 = time.monotonic()
        handles = build.join(self.cfg.runtime.connect_timeout_s)
        if any(m.rank == self.rank for m in switch.moves):
            self._leave(handles[f"xfer/r{self.rank}"], t0, epoch, step, apply_s)
        self.fabric.install(handles)
        self.link.send(Switched(epoch=epoch, rank=self.rank, phase2_s=time.monotonic() - t0))
        self.epoch = epoch
        self.report_groups(step)

    def _leave(self, xfer: GroupHandle, t0: float, epoch: int, step: int, apply_s: float) -> None:
        """Hand this rank over (agent/handover.py) and exit."""
        shadow = self.shadow if self.shadow is not None and self.shadow.epoch == epoch else None
        me = Leaver(
            link=self.link,
            runner=self.runner,
            faults=self.faults,
            rank=self.rank,
            dp=self.layout.coord(self.rank).dp,
            step=step,
            timeout_s=self.cfg.runtime.collective_timeout_s,
            apply_s=apply_s,
        )
        hand_over(me, xfer, shadow, t0)
        self.saver.wait()
        time.sleep(0.2)  # let the controller read our last message before the socket closes
        os._exit(0)

    # ---- unexpected failure -------------------------------------------------------------------
    def recover(self, step: int) -> None:
        """Take part in the recovery of the abort the step at ``step`` met, until this rank may redo it
        (:attr:`epoch` is then the recovery's)."""
        while self.seen_abort <= self.epoch:
            msg = self.link.get()
            if isinstance(msg, Abort):
                self.seen_abort = msg.epoch
            else:
                self.dispatch(msg)
        replied = -1
        while True:
            if replied < self.seen_abort:
                replied = self.seen_abort
                self.link.send(Aborted(epoch=replied, rank=self.rank, step=step, status=self._status()))
            msg = self.link.get()
            if isinstance(msg, Abort):
                self.seen_abort = max(self.seen_abort, msg.epoch)
            elif isinstance(msg, Recover) and msg.epoch == self.seen_abort:
                if self._apply_recover(msg, step) and (not msg.hold or self._held(msg.epoch)):
                    return
            else:
                self.dispatch(msg)

    def _status(self) -> dict[str, OpStatus]:
        return {name: OpStatus(**counts) for name, counts in self.fabric.status().items()}

    def _held(self, epoch: int) -> bool:
        """Wait for ``resume`` before redoing the step (``runtime.redo_overlap=false``): the
        recovery's transfers run without this rank's compute beside them. False when a newer abort
        came first (the recovery is redone)."""
        t0 = time.monotonic()
        while True:
            msg = self.link.get()
            if isinstance(msg, Resume) and msg.epoch >= epoch:
                log.info("resumed after %.3fs held", time.monotonic() - t0)
                return True
            if isinstance(msg, Abort) and msg.epoch > epoch:
                self.seen_abort = max(self.seen_abort, msg.epoch)
                return False
            self.dispatch(msg)

    def _apply_recover(self, msg: Recover, step: int) -> bool:
        self.faults.before_recovery(step)
        epoch = msg.epoch
        gens, pairs = groups_to_build(msg)
        t0 = time.monotonic()
        build = self.fabric.build_in_background(gens, pairs)
        if not wait_built(build, lambda: self.link.abort_epoch > epoch):
            log.warning("recovery of epoch %d superseded by a new abort", epoch)
            return False
        try:
            handles = build.join(0)
        except CommError as exc:
            log.warning("recovery build failed: %s", exc)
            self.link.send(CommErrorReport(rank=self.rank, step=step, epoch=epoch, error=str(exc)[:1000]))
            return False
        build_s = time.monotonic() - t0
        xfers = {k: handles.pop(k) for k in list(handles) if k.startswith("xfer/")}
        self.fabric.install(handles)
        t1 = time.monotonic()
        for name, h in xfers.items():
            target = self.layout.coord(int(name.removeprefix("xfer/r"))).dp  # at zero=1: this rank's buddy
            try:
                send_state(
                    h.pg,
                    1,
                    {"state": self.runner.state_for(target), "step": step},
                    self.cfg.runtime.collective_timeout_s,
                    midway=lambda: self.faults.during_transfer(step),
                )
            except CommError as exc:  # the joiner died mid-transfer: the controller plans again
                log.warning("state transfer to the joiner of %s failed: %s", name, exc)
                self.link.send(CommErrorReport(rank=self.rank, step=step, epoch=epoch, error=str(exc)[:1000]))
                return False
            finally:
                self.fabric.graveyard.append(h.pg)
        self.epoch = epoch
        self.link.clear_abort(epoch)
        self.link.send(
            Recovered(epoch=epoch, rank=self.rank, build_s=build_s, transfer_s=time.monotonic() - t1 if xfers else None)
        )
        self.report_groups(step)
        return True
