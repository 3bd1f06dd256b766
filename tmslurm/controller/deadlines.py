"""Deadlines: nothing waits forever. Checked by the loop between queue items, at most every ``loop.TICK_S``.

Contract (on the controller's thread): an agent silent for ``detect.heartbeat_timeout_s`` is
fenced (``runtime.connect_timeout_s`` while it is still starting: see ``Agent.starting``) (its own handle; silent agents
are looked for 20 times per timeout) and handled as lost; so is a rank that heartbeats but makes no progress: its vote
is the only one missing for longer than ``detect.hang_factor`` x the median step time (at least
``detect.hang_floor_s``; ``runtime.connect_timeout_s`` while no step time is known) after every other rank voted (cause
``no progress``); ranks silent during an abort past the recovery's deadline are declared dead and the failure is
replanned; a phase 1 that does not finish within ``runtime.connect_timeout_s`` cancels its switch (the notice is
retried); a communication error nobody explains within ``heartbeat_timeout_s`` aborts the step; a drained run finishes;
a held first commit is released (while it waits for standbys, the spare allocations are looked at every
``SPARES_CHECK_S``: a spare job that died before its standby connected is otherwise only noticed at a committed step,
and the hold would last ``runtime.connect_timeout_s``); the batch-host checkpoint is watched; a plan applied but not
finished within ``runtime.switch_timeout_s`` fences whoever has not reported and recovers again (``stuck``); every agent
gets a ``beat`` each ``runtime.controller_lost_s`` / 5; a standby whose allocation the spawner reports gone (a failed
sbatch, an ended spare job) is no longer expected, so ``standby.replenish`` asks for another. Nothing here raises.
"""

from __future__ import annotations

import logging
import time

from tmslurm.controller.commits import Commits
from tmslurm.controller.context import Context
from tmslurm.controller.membership import Membership
from tmslurm.controller.plan_lifecycle import PlanBook
from tmslurm.controller.plan_types import PlannedSwitch, Recovery
from tmslurm.controller.recoveries import Recoveries
from tmslurm.controller.restarts import Restarts
from tmslurm.controller.state import Mode
from tmslurm.wire.messages import Beat

log = logging.getLogger(__name__)
SCANS_PER_TIMEOUT = 20
SPARES_CHECK_S = 5.0
"""How often the spare allocations are looked at while the first commit waits for standbys."""


class Deadlines:
    def __init__(
        self,
        ctx: Context,
        members: Membership,
        plans: PlanBook,
        recoveries: Recoveries,
        restarts: Restarts,
        commits: Commits,
    ) -> None:
        self.ctx = ctx
        self.state = ctx.state
        self.members = members
        self.plans = plans
        self.recoveries = recoveries
        self.restarts = restarts
        self.commits = commits
        self.last_beat_m = 0.0
        self.scanned_m = float("-inf")
        """When the silent agents were last looked for (monotonic)."""
        self.spares_checked_m = float("-inf")
        """When the spare allocations were last looked at while the first commit was held (monotonic)."""

    def tick(self, now: float | None = None, now_m: float | None = None) -> None:
        now = time.time() if now is None else now
        now_m = time.monotonic() if now_m is None else now_m
        self._heartbeats(now_m)
        self._progress(now_m)
        self._plan(now)
        self._stuck(now)
        self._beat(now_m)
        self._lost_standbys()
        st = self.state
        if (
            st.comm_error_since is not None
            and st.mode is Mode.RUNNING
            and now - st.comm_error_since > self.ctx.cfg.detect.heartbeat_timeout_s
        ):
            self.recoveries.fail(set(), "unexplained communication error", now)
        if st.mode is Mode.DRAINING and self._drained():
            st.mode = Mode.FINISHED
        self.restarts.tick()
        if st.hold_since is not None and not st.step_log:
            if now_m - self.spares_checked_m >= SPARES_CHECK_S:  # no committed step looks at them yet
                self.spares_checked_m = now_m
                self.ctx.hooks.check_spares()
            self.commits.maybe_commit()

    def _lost_standbys(self) -> None:
        gone = [i for i in self.ctx.spawner.take_lost_standbys() if ("standby", i) in self.state.expected]
        for i in gone:
            self.state.expected.discard(("standby", i))
            self.ctx.journal.write("standby_allocation_lost", standby=i)
            log.warning("standby %d will not start (its allocation is gone): no longer expected", i)
        if gone:
            self.members.replenish()

    def _heartbeats(self, now_m: float) -> None:
        """Fence the silent agents. An agent still starting (before its ``started`` or first
        ``ready``) is allowed ``runtime.connect_timeout_s``: under two CI lanes a rank waiting for its
        peers' groups went 3.1 s without a heartbeat 4 s after its hello, and the false alarm forced
        an in-job restart before step 0. A start-up that really hangs is still found then, a dead
        one at once by its closed connection, a powered-off node by its monitor. The scan walks every agent, so it runs
        at most :data:`SCANS_PER_TIMEOUT` times per ``heartbeat_timeout_s`` (at 4,096 agents a scan every 50 ms tick
        was a millisecond each): an agent is caught at most 1/20 of the timeout late."""
        det = self.ctx.cfg.detect
        if not self.ctx.cfg.bench.heartbeats or now_m - self.scanned_m < det.heartbeat_timeout_s / SCANS_PER_TIMEOUT:
            return
        self.scanned_m = now_m
        oldest = now_m - det.heartbeat_timeout_s
        oldest_starting = now_m - max(det.heartbeat_timeout_s, self.ctx.cfg.runtime.connect_timeout_s)
        for agent in [
            a
            for a in self.state.agents.values()
            if a.alive and a.last_seen < (oldest_starting if a.starting else oldest)
        ]:
            silent = now_m - agent.last_seen
            if not agent.expected_exit:
                log.warning("%s missed heartbeats for %.1fs: fencing it", agent.aid, silent)
                self.ctx.journal.write("hung", agent=agent.aid, node=agent.node, silent_s=silent)
                self.members.kill(agent)
                self.recoveries.lost(agent, "heartbeat timeout")

    def hang_limit_s(self) -> float:
        """How long the last rank may lag behind every other vote. Before a step time is known (the
        first two commits of a run or of a restart) the first steps allocate and first touch the
        state, GBs per rank at real sizes, and the ranks' shares of that differ by seconds (a
        ``model=large`` first stage lagged 2 s behind its peers at step 0): then the limit is
        ``runtime.connect_timeout_s``. Heartbeats still find a silent rank in that window."""
        det = self.ctx.cfg.detect
        median = self.commits.median_step()
        if median <= 0:
            return max(det.hang_floor_s, self.ctx.cfg.runtime.connect_timeout_s)
        return max(det.hang_floor_s, det.hang_factor * median)

    def _progress(self, now_m: float) -> None:
        st, world = self.state, self.ctx.layout.world
        if st.mode is not Mode.RUNNING or world < 2 or len(st.votes) != world - 1 or not self.ctx.cfg.bench.commit_vote:
            return  # a lone rank has no peers to be late against: its heartbeats are its liveness
        (rank,) = set(range(world)) - set(st.votes)
        agent = st.agent_of(rank)
        lag = now_m - max(st.vote_t.get(r, now_m) for r in st.votes)
        if agent is None or not agent.alive or agent.expected_exit or lag <= self.hang_limit_s():
            return
        log.warning(
            "rank %d has not voted for step %d %.1fs after all the others: hung, fencing it", rank, st.step, lag
        )
        self.ctx.journal.write(
            "hung", agent=agent.aid, node=agent.node, rank=rank, step=st.step, lag_s=lag, limit_s=self.hang_limit_s()
        )
        self.members.kill(agent)
        self.recoveries.lost(agent, "no progress")

    def _plan(self, now: float) -> None:
        plan = self.state.plan
        if isinstance(plan, Recovery) and not plan.applied and now > plan.deadline:
            self.recoveries.fail({int(w[1:]) for w in plan.waiting if w.startswith("r")}, "silent during abort", now)
        elif (
            isinstance(plan, PlannedSwitch)
            and not plan.ready
            and now - plan.times["pick"] > self.ctx.cfg.runtime.connect_timeout_s
        ):
            log.warning("phase 1 of epoch %d did not finish; cancelling", plan.epoch)
            self.plans.cancel(requeue=True)

    def _stuck(self, now: float) -> None:
        """An applied plan that has not finished within ``runtime.switch_timeout_s``: fence who has
        not reported and recover the step again (a new epoch) without them."""
        plan, limit = self.state.plan, self.ctx.cfg.runtime.switch_timeout_s
        if plan is None or not plan.applied or self.state.mode.ending:
            return
        started = plan.times.get("decision", plan.times.get("pick"))
        if started is None or now - started <= limit or not plan.waiting:
            return
        waiting = sorted(plan.waiting)
        ranks = {int(w[1:]) for w in waiting if w.startswith("r")}
        for m in plan.moves:
            if m.joiner in plan.waiting:
                ranks.add(m.rank)
                joiner = self.state.agents.get(m.joiner)
                if joiner is not None and joiner.alive:
                    self.members.kill(joiner)
                    self.ctx.journal.write(
                        "fenced", agent=joiner.aid, rank=m.rank, node=joiner.node, cause="stuck in switch"
                    )
        log.warning(
            "epoch %d: %s did not finish within %.0fs (runtime.switch_timeout_s): fencing them",
            plan.epoch,
            ", ".join(waiting),
            limit,
        )
        self.ctx.journal.write("stuck", epoch=plan.epoch, kind=plan.kind, waiting=waiting, after_s=now - started)
        self.recoveries.fail(ranks, "stuck in switch", now)

    def _beat(self, now_m: float) -> None:
        """Tell every agent the controller lives (they exit after ``runtime.controller_lost_s`` without it)."""
        if now_m - self.last_beat_m < self.ctx.cfg.runtime.controller_lost_s / 5:
            return
        self.last_beat_m = now_m
        self.ctx.send_all(Beat())  # encoded once, one frame per node relay

    def _drained(self) -> bool:
        """Every rank reported its final digest, or the missing ones died after the final commit and
        a data-parallel replica reported their shard (replicas are identical)."""
        st, world = self.state, self.ctx.layout.world
        if len(st.done) >= world:
            return True
        missing = [r for r in range(world) if r not in st.done]
        shards = {m.shard_index for m in st.done.values()}
        return all(not st.rank_alive(r) for r in missing) and shards >= set(range(self.ctx.layout.shards))
