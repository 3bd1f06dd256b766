"""Gray failures: a node that stays up but computes slower than its peers (a throttled CPU).

Contract (pure: the caller passes every committed step's busy times and the clock):
- A rank's *busy* time is its step time minus the time it waited in communication
  (:meth:`tmslurm.comm.fabric.Fabric.wait_s`): in a synchronous step everyone waits for the slowest
  rank, so step times are equal and only busy times say who is slow.
- A rank is compared with its data-parallel peers (same pipeline stage and tensor slice: the same
  work): its ratio is its busy time over the median of theirs. Every rank slow together gives
  ratios near 1 (nobody is evicted); a run without peers (dp=1) is never judged.
- A rank is *slow* when the low median of its last ``window`` ratios is at least ``factor`` and the
  low median of its excess over its peers is at least ``min_excess_s``: more than half of the
  window must be slow. The median makes a single hiccup (one
  slow step, however long) move nothing: it takes more than half the window.
- :meth:`GrayWatch.observe` returns the ranks found slow at this step that are not already
  suspected; a rank is suspected until :meth:`reset` (any change of epoch: a switch or a recovery
  changes who holds the slots, and every window starts over).
- :meth:`GrayWatch.allow_eviction` spends the hourly budget: at most ``budget_per_hour``
  evictions in any hour.
- :class:`GrayEvictions` (``gray.evict``) feeds it each commit and turns a slow rank into a
  maintenance notice for its node, so that the ordinary planned switch moves it to a warm standby;
  :meth:`GrayEvictions.move_off` does the same for a node whose link is slow
  (:mod:`tmslurm.controller.linkwatch`), under the same conditions and hourly budget.
Nothing here raises on odd input: a vote without a busy time is skipped.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from tmslurm.controller.context import Context
from tmslurm.controller.items import NoticeIn
from tmslurm.controller.membership import Membership
from tmslurm.controller.state import Mode
from tmslurm.core.config import GrayConfig
from tmslurm.core.notices import Notice

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class GraySettings:
    factor: float
    """A rank is slow when its busy time is this many times its peers' (median over the window)."""
    window: int
    """Steps in the window: a rank must be slow in more than half of them."""
    min_excess_s: float
    """And slower than its peers by at least this much (tiny steps are noise)."""
    budget_per_hour: int
    """At most this many evictions in any hour."""


@dataclass(frozen=True)
class Slow:
    """A rank found slow: its median ratio and excess over its peers in the window."""

    rank: int
    ratio: float
    excess_s: float


class GrayWatch:
    def __init__(self, settings: GraySettings, peers: dict[int, list[int]]) -> None:
        """``peers[r]``: the other ranks doing the same work as r (its data-parallel peers)."""
        self.s = settings
        self.peers = {r: list(p) for r, p in peers.items() if p}
        self.ratios: dict[int, deque[float]] = {r: deque(maxlen=settings.window) for r in self.peers}
        self.excess: dict[int, deque[float]] = {r: deque(maxlen=settings.window) for r in self.peers}
        self.suspected: set[int] = set()
        self.evictions: deque[float] = deque()
        self.peak: dict[int, float] = {}
        """Each rank's largest windowed median ratio so far: how close a healthy run came to the factor."""

    def reset(self) -> None:
        """Who holds the slots changed (a switch, a recovery, a restart): every window starts over."""
        for d in (*self.ratios.values(), *self.excess.values()):
            d.clear()
        self.suspected.clear()

    def observe(self, busy: dict[int, float | None]) -> list[Slow]:
        """One committed step's busy time per rank: the ranks newly found slow."""
        found = []
        for r, others in self.peers.items():
            mine = busy.get(r)
            theirs = [b for b in (busy.get(p) for p in others) if b is not None]
            if mine is None or not theirs:
                continue
            peer = statistics.median(theirs)
            self.ratios[r].append(mine / peer if peer > 0 else (1.0 if mine <= 0 else float("inf")))
            self.excess[r].append(mine - peer)
            slow = self._judge(r)
            if slow is not None and r not in self.suspected:
                self.suspected.add(r)
                found.append(slow)
        return found

    def _judge(self, r: int) -> Slow | None:
        if len(self.ratios[r]) < self.s.window:
            return None
        ratio, excess = statistics.median_low(self.ratios[r]), statistics.median_low(self.excess[r])
        self.peak[r] = max(self.peak.get(r, 0.0), ratio)
        if ratio >= self.s.factor and excess >= self.s.min_excess_s:
            return Slow(r, round(ratio, 3), round(excess, 4))
        return None

    def allow_eviction(self, now: float) -> bool:
        """Spend one eviction of the hourly budget, or say it is spent."""
        while self.evictions and now - self.evictions[0] >= 3600.0:
            self.evictions.popleft()
        if len(self.evictions) >= self.s.budget_per_hour:
            return False
        self.evictions.append(now)
        return True


def dp_peers(world: int, shard_of: Callable[[int], Hashable]) -> dict[int, list[int]]:
    """Each rank's peers: the other ranks of its shard (same stage and tensor slice)."""
    by_shard: dict[Hashable, list[int]] = {}
    for r in range(world):
        by_shard.setdefault(shard_of(r), []).append(r)
    return {r: [p for p in by_shard[shard_of(r)] if p != r] for r in range(world)}


class GrayEvictions:
    """The controller's use of a :class:`GrayWatch` (on its thread): every commit's busy times go in;
    a rank found slow has every rank of its node noticed for maintenance (planned switches to warm
    standbys; by rank, never as a node notice, which on the batch host would requeue the job) when
    a standby is idle, no plan is in flight and the hourly budget allows; otherwise it is journalled
    (``gray_suspect``, once per rank and reason) and judged again at the next step."""

    def __init__(self, ctx: Context, members: Membership, g: GrayConfig) -> None:
        """``g``: the run's gray section, the only settings read here."""
        self.ctx = ctx
        self.members = members
        self.watch = GrayWatch(
            GraySettings(
                factor=g.factor, window=g.window, min_excess_s=g.min_excess_s, budget_per_hour=g.budget_per_hour
            ),
            dp_peers(ctx.layout.world, ctx.layout.shard),
        )
        self.epoch = -1
        self.said: dict[int, str] = {}
        """The last reason journalled for a suspect that was not evicted, per rank."""
        self.evicted: list[dict[str, object]] = []
        """Every eviction: rank, node, step, ratio."""

    def on_commit(self, busy: dict[int, float | None]) -> None:
        st = self.ctx.state
        if st.epoch != self.epoch:
            self.watch.reset()
            self.epoch = st.epoch
            self.said.clear()
        for slow in self.watch.observe(busy):
            self._act(slow)

    def _act(self, slow: Slow) -> None:
        agent = self.ctx.state.agent_of(slow.rank)
        node = agent.node if agent is not None else None
        reason = (
            f"gray: rank {slow.rank} busy {slow.ratio:.2f}x its peers' (+{slow.excess_s:.3f} s a step) "
            f"over {self.watch.s.window} steps"
        )
        why = self.move_off(
            node,
            reason,
            {"cause": "compute", "rank": slow.rank, "ratio": slow.ratio, "excess_s": slow.excess_s},
            fallback_rank=slow.rank,
        )
        if why is not None:
            self._keep(slow, node, why)

    def move_off(
        self, node: str | None, reason: str, record: dict[str, object], fallback_rank: int | None = None
    ) -> str | None:
        """Notice every rank of ``node`` (or ``fallback_rank`` when the node is unknown) for
        maintenance: None once done (journal ``gray_evict`` with ``record``), else why nothing moved
        (a switch or recovery in flight, no idle standby, the hourly budget spent)."""
        st = self.ctx.state
        if st.plan is not None or st.mode is not Mode.RUNNING or st.pending_notices:
            return "a switch or recovery is in flight"
        if not self.members.any_idle_standby():
            return "no idle standby"
        if not self.watch.allow_eviction(time.time()):
            return f"the budget of gray.budget_per_hour={self.watch.s.budget_per_hour} is spent"
        self.evicted.append({**record, "node": node, "step": st.step})
        self.ctx.journal.write("gray_evict", **record, node=node, step=st.step)
        log.warning("%s: moving node %s off", reason, node)
        if node:
            self.ctx.hooks.node_lost(node)  # remembered as bad: no restarted rank or new spare lands there
        # one notice per rank of the node, by rank: a node notice for the batch host would checkpoint
        # and requeue the whole job, and a slow node is not worth that
        ranks = (self.members.ranks_of_node(node) if node else []) or ([] if fallback_rank is None else [fallback_rank])
        for rank in ranks:
            self.ctx.submit(
                NoticeIn(Notice(kind="maintenance", rank=rank, source="controller", reason=reason, time=time.time()))
            )
        return None

    def report(self) -> dict[str, object]:
        """For the summary: the settings, the evictions and each rank's largest windowed ratio."""
        s = self.watch.s
        return {
            "factor": s.factor,
            "window": s.window,
            "min_excess_s": s.min_excess_s,
            "evictions": self.evicted,
            "peak_ratio": {r: round(v, 3) for r, v in sorted(self.watch.peak.items())},
        }

    def _keep(self, slow: Slow, node: str | None, why: str) -> None:
        self.watch.suspected.discard(slow.rank)  # judged again at the next step
        if self.said.get(slow.rank) != why:
            self.said[slow.rank] = why
            self.ctx.journal.write(
                "gray_suspect",
                rank=slow.rank,
                node=node,
                ratio=slow.ratio,
                excess_s=slow.excess_s,
                kept=why,
                step=self.ctx.state.step,
            )
            log.warning(
                "gray: rank %d is %.2fx slower than its peers; kept on %s: %s", slow.rank, slow.ratio, node, why
            )
