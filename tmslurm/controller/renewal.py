"""Spare allocations renewed before their time limit, with no moment without a warm standby.

Contract: :meth:`SpareRenewal.tick` (at most once a second, from the loop while the run runs) asks
the cluster which standbys live in a spare allocation whose time limit is within
``slurm.spare_renew_s`` (:meth:`~tmslurm.controller.hooks.ClusterHooks.expiring_standbys`; each
allocation is named once). Those standbys are marked *retiring* (journal ``standby_renewing``):
they stay in the warm pool and may still take a rank, but no longer count toward
``standby.count``, so :meth:`~tmslurm.controller.membership.Membership.replenish` asks for a fresh
spare at once. A retiring standby is let go (journal ``standby_retired`` with the warm count that
stays) only once at least ``standby.count`` x ``ranks_per_node`` other standbys are idle and warm
for every shape class: the count of warm standbys never falls because of a renewal. Let go means
an expected exit: its spare job is cancelled through the spawner, and nothing is replaced again.

Failure behaviour: a retiring standby that takes a rank before it is let go stops retiring (its
allocation's end will then be an unexpected failure, recovered like any other, and is journalled
as ``standby_renewal_abandoned``); one that dies first is a lost standby (already replaced). The
cluster hook never raises (its contract).
"""

from __future__ import annotations

import logging
import time

from tmslurm.controller.context import Context
from tmslurm.controller.membership import Membership
from tmslurm.controller.state import Agent

log = logging.getLogger(__name__)
CHECK_S = 1.0
"""How often the cluster is asked which spares expire (the answer is local: no Slurm command)."""


class SpareRenewal:
    def __init__(self, ctx: Context, members: Membership) -> None:
        self.ctx = ctx
        self.members = members
        self.state = ctx.state
        self.checked_m = float("-inf")

    def tick(self, now: float | None = None, now_m: float | None = None) -> None:
        now = time.time() if now is None else now
        now_m = time.monotonic() if now_m is None else now_m
        if now_m - self.checked_m < CHECK_S or self.state.mode.ending:
            return
        self.checked_m = now_m
        self._mark(set(self.ctx.hooks.expiring_standbys(now)))
        self._retire()

    def _mark(self, idents: set[int]) -> None:
        if not idents:
            return
        for a in self.state.standbys():
            if a.ident in idents and a.idle_standby and a.aid not in self.state.retiring:
                self.state.retiring.add(a.aid)
                self.ctx.journal.write("standby_renewing", agent=a.aid, node=a.node)
                log.info(
                    "standby %s on %s: its spare allocation ends within slurm.spare_renew_s; asking for a fresh one",
                    a.aid,
                    a.node,
                )
        self.members.replenish()

    def _retire(self) -> None:
        """Let go every retiring standby at once when their replacements are warm: the standbys of one
        spare job (``ranks_per_node`` of them) end together when it is cancelled, so none of them may
        be left behind to be reported lost."""
        warm = self._fresh_warm() if self.state.retiring else 0
        for aid in sorted(self.state.retiring):
            agent = self.state.agents.get(aid)
            if agent is None or not agent.alive:
                self.state.retiring.discard(aid)
            elif not agent.idle_standby:
                self.state.retiring.discard(aid)
                self.ctx.journal.write("standby_renewal_abandoned", agent=aid, node=agent.node, rank=agent.rank)
            elif warm >= self.members.standby_target:
                self._let_go(agent, warm)

    def _fresh_warm(self) -> int:
        roles = set(self.ctx.layout.roles)
        return sum(
            1
            for a in self.state.standbys()
            if a.idle_standby and not a.busy and a.aid not in self.state.retiring and set(a.roles) >= roles
        )

    def _let_go(self, agent: Agent, warm: int) -> None:
        self.state.retiring.discard(agent.aid)
        agent.expected_exit = True
        self.ctx.journal.write("standby_retired", agent=agent.aid, node=agent.node, warm=warm)
        log.info("standby %s on %s retired: %d fresh warm standbys", agent.aid, agent.node, warm)
        self.members.kill(agent)
