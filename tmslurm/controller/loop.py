"""The controller: one per run, one thread, one queue; its collaborators built in dependency order.

Contract:
- Everything that can change the run arrives as a queue item (:mod:`tmslurm.controller.items`: a
  new agent, an agent's message, a disconnect, a request, a notice) and is handled on one thread,
  so every step is decided exactly once without locks: whichever of "last vote" and "failure" is
  dequeued first wins. :class:`~tmslurm.controller.dispatch.Dispatch` sends each item to its handler
  by its type, an agent's message by the message's type; a handler that fails is journalled
  (``handler_error``) and the run goes on.
- The work is done by collaborators built here, in dependency order, over one
  :class:`~tmslurm.controller.state.RunState`: membership, plan book, restarts, recoveries,
  switches, commits, intake, deadlines, node watch (node monitors), summary, dispatch. Cluster
  specifics come in as :class:`~tmslurm.controller.hooks.ClusterHooks`, which never wait on the cluster: their results
  come back as queue items (:class:`~tmslurm.controller.items.Released`,
  :class:`~tmslurm.controller.items.FaultAt`), so no Slurm command delays a vote.
- A restarted controller (``adopt``, from the supervisor) spawns nothing: it restores what was
  committed and re-adopts the live agents (:mod:`tmslurm.controller.adoption`).
- After each commit the snapshot and the new step log entries are handed to a writer thread
  (:mod:`tmslurm.controller.snapshot`).
- :meth:`Controller.run` spawns the ranks and standbys, loops until the run finished (checking
  deadlines between items, at most every ``TICK_S``: a check scans every agent, so checking after
  every item made a step cost O(ranks^2)) and returns the summary (``summary.json``).
"""

from __future__ import annotations

import gc
import logging
import queue
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tmslurm.controller.adoption import Adoption, AdoptOrder
from tmslurm.controller.commits import Commits
from tmslurm.controller.context import Context
from tmslurm.controller.deadlines import Deadlines
from tmslurm.controller.dispatch import Dispatch
from tmslurm.controller.events import EventLog
from tmslurm.controller.gray import GrayEvictions
from tmslurm.controller.hooks import ClusterHooks
from tmslurm.controller.intake import Intake
from tmslurm.controller.items import Item, NoticeIn, RequestIn
from tmslurm.controller.journal import Journal
from tmslurm.controller.linkwatch import LinkProbes
from tmslurm.controller.membership import Membership
from tmslurm.controller.monitors import NodeMonitors
from tmslurm.controller.plan_lifecycle import PlanBook
from tmslurm.controller.planned_switches import Switches
from tmslurm.controller.recoveries import Recoveries
from tmslurm.controller.renewal import SpareRenewal
from tmslurm.controller.restarts import Restarts
from tmslurm.controller.server import ControlServer
from tmslurm.controller.snapshot import Snapshots
from tmslurm.controller.spawner import Spawner
from tmslurm.controller.state import JobEnd, Mode, RunState
from tmslurm.controller.summary import Summary
from tmslurm.core.config import MetricsConfig, RunConfig, SecurityConfig, wants_monitors
from tmslurm.core.errors import TmslurmError
from tmslurm.core.notices import Notice
from tmslurm.core.rundir import RunDir
from tmslurm.core.signing import NoticeVerifier, load_public_key
from tmslurm.core.topology import Layout
from tmslurm.train.ckpt_index import latest_complete
from tmslurm.wire import messages as m

log = logging.getLogger(__name__)
TICK_S = 0.05
"""Deadlines are checked at most this often (and at least this often while the queue is quiet)."""


@dataclass
class Ticker:
    """Says when a periodic check is due: at the first call, then once per ``period_s``."""

    period_s: float
    next_t: float = float("-inf")

    def due(self, now: float) -> bool:
        if now < self.next_t:
            return False
        self.next_t = now + self.period_s
        return True


class Controller:
    def __init__(
        self,
        cfg: RunConfig,
        run_dir: Path,
        spawner: Spawner,
        hooks: ClusterHooks,
        address: dict[str, Any],
        adopt: AdoptOrder | None = None,
    ) -> None:
        layout = Layout.from_config(cfg)
        rundir = RunDir(Path(run_dir))
        self.metrics = _run_metrics(cfg.metrics, rundir, layout, hooks, adopt)
        """Prometheus metrics (metrics.port), None when off."""
        journal = Journal(rundir.events, listener=self.metrics.observe if self.metrics is not None else None)
        state = RunState(world=layout.world)
        if cfg.train.resume_from:
            state.step = state.resume_step = state.start_step = latest_complete(rundir.path, layout.shard_names) or 0
        self.ctx = Context(cfg, layout, rundir, journal, EventLog(journal), spawner, hooks, state, queue.Queue())
        self.state = state
        self.members = Membership(self.ctx, address)
        self.plans = PlanBook(self.ctx, self.members)
        self.restarts = Restarts(self.ctx, self.members, self.plans)
        self.recoveries = Recoveries(self.ctx, self.members, self.plans, self.restarts)
        self.switches = Switches(self.ctx, self.members, self.plans, self.restarts, self.recoveries)
        gray = GrayEvictions(self.ctx, self.members, cfg.gray) if cfg.gray.evict else None
        self.commits = Commits(self.ctx, self.members, gray)
        links = (
            LinkProbes(self.ctx, cfg.gray, gray.move_off, self.members.ranks_of_node)
            if gray is not None and cfg.gray.link_probe_s > 0 and wants_monitors(cfg)
            else None
        )
        self.summary = Summary(self.ctx, self.commits, links)
        self.intake = Intake(self.ctx, self.members, self.switches, self.recoveries, self.restarts, self.summary.status)
        self.deadlines = Deadlines(self.ctx, self.members, self.plans, self.recoveries, self.restarts, self.commits)
        self.monitors = NodeMonitors(self.ctx, self.members, self.recoveries, links)
        self.renewal = SpareRenewal(self.ctx, self.members)
        self.restarts.resume_after_requeue()
        self.adoption = (
            Adoption(self.ctx, self.members, self.commits, self.recoveries, self.switches, adopt) if adopt else None
        )
        if self.adoption is not None:
            self.adoption.restore()
        self.dispatch = Dispatch(
            self.ctx,
            self.members,
            self.commits,
            self.switches,
            self.recoveries,
            self.restarts,
            self.intake,
            self.monitors,
            self.adoption,
        )
        """The two dispatch tables (queue item class, agent message class -> handler) and their handlers."""
        self.logged = len(state.step_log)
        """Step log entries already handed to the snapshot writer (``steps.jsonl``)."""
        self.snapshots = Snapshots(rundir.snapshot, rundir.steps)
        self.metrics_warm_m = float("-inf")
        """When the metrics' warm-standby counts were last taken (monotonic)."""
        self.job_end: tuple[JobEnd, str] | None = None
        """Set by a signal handler (:meth:`job_ending`), taken by the loop: the job is about to end."""

    # ---- intake from other threads -------------------------------------------------------------
    def submit_notice(self, notice: Notice) -> None:
        """Queue a notice from any thread (the Slurm watcher)."""
        self.ctx.submit(NoticeIn(notice))

    def checkpoint_and_requeue(self, node: str, reason: str) -> None:
        self.restarts.checkpoint_and_requeue(node, reason)

    def job_ending(self, end: JobEnd, reason: str) -> None:
        """Called from a signal handler (the main thread, between two bytecodes of the loop): only
        one assignment, no lock (a queue put here could wait on a lock the interrupted loop holds).
        The loop acts on it within ``TICK_S``."""
        self.job_end = (end, reason)

    def take_job_end(self) -> None:
        """On the loop's thread: act on a job end a signal announced (checkpoint, then its action)."""
        if self.job_end is not None:
            (end, reason), self.job_end = self.job_end, None
            self.restarts.checkpoint_and_end(end, reason)

    # ---- the loop -----------------------------------------------------------------------------
    def run(self, server: ControlServer, token: str) -> dict[str, Any]:
        # What exists now (torch, imported for the TCPStore, is most of it) lives as long as the
        # process: out of the cyclic collector's reach, so that its full collections do not walk
        # it. They did, for 110-140 ms each, collecting nothing: the p99 commit at 4,096 ranks.
        gc.freeze()
        server.serve(
            token, _verifier(self.ctx.cfg.security, self.ctx.rundir.name), self.ctx.journal, self.ctx.submit, self.touch
        )
        if self.metrics is not None:
            m = self.ctx.cfg.metrics
            bound = self.metrics.serve(m.addr, m.port)
            self.ctx.journal.write("metrics" if bound else "metrics_unavailable", addr=m.addr, port=m.port)
        if self.adoption is None:  # a restarted controller adopts the live processes instead
            for rank in range(self.ctx.layout.world):
                self.members.spawn_worker(rank, 0)
            for _ in range(self.members.standby_target):
                self.members.spawn_standby()
            self.state.mode = Mode.RUNNING
        ticker = Ticker(TICK_S)
        while self.state.mode is not Mode.FINISHED:
            try:
                self.handle(self.ctx.queue.get(timeout=TICK_S))
            except queue.Empty:
                pass
            if self.state.step != self.snapshots.last_step:  # right after the commit: cheap, written off the loop
                self._offer_snapshot()
            self.take_job_end()
            if ticker.due(time.monotonic()):
                if self.adoption is not None:
                    self.adoption.tick()
                self.deadlines.tick()
                self.monitors.tick()
                self.renewal.tick()
        return self.finish(server)

    def _offer_snapshot(self) -> None:
        st = self.state
        entries, self.logged = st.step_log[self.logged :], len(st.step_log)
        if self.metrics is not None:
            warm: dict[str, int] = {}
            if time.monotonic() - self.metrics_warm_m >= 1.0:  # walking every agent each commit: at most 1/s
                self.metrics_warm_m = time.monotonic()
                pool = self.members.warm_pool()
                warm = {role: sum(role in roles for roles in pool.values()) for role in self.ctx.layout.roles}
            self.metrics.on_commits(entries, warm)
        self.snapshots.offer(
            st.step,
            {
                "epoch": st.epoch,
                "epochs": st.epochs,
                "t": time.time(),
                "last_commit_t": self.ctx.events.last_commit_t,
                "fired": sorted(st.fired),
                "standbys_started": st.standbys_started,
                "incarnation": st.incarnation,
            },
            entries,
        )

    def touch(self, conn: int) -> None:
        """A line arrived on ``conn`` (called from the gate's reader thread: only stamps a time)."""
        if self.monitors.owns(conn):
            self.monitors.touch(conn)
        else:
            self.members.touch(conn)

    def handle(self, item: Item) -> None:
        """Handle one queue item (:meth:`Dispatch.handle`: a failing handler is journalled, never raised)."""
        self.dispatch.handle(item)

    # ---- the end ------------------------------------------------------------------------------
    def finish(self, server: ControlServer) -> dict[str, Any]:
        self._refuse_requests(server)
        self.snapshots.close()
        if self.state.requeued:
            self.ctx.hooks.flush(60.0)  # the requeue command runs off the loop: send it before exiting
            self.ctx.spawner.stop_all()
            server.close()
            return {"requeued": True, "final_params_sha256": None}
        for agent in self.state.agents.values():
            if agent.alive:
                agent.channel.try_send(m.Finish())
        self.monitors.finish()
        self.plans.end_of_run()  # a switch the run ended before: no event, no downtime; its notice stays pending
        summary = self.summary.write()
        self.ctx.spawner.stop_all(grace_s=5.0)  # agents exit on "finish"; what is left after 5 s is killed
        server.close()
        return summary

    def _refuse_requests(self, server: ControlServer) -> None:
        """Answer every queued and later request with an error: the loop reads no more of them."""
        why = (
            "the run is ending (requeued: it resumes in the next allocation)"
            if self.state.requeued
            else "the run has finished; it takes no more requests"
        )
        server.close_requests(why)
        while True:
            try:
                item = self.ctx.queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, RequestIn):  # the gate never puts a request inside a batch
                item.ch.try_send(m.ErrorReply(error=why))
                item.ch.close()


def _verifier(sec: SecurityConfig, run_name: str) -> NoticeVerifier | None:
    """The gate's signature check of admin notices, from the security section alone; None: token only."""
    if not sec.admin_public_key_file:
        return None
    try:
        return NoticeVerifier(load_public_key(Path(sec.admin_public_key_file)), run_name, sec.notice_max_age_s)
    except TmslurmError as exc:
        log.error("%s (signed admin notices will be refused)", exc)
        return None


def _run_metrics(
    m: MetricsConfig, rundir: RunDir, layout: Layout, hooks: ClusterHooks, adopt: AdoptOrder | None
) -> Any:
    """The run's Prometheus metrics when ``metrics.port`` is set (prometheus_client is imported
    only then)."""
    if not m.port:
        return None
    from tmslurm.controller.metrics import RunMetrics

    job = hooks.status().get("main_job_id") or "local"
    return RunMetrics(rundir.name, str(job), rundir.path, layout.shard_names, adopt.incarnation if adopt else 0)
