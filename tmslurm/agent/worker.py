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
Prepares, switches, aborts and recoveries are handled by :class:`~tmslurm.agent.rank_plans.RankPlans`,
which holds the rank's epoch.
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
import time
from pathlib import Path
from typing import Any

import torch

from tmslurm.agent.build import build_runner, layout_of, make_fabric, peak_rss_mb
from tmslurm.agent.faults import FaultPlan
from tmslurm.agent.link import Link
from tmslurm.agent.rank_plans import RankPlans
from tmslurm.agent.shadowcheck import PendingCheck, settle_before_vote
from tmslurm.comm.fabric import Fabric
from tmslurm.comm.stage_comm import FabricStageComm, RecordingStageComm, recording_path
from tmslurm.core.config import RunConfig, from_dict
from tmslurm.core.errors import CommAborted, CommError
from tmslurm.core.logs import LOG_CONTEXT
from tmslurm.core.rundir import RunDir
from tmslurm.train import checkpoint
from tmslurm.train.async_checkpoint import AsyncCheckpointer
from tmslurm.train.schedule import StageRunner
from tmslurm.wire.messages import (
    Abort,
    BuddyCost,
    CommErrorReport,
    Decision,
    Done,
    Finish,
    Prepare,
    Progress,
    Started,
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
        self.step = step
        self.faults = faults
        self.addr = addr
        self.layout = layout_of(cfg)
        self.coord = self.layout.coord(rank)
        self.apply_s = 0.0
        """The last optimizer update's seconds (a leaver reports it: every step's gap holds one)."""
        self.check = check
        """This rank took its slot from a live shadow not compared yet: its first step votes after the verdict."""
        self.final = False
        """The controller's decision said this step is the run's last."""
        self.recording = self._should_record()
        self.saver = AsyncCheckpointer(run_dir)
        self.ckpt_s: float | None = None
        """Seconds the last decision's checkpoint held the step loop (sent with the next vote), None if none."""
        self.plans = RankPlans(link, cfg, self.layout, rank, runner, fabric, faults, self.saver, epoch)
        """Planned switches, aborts and recoveries (:mod:`tmslurm.agent.rank_plans`); it holds the epoch."""
        link.before_exit.append(self.saver.wait)
        link.sticky.clear()  # a standby that joined is no standby any more: its ready messages are void
        link.rejoin_state = self.rejoin_state
        self.plans.report_groups(step)
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
            "epoch": self.plans.epoch,
            "in_plan": bool(self.plans.prepared) or self.plans.seen_abort > self.plans.epoch,
            "prepared": sorted(self.plans.prepared),
            "aborting": self.plans.seen_abort > self.plans.epoch,
            "step": self.step,
        }

    # ---- the step loop ------------------------------------------------------------------------
    def run(self) -> None:
        while self.step < self.cfg.train.steps and not self.final:
            self.plans.poll_inbox()
            LOG_CONTEXT["step"] = self.step
            try:
                decision = self._attempt()
            except (CommError, CommAborted) as exc:
                self._drop()
                if not isinstance(exc, CommAborted):
                    log.warning("step %d failed: %s", self.step, exc)
                    self.link.send(
                        CommErrorReport(rank=self.rank, step=self.step, epoch=self.plans.epoch, error=str(exc)[:1000])
                    )
                self.plans.recover(self.step)
                continue
            if decision is not None:
                if self.plans.shadow is not None:
                    self.plans.shadow.before_apply(
                        self.step, self.runner, self.plans.poll_inbox, last=self._leaves_in(decision)
                    )
                t_apply = time.perf_counter()
                self.runner.apply()
                self.apply_s = time.perf_counter() - t_apply
                self._after_commit(decision)
            else:
                self._drop()
                self.plans.recover(self.step)
        self._finish()

    def _drop(self) -> None:
        self.runner.drop()
        if self.plans.shadow is not None:
            self.plans.shadow.dropped(self.step)

    def _attempt(self) -> Decision | None:
        """Compute step s and vote; the commit decision, or None when the step was aborted."""
        t0 = time.perf_counter()
        self.fabric.begin_step()
        recorder = (
            RecordingStageComm(self.comm, recording_path(self.run_dir, self.layout.shape_class(self.rank).name))
            if self.recording
            else None
        )
        loss = self.runner.compute(
            self.step,
            self.comm if recorder is None else recorder,
            midstep=self.faults.midstep(self.step),
            stop=self.fabric.check_abort,
        )
        if self.plans.shadow is not None:
            self.plans.shadow.after_reduce(self.step, self.runner)
        if recorder is not None:
            recorder.save()
            self.recording = False
        dt = time.perf_counter() - t0
        busy = max(0.0, dt - self.fabric.wait_s)
        digest = self.runner.digest() if self.cfg.detect.verify_replicas else None
        if not self.cfg.bench.commit_vote:
            self.link.send(
                Progress(
                    step=self.step,
                    epoch=self.plans.epoch,
                    rank=self.rank,
                    loss=loss,
                    dt=dt,
                    peak_rss_mb=peak_rss_mb(),
                    digest=digest,
                )
            )
            return Decision(step=self.step, epoch=self.plans.epoch)
        if self.check is not None:  # a shadowed joiner's first step: vote only on a checked state
            pending, self.check = self.check, None
            settle_before_vote(pending, self.rank, self.step, self.link.send)
        vote = Vote(
            step=self.step,
            epoch=self.plans.epoch,
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
                self.plans.seen_abort = max(self.plans.seen_abort, msg.epoch)
                return None
            self.plans.dispatch(msg)

    def _leaves_in(self, decision: Decision) -> bool:
        """The decision carries this rank's move with its live shadow's switch."""
        sw = decision.switch
        return (
            sw is not None
            and self.plans.shadow is not None
            and sw.epoch == self.plans.shadow.epoch
            and sw.epoch in self.plans.prepared
            and any(m.rank == self.rank for m in sw.moves)
        )

    def _after_commit(self, decision: Decision) -> None:
        self.step += 1
        if self.plans.shadow is not None and not self._leaves_in(decision):  # a shadow started now could not follow
            self.plans.shadow.after_commit(self.step, self.runner)
        self._checkpoint(decision)
        self.final = decision.final
        if decision.switch is not None:
            self.plans.switch(decision.switch, self.step, self.apply_s)
        self.plans.epoch = decision.epoch
        if self.cfg.bench.step_delay_s:
            time.sleep(self.cfg.bench.step_delay_s)

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
