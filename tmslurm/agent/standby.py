"""The standby agent: a universal, sandboxed, warm replacement for any training rank.

Contract:
- Warm-up: for every *shape class* of the layout (``Layout.shape_classes``: first, last, and each
  distinct middle size; or the only stage), up to ``standby.max_classes``, the standby builds one
  runner (stage module, optimizer, compiled graphs) for the class's first stage as dp rank 0, TP
  position 0, and runs ``standby.warmup_iters`` shadow iterations of the real schedule through a
  :class:`~tmslurm.comm.stage_comm.SandboxStageComm`: every value that would come from a peer
  (activations, gradients, DP and TP reductions) is replayed from the recording rank (dp 0, tp 0)
  of that stage made of its first step, sends are skipped, and the sandbox talks to nobody. It
  reports ``ready`` per class with its warm-up time and RSS; classes beyond the cap are reported
  with ``warm: false``. With ``standby.shared_arena`` (default) each warm class's parameters and
  optimizer moments are re-bound to one host buffer sized to the largest class
  (:class:`~tmslurm.train.arena.Arena`): the classes alias each other's storage, which is harmless
  because a join loads every parameter and moment, so a standby holds the state of one rank.
- Join: told to take slot r at epoch e, it retargets the warm runner of r's class to r's stage, DP
  rank and TP position (same shapes, so the module and its compiled graphs serve as they are), builds
  all of r's groups at generation e plus a two-member transfer group to its state source (phase 1),
  then receives the state (at once after an unexpected failure, or on ``activate`` for a planned
  switch), loads it, installs the groups and continues as the
  :class:`~tmslurm.agent.worker.Worker` of slot r. ``joined`` carries ``joiner_warm: true``, or
  ``false`` with the reason when the runner had to be built during the join (class beyond the cap).
  Module and optimizer ``load_state_dict`` replace every parameter and moment and the gradients are
  dropped, so nothing of the warm-up leaks into training. ``cancel`` returns it to the pool, still warm.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from tmslurm.agent.build import build_runner, layout_of, make_fabric, peak_rss_mb, reset_peak_rss, rss_mb, stage_spec
from tmslurm.agent.faults import FaultPlan
from tmslurm.agent.groupspec import groups_to_build, wait_built
from tmslurm.agent.link import Link
from tmslurm.agent.shadowcheck import PendingCheck
from tmslurm.agent.worker import Worker
from tmslurm.comm.shadow import follow
from tmslurm.comm.stage_comm import SandboxStageComm, recording_path
from tmslurm.comm.transfer import recv_state
from tmslurm.core.config import from_dict
from tmslurm.core.errors import CommError, TmslurmError
from tmslurm.core.logs import LOG_CONTEXT
from tmslurm.train.arena import Arena, release_free_memory
from tmslurm.train.schedule import StageRunner
from tmslurm.wire.messages import (
    Activate,
    Cancel,
    Finish,
    Join,
    Joined,
    JoinFailed,
    Prepared,
    Ready,
    ShadowReady,
    Welcome,
)

log = logging.getLogger(__name__)


class Standby:
    def __init__(self, run_dir: Path, link: Link, welcome: Welcome, ident: int) -> None:
        self.run_dir = Path(run_dir)
        self.link = link
        self.address = welcome.address.model_dump()
        self.cfg = from_dict(welcome.config)
        self.layout = layout_of(self.cfg)
        self.ident = ident
        self.warm: dict[str, StageRunner] = {}
        self.arena = Arena()
        self.stash: list[Any] = []
        self.joining = False
        self.cancel_seen = False
        """The join in progress saw its ``cancel`` (a failure it then meets is no join failure)."""
        self.planned_join: int | None = None
        """The epoch of the planned join in progress while it is not activated (phase 1), else None."""
        self.join_epoch = 0
        """The epoch of the join in progress (a rejoin names it, so that a new controller can cancel it)."""
        link.rejoin_state = lambda: {
            "rank": None,
            "epoch": self.join_epoch if self.joining else 0,
            "in_plan": self.joining,
            "prepared": [self.planned_join] if self.joining and self.planned_join is not None else [],
        }

    def run(self) -> None:
        base = rss_mb()
        cap = self.cfg.standby.max_classes
        for shape in self.layout.shape_classes[:cap]:
            if not self._warm_role(shape.name, base):
                return
            base = rss_mb()
        for shape in self.layout.shape_classes[cap:]:
            log.warning(
                "shape class %s not warmed (standby.max_classes=%d): a join there builds in the pause", shape.name, cap
            )
            self.link.send(
                Ready(
                    role=shape.name,
                    warm=False,
                    stages=list(shape.stages),
                    warmup_s=0.0,
                    rss_mb=rss_mb(),
                    role_rss_mb=0.0,
                    sandbox_sends_skipped=0,
                )
            )
        while True:
            msg = self._next()
            if isinstance(msg, Join):
                worker = self._join(msg)
                self.joining = False
                if worker is not None:
                    worker.run()
                    return
            elif isinstance(msg, Finish):
                return

    def _warm_role(self, role: str, base_rss: float) -> bool:
        path = recording_path(self.run_dir, role)
        deadline = time.monotonic() + self.cfg.runtime.connect_timeout_s
        while not path.exists():
            if not self.link.inbox.empty() and isinstance(self.link.get(), Finish):
                return False
            if time.monotonic() > deadline:
                raise TmslurmError(
                    f"sandbox recording {path} did not appear in {self.cfg.runtime.connect_timeout_s:.0f}s"
                )
            time.sleep(0.05)
        t0 = time.monotonic()
        if self.arena.bound:  # the classes warmed so far need no storage while this one warms
            self.arena.release()
        stage = self.layout.representative_stage(role)
        runner = build_runner(self.cfg, 0, stage=stage)
        sandbox = SandboxStageComm(path, runner.device)
        for _ in range(self.cfg.standby.warmup_iters):
            runner.compute(0, sandbox)
            runner.apply()
        sent = sandbox.sent
        del sandbox  # the recording (a step's boundary values and reduced gradient) is not needed any more
        if self.cfg.standby.shared_arena and runner.device.type == "cpu":
            self.arena.bind(runner)
        release_free_memory()
        self.warm[role] = runner
        rss = rss_mb()
        stages = list(self.layout.stages_of_class(role))
        self.link.send(
            Ready(
                role=role,
                stages=stages,
                warmup_s=time.monotonic() - t0,
                rss_mb=rss,
                peak_rss_mb=peak_rss_mb(),
                arena_mb=self.arena.nbytes / 2**20,
                role_rss_mb=rss - base_rss,
                sandbox_sends_skipped=sent,
            )
        )
        log.info(
            "role %s warm in %.2fs (RSS %.0f MiB, arena %.0f MiB)",
            role,
            time.monotonic() - t0,
            rss,
            self.arena.nbytes / 2**20,
        )
        return True

    def _runner_for(self, rank: int) -> tuple[StageRunner, str | None]:
        """The runner for slot ``rank`` and, when it is not a warm one, why."""
        c = self.layout.coord(rank)
        shape = self.layout.shape_class(rank)
        runner = self.warm.get(shape.name)  # kept: a cancelled join leaves the standby warm
        if runner is not None:
            runner.retarget(stage_spec(self.cfg, c.stage, c.tp), c.dp)
            return runner, None
        reason = f"shape class {shape.name} was not warmed (standby.max_classes={self.cfg.standby.max_classes})"
        log.warning("joining rank %d cold: %s", rank, reason)
        return build_runner(self.cfg, rank), reason

    def _join(self, msg: Join) -> Worker | None:
        rank, epoch = msg.rank, msg.epoch
        self.joining = True  # until it returns: a Worker then answers for the link, or the join failed
        self.planned_join = None if msg.activate else epoch
        self.join_epoch = epoch
        self.cancel_seen = False
        LOG_CONTEXT["who"] = f"standby{self.ident}->rank{rank}"
        runner, cold_reason = self._runner_for(rank)
        fabric = make_fabric(self.cfg, rank, self.link, self.address)
        xfer = msg.xfer
        t0 = time.monotonic()
        build = fabric.build_in_background(*groups_to_build(msg))
        if not wait_built(build, lambda: self._cancelled(epoch)):
            return None
        try:
            handles = build.join(0)
        except CommError as exc:
            self.link.send(JoinFailed(epoch=epoch, rank=rank, error=str(exc)[:300]))
            return None
        phase1_s = time.monotonic() - t0
        if not msg.activate:
            self.link.send(Prepared(epoch=epoch, rank=rank, joiner=self.ident, phase1_s=phase1_s))
        if msg.shadow:
            return self._follow(msg, runner, fabric, handles, phase1_s, cold_reason)
        if not msg.activate and not self._await_activate(epoch):
            return None
        t1 = time.monotonic()
        try:
            faults = FaultPlan(msg.faults, rank, self.link.send)
            state, nbytes = recv_state(
                handles.pop(xfer).pg,
                0,
                self.cfg.runtime.collective_timeout_s,
                lambda: self._cancelled(epoch),
                into={"state": runner.state()},
                midway=lambda: faults.during_transfer(None, "join"),
            )
        except CommError as exc:
            self.link.send(JoinFailed(epoch=epoch, rank=rank, error=str(exc)[:300]))
            return None
        runner.load_state(state["state"])
        joined = Joined(
            epoch=epoch,
            rank=rank,
            joiner=self.ident,
            step=int(state["step"]),
            transfer_s=time.monotonic() - t1,
            phase1_s=phase1_s,
            bytes=nbytes,
            rss_mb=0.0,
            joiner_warm=cold_reason is None,
            warm_reason=cold_reason,
        )
        return self._become(joined, runner, fabric, handles)

    def _follow(
        self,
        msg: Join,
        runner: StageRunner,
        fabric: Any,
        handles: dict[str, Any],
        phase1_s: float,
        cold_reason: str | None,
    ) -> Worker | None:
        """Follow the leaver as a live shadow until the switch (comm/shadow.py), then take its slot."""
        epoch, rank = msg.epoch, msg.rank
        ready = lambda step, s: self.link.send(ShadowReady(epoch=epoch, rank=rank, step=step, catchup_s=s))  # noqa: E731
        pg = handles.pop(msg.xfer).pg
        try:
            got = follow(
                pg,
                runner,
                self.cfg.runtime.collective_timeout_s,
                lambda: self._cancelled(epoch),
                ready,
                corrupt=self.faults_corrupt_shadow(rank),
            )
        except CommError as exc:
            if not self.cancel_seen:
                self.link.send(JoinFailed(epoch=epoch, rank=rank, error=str(exc)[:300]))
            return None
        pending = PendingCheck(epoch, pg, runner, self.cfg.runtime.collective_timeout_s) if got.shadowed else None
        if not self._await_activate(epoch):
            return None
        joined = Joined(
            epoch=epoch,
            rank=rank,
            joiner=self.ident,
            step=got.step,
            transfer_s=got.switch_s,
            phase1_s=phase1_s,
            bytes=got.switch_bytes,
            rss_mb=0.0,
            joiner_warm=cold_reason is None,
            warm_reason=cold_reason,
            shadowed=got.shadowed,
            shadow_steps=got.steps,
            shadow_catchup_s=got.catchup_s,
            apply_s=got.apply_s,
        )
        return self._become(joined, runner, fabric, handles, pending)

    def _become(
        self,
        joined: Joined,
        runner: StageRunner,
        fabric: Any,
        handles: dict[str, Any],
        pending: PendingCheck | None = None,
    ) -> Worker:
        """Install the new groups and continue as the worker of the joined slot."""
        fabric.install(handles)
        self.warm = {}  # the other classes' runners are not needed any more
        if not reset_peak_rss():  # from here on the peak it reports is its peak as a rank
            log.warning(
                "cannot reset the peak RSS (/proc/self/clear_refs): rank %d's peak includes its warm-up", joined.rank
            )
        self.link.send(joined.model_copy(update={"rss_mb": rss_mb()}))
        log.info(
            "now rank %d at step %d (%d state bytes in the pause, %.3fs%s)",
            joined.rank,
            joined.step,
            joined.bytes,
            joined.transfer_s,
            ", shadowed" if joined.shadowed else "",
        )
        return Worker(
            self.run_dir,
            self.link,
            self.cfg,
            joined.rank,
            runner,
            fabric,
            joined.epoch,
            joined.step,
            FaultPlan.none(),
            self.address,
            check=pending,
        )

    def faults_corrupt_shadow(self, rank: int) -> bool:
        """The test fault ``corrupt_shadow`` at ``rank``: flip one bit of the shadow before the switch."""
        return any(f.kind == "corrupt_shadow" and f.rank == rank for f in self.cfg.faults)

    def _next(self) -> Any:
        return self.stash.pop(0) if self.stash else self.link.get()

    def _cancelled(self, epoch: int) -> bool:
        """Check for a cancel without losing other messages (an early ``activate`` is kept)."""
        while not self.link.inbox.empty():
            msg = self.link.get()
            if isinstance(msg, Cancel) and msg.epoch == epoch:
                log.info("join of epoch %d cancelled; back in the pool", epoch)
                self.cancel_seen = True
                return True
            if isinstance(msg, Finish):
                os._exit(0)
            self.stash.append(msg)
        return False

    def _await_activate(self, epoch: int) -> bool:
        while True:
            msg = self._next()
            if isinstance(msg, Activate) and msg.epoch == epoch:
                self.planned_join = None  # phase 2: the switch is applied
                return True
            if isinstance(msg, Cancel) and msg.epoch == epoch:
                return False
            if isinstance(msg, Finish):
                os._exit(0)
