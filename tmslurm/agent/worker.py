"""The worker agent: runs one training rank step by step under the controller's commit decisions.

Contract, per step s:
1. compute forward/backward/reduction over the installed groups (nothing is applied yet);
2. vote ``{step, epoch, loss}`` and wait for the controller's one decision for step s;
3. ``commit``: apply the optimizer step (and a switch the decision carries: phase 2 for stayers,
   state hand-off and exit for a leaver); ``abort``: drop the gradients, take part in recovery, redo s.
A communication failure (dead peer, abandoned wait) never applies anything: the rank reports
``aborted`` with its per-group op counts (which tell the controller the *dirty* groups), rebuilds the
groups it is told to, sends its state to a joiner if it is a source, and redoes the step (one told
to ``hold`` sends none and redoes it after the controller's ``resume``: the transfers run alone).
After a commit the stage's data-parallel rank 0 checkpoints when due: periodic checkpoints in the
background (``train.checkpoint_async``, :mod:`tmslurm.train.async_checkpoint`, at most one in flight),
one the decision asks for (``checkpoint``) synchronously, so it is complete before the rank goes on; the
in-flight save is waited for before the process exits (end of run, a leaver's exit, ``finish``, a lost
controller), and its failure raises CheckpointError in the step loop.
Phase-1 builds run in background threads while training goes on. Faults from the config fire for
real (SIGKILL/SIGSTOP of this very process, mid-step; a hang before the vote): the step loop only
calls its :class:`~tmslurm.agent.faults.FaultPlan` at named points (:mod:`tmslurm.agent.faults`).
Everything it sends is a :mod:`tmslurm.wire.messages` model.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

from tmslurm.agent.build import build_runner, layout_of, make_fabric, peak_rss_mb
from tmslurm.agent.faults import FaultPlan
from tmslurm.agent.handover import Leaver, hand_over
from tmslurm.agent.link import Link
from tmslurm.agent.shadowcheck import PendingCheck, settle_before_vote
from tmslurm.agent.shadowing import LeaverShadow
from tmslurm.comm.fabric import BackgroundBuild, Fabric, GroupHandle
from tmslurm.comm.stage_comm import FabricStageComm, RecordingStageComm, recording_path
from tmslurm.comm.transfer import send_state
from tmslurm.core.config import RunConfig, from_dict
from tmslurm.core.errors import CommAborted, CommError
from tmslurm.core.logs import LOG_CONTEXT
from tmslurm.core.rundir import RunDir
from tmslurm.train import checkpoint
from tmslurm.train.async_checkpoint import AsyncCheckpointer
from tmslurm.train.schedule import StageRunner
from tmslurm.wire.messages import (
    Abort,
    Aborted,
    BuddyCost,
    Cancel,
    CommErrorReport,
    Decision,
    Done,
    Finish,
    Groups,
    Prepare,
    Prepared,
    Progress,
    Recover,
    Recovered,
    Resume,
    Started,
    Switched,
    SwitchSpec,
    Vote,
    Welcome,
)

log = logging.getLogger(__name__)


class Worker:
    def __init__(
        self,
        run_dir: Path,
        link: Link,
        cfg: RunConfig,
        rank: int,
        runner: StageRunner,
        fabric: Fabric,
        epoch: int,
        step: int,
        faults: FaultPlan,
        addr: dict[str, Any],
        check: PendingCheck | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.link = link
        self.cfg = cfg
        self.rank = rank
        self.runner = runner
        self.fabric = fabric
        self.epoch = epoch
        self.step = step
        self.faults = faults
        self.addr = addr
        self.layout = layout_of(cfg)
        self.coord = self.layout.coord(rank)
        self.prepared: dict[int, BackgroundBuild] = {}
        self.apply_s = 0.0
        """The last optimizer update's seconds (a leaver reports it: every step's gap holds one)."""
        self.shadow: LeaverShadow | None = None
        """This rank leaves in a planned switch with a live shadow (agent/shadowing.py)."""
        self.check = check
        """This rank took its slot from a live shadow not compared yet: its first step votes after the verdict."""
        self.seen_abort = epoch
        self.final = False
        """The controller's decision said this step is the run's last."""
        self.recording = self._should_record()
        self.saver = AsyncCheckpointer(run_dir)
        self.ckpt_s: float | None = None
        """Seconds the last decision's checkpoint held the step loop (sent with the next vote), None if none."""
        link.before_exit.append(self.saver.wait)
        link.sticky.clear()  # a standby that joined is no standby any more: its ready messages are void
        link.rejoin_state = self.rejoin_state
        self.report_groups()
        self.comm = FabricStageComm(
            fabric, self.layout, rank, runner.task.activation_shape(cfg.train.micro_batch_size), runner.device
        )
        LOG_CONTEXT["who"] = f"rank{rank}"

    @classmethod
    def from_welcome(cls, run_dir: Path, link: Link, welcome: Welcome, rank: int) -> Worker:
        cfg = from_dict(welcome.config)
        runner = build_runner(cfg, rank)
        address = welcome.address.model_dump()
        fabric = make_fabric(cfg, rank, link, address)
        step = welcome.resume_step
        t0 = time.monotonic()
        if step:
            checkpoint.load_stage(run_dir, step, layout_of(cfg).shard_name(rank), runner)
        t1 = time.monotonic()
        gens = {g.name: welcome.generation for g in fabric.my_groups()}
        fabric.install(fabric.build(gens))
        link.send(Started(rank=rank, step=step, groups_s=time.monotonic() - t1, ckpt_load_s=t1 - t0))
        faults = FaultPlan(welcome.faults, rank, link.send)
        return cls(run_dir, link, cfg, rank, runner, fabric, welcome.epoch, step, faults, address)

    def _should_record(self) -> bool:
        """Rank (dp 0, tp 0) of each shape class's first stage records its first step for standbys."""
        if self.cfg.standby.count == 0 or self.coord.dp != 0 or self.coord.tp != 0:
            return False
        shape = self.layout.shape_class(self.rank)
        if shape.representative != self.coord.stage:
            return False
        return not recording_path(self.run_dir, shape.name).exists()

    def rejoin_state(self) -> dict[str, Any]:
        """What a restarted controller needs to re-adopt this rank (read from the link's reader thread)."""
        return {
            "rank": self.rank,
            "epoch": self.epoch,
            "in_plan": bool(self.prepared) or self.seen_abort > self.epoch,
            "prepared": sorted(self.prepared),
            "aborting": self.seen_abort > self.epoch,
            "step": self.step,
        }

    def report_groups(self) -> None:
        """Tell the controller which ProcessGroup object serves each group (tests check identity)."""
        self.link.send(
            Groups(
                rank=self.rank,
                step=self.step,
                epoch=self.epoch,
                ids={n: id(h.pg) for n, h in self.fabric.handles.items()},
                gens=self.fabric.generations(),
                peak_rss_mb=peak_rss_mb(),
            )
        )

    # ---- the step loop ------------------------------------------------------------------------
    def run(self) -> None:
        while self.step < self.cfg.train.steps and not self.final:
            self._poll_inbox()
            LOG_CONTEXT["step"] = self.step
            try:
                decision = self._attempt()
            except (CommError, CommAborted) as exc:
                self._drop()
                if not isinstance(exc, CommAborted):
                    log.warning("step %d failed: %s", self.step, exc)
                    self.link.send(
                        CommErrorReport(rank=self.rank, step=self.step, epoch=self.epoch, error=str(exc)[:1000])
                    )
                self._recover()
                continue
            if decision is not None:
                if self.shadow is not None:
                    self.shadow.before_apply(self.step, self.runner, self._poll_inbox, last=self._leaves_in(decision))
                t_apply = time.perf_counter()
                self.runner.apply()
                self.apply_s = time.perf_counter() - t_apply
                self._after_commit(decision)
            else:
                self._drop()
                self._recover()
        self._finish()

    def _drop(self) -> None:
        self.runner.drop()
        if self.shadow is not None:
            self.shadow.dropped(self.step)

    def _attempt(self) -> Decision | None:
        """Compute step s and vote; the commit decision, or None when the step was aborted."""
        t0 = time.perf_counter()
        self.fabric.begin_step()
        comm = (
            RecordingStageComm(self.comm, recording_path(self.run_dir, self.layout.shape_class(self.rank).name))
            if self.recording
            else self.comm
        )
        loss = self.runner.compute(
            self.step, comm, midstep=self.faults.midstep(self.step), stop=self.fabric.check_abort
        )
        if self.shadow is not None:
            self.shadow.after_reduce(self.step, self.runner)
        if self.recording:
            comm.save()
            self.recording = False
        dt = time.perf_counter() - t0
        busy = max(0.0, dt - self.fabric.wait_s)
        digest = self.runner.digest() if self.cfg.runtime.verify_replicas else None
        if not self.cfg.runtime.commit_vote:
            self.link.send(
                Progress(
                    step=self.step,
                    epoch=self.epoch,
                    rank=self.rank,
                    loss=loss,
                    dt=dt,
                    peak_rss_mb=peak_rss_mb(),
                    digest=digest,
                )
            )
            return Decision(step=self.step, epoch=self.epoch)
        if self.check is not None:  # a shadowed joiner's first step: vote only on a checked state
            pending, self.check = self.check, None
            settle_before_vote(pending, self.rank, self.step, self.link.send)
        vote = Vote(
            step=self.step,
            epoch=self.epoch,
            rank=self.rank,
            loss=loss,
            dt=dt,
            peak_rss_mb=peak_rss_mb(),
            digest=digest,
            busy=busy,
            ckpt=self.ckpt_s,
        )
        self.ckpt_s = None
        self.faults.before_vote(self.step)
        self.link.send(vote)
        return self._wait_decision()

    def _wait_decision(self) -> Decision | None:
        while True:
            msg = self.link.get()
            if isinstance(msg, Decision) and msg.step == self.step:
                return msg
            if isinstance(msg, Abort):
                self.seen_abort = max(self.seen_abort, msg.epoch)
                return None
            self._dispatch(msg)

    def _leaves_in(self, decision: Decision) -> bool:
        """The decision carries this rank's move with its live shadow's switch."""
        sw = decision.switch
        return (
            sw is not None
            and self.shadow is not None
            and sw.epoch == self.shadow.epoch
            and sw.epoch in self.prepared
            and any(m.rank == self.rank for m in sw.moves)
        )

    def _after_commit(self, decision: Decision) -> None:
        self.step += 1
        if self.shadow is not None and not self._leaves_in(decision):  # a shadow started now could not follow
            self.shadow.after_commit(self.step, self.runner)
        self._checkpoint(decision)
        self.final = decision.final
        if decision.switch is not None:
            self._switch(decision.switch)
        self.epoch = decision.epoch
        if self.cfg.train.step_delay_s:
            time.sleep(self.cfg.train.step_delay_s)

    def _checkpoint(self, decision: Decision) -> None:
        """Periodic checkpoints in the background (train.checkpoint_async); one the controller asks for is
        complete before the step loop goes on, since it waits for it to restart or requeue."""
        every = self.cfg.train.checkpoint_every
        if (self.coord.dp != 0 and not self.layout.zero) or not (
            (every and self.step % every == 0) or decision.checkpoint
        ):
            return
        shard = checkpoint.shard_of(self.layout, self.rank)
        t0 = time.perf_counter()
        if decision.checkpoint or not self.cfg.train.checkpoint_async:
            self.saver.wait()
            checkpoint.save_stage(self.run_dir, self.step, shard, self.runner)
        else:
            self.saver.save(self.step, shard, self.runner)
        self.ckpt_s = time.perf_counter() - t0

    # ---- planned switch -----------------------------------------------------------------------
    def _switch(self, switch: SwitchSpec) -> None:
        epoch = switch.epoch
        build = self.prepared.pop(epoch, None)
        if build is None:
            return
        t0 = time.monotonic()
        handles = build.join(self.cfg.runtime.connect_timeout_s)
        leaving = [m for m in switch.moves if m.rank == self.rank]
        if leaving:
            self._leave(handles[f"xfer/r{self.rank}"], t0, epoch)
        self.fabric.install(handles)
        self.link.send(Switched(epoch=epoch, rank=self.rank, phase2_s=time.monotonic() - t0))
        self.epoch = epoch
        self.report_groups()

    def _leave(self, xfer: GroupHandle, t0: float, epoch: int) -> None:
        """Hand this rank over (agent/handover.py) and exit."""
        shadow = self.shadow if self.shadow is not None and self.shadow.epoch == epoch else None
        me = Leaver(
            link=self.link,
            runner=self.runner,
            faults=self.faults,
            rank=self.rank,
            dp=self.coord.dp,
            step=self.step,
            timeout_s=self.cfg.runtime.collective_timeout_s,
            apply_s=self.apply_s,
        )
        hand_over(me, xfer, shadow, t0)
        self.saver.wait()
        time.sleep(0.2)  # let the controller read our last message before the socket closes
        os._exit(0)

    # ---- messages -----------------------------------------------------------------------------
    def _poll_inbox(self) -> None:
        while not self.link.inbox.empty():
            self._dispatch(self.link.get())

    def _dispatch(self, msg: Any) -> None:
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
        gens = dict(msg.groups)
        pairs = {k: (v[0], v[1]) for k, v in msg.pairs.items()}

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

    # ---- unexpected failure -------------------------------------------------------------------
    def _recover(self) -> None:
        while self.seen_abort <= self.epoch:
            msg = self.link.get()
            if isinstance(msg, Abort):
                self.seen_abort = msg.epoch
            else:
                self._dispatch(msg)
        replied = -1
        while True:
            if replied < self.seen_abort:
                replied = self.seen_abort
                self.link.send(Aborted(epoch=replied, rank=self.rank, step=self.step, status=self.fabric.status()))
            msg = self.link.get()
            if isinstance(msg, Abort):
                self.seen_abort = max(self.seen_abort, msg.epoch)
            elif isinstance(msg, Recover) and msg.epoch == self.seen_abort:
                if self._apply_recover(msg) and (not msg.hold or self._held(msg.epoch)):
                    return
            else:
                self._dispatch(msg)

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
            self._dispatch(msg)

    def _apply_recover(self, msg: Recover) -> bool:
        self.faults.before_recovery(self.step)
        epoch = msg.epoch
        gens = dict(msg.groups)
        pairs = {k: (v[0], v[1]) for k, v in msg.pairs.items()}
        t0 = time.monotonic()
        build = self.fabric.build_in_background(gens, pairs)
        while not build.done():
            time.sleep(0.01)
            if self.link.abort_epoch > epoch:
                log.warning("recovery of epoch %d superseded by a new abort", epoch)
                return False
        try:
            handles = build.join(0)
        except CommError as exc:
            log.warning("recovery build failed: %s", exc)
            self.link.send(CommErrorReport(rank=self.rank, step=self.step, epoch=epoch, error=str(exc)[:1000]))
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
                    {"state": self.runner.state_for(target), "step": self.step},
                    self.cfg.runtime.collective_timeout_s,
                    midway=lambda: self.faults.during_transfer(self.step),
                )
            except CommError as exc:  # the joiner died mid-transfer: the controller plans again
                log.warning("state transfer to the joiner of %s failed: %s", name, exc)
                self.link.send(CommErrorReport(rank=self.rank, step=self.step, epoch=epoch, error=str(exc)[:1000]))
                return False
            finally:
                self.fabric.graveyard.append(h.pg)
        self.epoch = epoch
        self.link.clear_abort(epoch)
        self.link.send(
            Recovered(epoch=epoch, rank=self.rank, build_s=build_s, transfer_s=time.monotonic() - t1 if xfers else None)
        )
        self.report_groups()
        return True

    # ---- the end ----------------------------------------------------------------------------
    def _finish(self) -> None:
        self.saver.wait()
        self.runner.gather(self.comm)
        digest = self.runner.digest()
        if self.coord.dp == 0:
            out = RunDir(self.run_dir).final
            out.mkdir(exist_ok=True)
            torch.save(self.runner.module.state_dict(), out / f"{self.layout.shard_name(self.rank)}.pt")
        self.link.send(
            Done(
                rank=self.rank,
                stage=self.coord.stage,
                shard=self.layout.shard(self.rank),
                digest=digest,
                state_digest=self.runner.state_digest(),
                step=self.step,
                state_bytes=self.runner.state_bytes(),
                slice=self.coord.dp if self.layout.zero else None,
                ward_digest=self.runner.ward_digest(),
                optimizer_bytes=self.runner.optimizer_bytes(),
                buddy=BuddyCost.of(self.runner.buddy_times()),
            )
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                msg = self.link.get(timeout=1.0)
            except Exception:
                continue
            if isinstance(msg, Finish):
                return
            if isinstance(msg, Prepare):
                continue
