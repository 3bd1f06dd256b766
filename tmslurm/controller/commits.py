"""Step commits: one decision per step, made when every slot voted in the current epoch.

Contract (on the controller's thread):
- A vote (its own, or its row of a node relay's :class:`~tmslurm.wire.messages.NodeVotes`) counts only when the run is
  running, its epoch and step are the current ones and its sender owns the slot it votes for (a fenced or replaced
  process's late vote is dropped). While a restarted controller adopts its agents, a slot owner's vote is kept for the
  adoption to check. A vote of the recovery's own epoch that arrives before the controller has read every other rank's
  ``recovered`` (its agent finished the redone step first) is kept too: the step commits once the recovery is done and
  the last vote is in (the last reporter's own vote comes after its report), never before.
- When all slots voted, :meth:`Commits.commit` broadcasts ``decision: commit``. It carries a
  ready planned switch (phase 2; never on the last step), ``final`` after a stop request (with
  ``checkpoint`` when the stop was asked for: ``tmslurm stop``), and ``checkpoint`` when a
  checkpoint-then-restart (or -requeue) is pending. ``standby.start_when_warm`` holds the first
  commit until every standby is warm (or ``runtime.connect_timeout_s`` passed).
- Every commit appends to the step log (a rank's peak RSS only when it changed since the last
  entry that has it), completes event timelines, fires injected drains, and
  tells the cluster hooks; after the last step the run drains. Nothing here raises.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from tmslurm.controller.context import Context
from tmslurm.controller.gray import GrayEvictions
from tmslurm.controller.items import FaultAt, NoticeIn
from tmslurm.controller.membership import Membership
from tmslurm.controller.plan_types import PlannedSwitch
from tmslurm.controller.state import Agent, Mode
from tmslurm.controller.steptimes import StepTimes
from tmslurm.core.config import CLUSTER_FAULTS
from tmslurm.core.notices import Notice
from tmslurm.wire.messages import Activate, Decision, Groups, MoveSpec, NodeVotes, Progress, StepVote, SwitchSpec, Vote

log = logging.getLogger(__name__)


class Commits:
    def __init__(self, ctx: Context, members: Membership, gray: GrayEvictions | None = None) -> None:
        self.ctx = ctx
        self.state = ctx.state
        self.members = members
        self.gray = gray
        """Gray-failure evictions (``gray.evict``), fed every commit's busy times; None: off."""
        self.step_times = StepTimes()
        self.rss_logged: dict[int, float] = {}
        """The peak RSS last written to the step log, per rank."""

    def on_vote(self, agent: Agent, msg: Vote) -> None:
        self._count(agent, msg, time.monotonic())
        self.maybe_commit()

    def on_node_votes(self, agents: list[Agent | None], msg: NodeVotes) -> None:
        """A node relay's votes: each row counts as that agent's own vote would; one commit check."""
        now = time.monotonic()
        for agent, row in zip(agents, msg.rows()):
            if agent is not None and agent.alive:
                self._count(agent, row, now)
        self.maybe_commit()

    def _count(self, agent: Agent, vote: Vote | StepVote, now_m: float) -> None:
        st = self.state
        if st.mode is Mode.ADOPTING and st.owns_slot(agent, vote.rank):  # sorted out when the adoption decides
            st.votes[vote.rank] = vote
            return
        current = vote.epoch == st.epoch and vote.step == st.step and st.owns_slot(agent, vote.rank)
        if not current or st.mode not in (Mode.RUNNING, Mode.RECOVERING):
            return
        st.votes[vote.rank] = vote
        st.vote_t[vote.rank] = now_m

    def on_progress(self, agent: Agent, msg: Progress) -> None:
        st = self.state
        if msg.step == st.step and st.owns_slot(agent, msg.rank):
            st.votes[msg.rank] = msg
            if len(st.votes) == self.ctx.layout.world:
                self._record(time.time())
                self._advance()

    def on_groups(self, agent: Agent, msg: Groups) -> None:
        self.ctx.journal.write("groups", **msg.model_dump(exclude={"type"}))

    def maybe_commit(self) -> None:
        st = self.state
        if st.mode is Mode.RUNNING and len(st.votes) == self.ctx.layout.world and not self._hold_first_commit():
            self.commit()

    def _hold_first_commit(self) -> bool:
        st, cfg = self.state, self.ctx.cfg
        if not cfg.standby.start_when_warm or st.step_log or self.members.standby_target == 0:
            return False
        st.hold_since = st.hold_since or time.monotonic()
        seen = st.standbys()
        warming = sum(1 for a in seen if a.alive and not set(a.roles) >= set(self.ctx.layout.roles))
        # spawned and not connected yet: not one that died, nor one whose allocation is gone (see Deadlines)
        not_connected = sum(1 for kind, _ in st.expected if kind == "standby")
        return warming + not_connected > 0 and time.monotonic() - st.hold_since < cfg.runtime.connect_timeout_s

    def commit(self) -> None:
        st, now = self.state, time.time()
        plan = st.plan
        attach = isinstance(plan, PlannedSwitch) and plan.may_switch(now) and st.step + 1 < self.ctx.cfg.train.steps
        carried = plan if attach and isinstance(plan, PlannedSwitch) else None
        switch = self._apply(carried, now) if carried is not None else None
        then = st.checkpoint_then
        final = st.stop_requested and not attach
        stop_checkpoint = final and st.stop_checkpoint
        checkpoint = (then is not None and then.checkpoint_step is None) or stop_checkpoint
        self.ctx.broadcast(
            Decision(
                step=st.step,
                epoch=carried.epoch if carried is not None else st.epoch,
                switch=switch,
                checkpoint=checkpoint,
                final=final,
            )
        )
        if stop_checkpoint:
            st.stopped_at = st.step + 1
            self.ctx.journal.write("stop_checkpoint", step=st.step + 1)
        elif checkpoint and then is not None:
            then.checkpoint_step = st.step + 1
            st.mode = Mode.CHECKPOINTING
        if carried is not None:
            for m in carried.moves:
                self.ctx.send_to(m.joiner, Activate(epoch=carried.epoch))
            st.epoch = carried.epoch
        arrived = [st.vote_t[r] for r in st.votes if r in st.vote_t]
        self._record(now, time.monotonic() - min(arrived) if arrived else None)
        self._advance(final)

    def _apply(self, plan: PlannedSwitch, now: float) -> SwitchSpec:
        """The commit that carries ``plan``: phase 2 happens at this step boundary."""
        plan.applied = True
        plan.times["decision"] = now
        plan.target_step = self.state.step + 1
        if plan.event is not None:
            plan.event["last_commit_t"] = now
        plan.waiting = plan.joiners() | {f"r{m.rank}" for m in plan.moves}
        for key, msg in plan.deferred.items():
            self.ctx.send_to(key, msg)
        plan.deferred = {}
        return SwitchSpec(epoch=plan.epoch, moves=[MoveSpec(rank=m.rank, joiner=m.joiner) for m in plan.moves])

    def _record(self, now: float, commit_s: float | None = None) -> None:
        """Log the step: slowest step time, mean loss, RSS changes, the commit latency (first vote to
        decision) and the longest checkpoint stall reported, when there are ones."""
        st, layout = self.state, self.ctx.layout
        votes = list(st.votes.items())
        losses = [v.loss for _, v in votes if v.loss is not None]
        digests: dict[int, set[str]] = {}
        for r, v in votes:
            if v.digest is not None:
                digests.setdefault(layout.shard(r), set()).add(v.digest)
        if any(len(d) > 1 for d in digests.values()):
            st.replica_mismatch.append(st.step)
            log.error("data-parallel replicas differ before step %d", st.step)
        entry: dict[str, Any] = {
            "step": st.step,
            "t_end": now,
            "dt": max(v.dt for _, v in votes),
            "loss": sum(losses) / len(losses) if losses else None,
            "epoch": st.epoch,
            "peak_rss_mb": self._rss_changes(votes),
        }
        if commit_s is not None:
            entry["commit_s"] = commit_s
        stalls = [v.ckpt for _, v in votes if v.ckpt is not None]
        if stalls:
            entry["ckpt_s"] = max(stalls)
        st.step_log.append(entry)
        self.ctx.events.on_commit(st.step, now, self.median_step())
        if self.gray is not None:
            self.gray.on_commit({r: v.busy for r, v in votes})
        if st.step % 10 == 0 or st.step == self.ctx.cfg.train.steps - 1:
            log.info("step %d loss %.4f step time %.3fs", st.step, entry["loss"] or float("nan"), entry["dt"])

    def largest_rank_rss(self) -> float | None:
        """The largest peak RSS any rank has reported (MiB), None before the first commit."""
        return max(self.rss_logged.values(), default=None)

    def _rss_changes(self, votes: list[tuple[int, Any]]) -> dict[int, float]:
        """Each rank's peak RSS where it differs from the last one logged for that rank: a peak is a
        high-water mark that settles after warm-up, so a step entry stays O(1) in steady state
        instead of O(ranks) (at 4,096 ranks and a week of steps, per-rank dicts were ~20 GB)."""
        changed = {r: v.peak_rss_mb for r, v in sorted(votes) if self.rss_logged.get(r) != v.peak_rss_mb}
        self.rss_logged.update(changed)
        return changed

    def _advance(self, final: bool = False) -> None:
        st = self.state
        st.votes = {}
        st.step += 1
        self.ctx.hooks.on_step(st.step, self.members.nodes)
        if st.step >= self.ctx.cfg.train.steps or final:
            st.mode = Mode.DRAINING
            return
        for f in self.ctx.pending_faults():
            if f.kind in ("drain", *CLUSTER_FAULTS) and f.step == st.step:
                st.fired.add(f.index)
                # journalled first: a fault that takes down the controller's own host is never fired again
                self.ctx.journal.write("fault_firing", index=f.index, kind=f.kind, rank=f.rank, ranks=f.ranks)
                fired = lambda t, nodes, f=f: self.ctx.submit(FaultAt(f, tuple(nodes), t))  # noqa: E731
                if self.ctx.hooks.inject_fault(f, fired):  # on Slurm through scontrol or the lab
                    self.ctx.journal.write(
                        "fault", index=f.index, kind=f.kind, rank=f.rank, ranks=f.ranks, via="cluster"
                    )
                    continue
                for rank in f.ranks:
                    self.ctx.submit(
                        NoticeIn(
                            Notice(
                                kind="maintenance", rank=rank, source="fault", reason="injected drain", time=time.time()
                            )
                        )
                    )

    def median_step(self) -> float:
        """The median gap between consecutive commits (:mod:`tmslurm.controller.steptimes`)."""
        return self.step_times.median(self.state.step_log)
