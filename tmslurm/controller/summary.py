"""What a run reports: ``tmslurm status`` while it runs and ``summary.json`` at the end.

Contract: :meth:`Summary.status` is a JSON-ready view of the run (ranks with their node, shape class
and liveness; standbys with the shape classes they are warm for, out of ``shape_classes``; step,
events, job ids).
:meth:`Summary.write` builds ``summary.json``: the final hashes from every rank's ``done`` report
(:func:`~tmslurm.controller.final_hashes.final_hashes`: ``final_params_sha256``, ``final_state_sha256``,
``replicas_equal``, ``diverging``; a divergence is journalled and logged as an error and gives
no hash), losses, the step log, the events with their downtime, ``stopped`` (the checkpoint step of a
run ended by ``tmslurm stop``, else None), and ``jobs``: the run's chain of
Slurm jobs (:func:`job_chain`; ``tmslurm status`` shows the current ``incarnation``). It raises
only when the run directory cannot be written.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from tmslurm.controller.commits import Commits
from tmslurm.controller.context import Context
from tmslurm.controller.events import describe
from tmslurm.controller.final_hashes import final_hashes, fold_slices
from tmslurm.controller.linkwatch import LinkProbes
from tmslurm.core.jsonfile import write_json_atomic

log = logging.getLogger(__name__)


JOB_BOUNDARIES = (
    "job_end_requeue",
    "job_end_resubmit",
    "job_end_sigterm",
    "job_end_unfinished",
    "batch_host_requeue",
    "controller_lost_requeue",
    "requeue_restart",
)
"""Event kinds that end one Slurm job of the run and start the next (a requeue or a resubmission)."""


def job_chain(events: list[dict[str, Any]], job_id: str | None) -> list[dict[str, Any]]:
    """The run's Slurm jobs, one entry per incarnation: its job id, what ended it and the steps the
    next one redid (``lost_steps``; 0 for a time limit: the checkpoint is taken at the boundary)."""
    chain = [
        {
            "incarnation": i,
            "job_id": ev.get("from_job_id"),
            "ended_by": ev["kind"],
            "cause": ev["cause"],
            "ended_at_step": ev["target_step"],
            "lost_steps": ev["lost_steps"],
        }
        for i, ev in enumerate(e for e in events if e["kind"] in JOB_BOUNDARIES)
    ]
    return [*chain, {"incarnation": len(chain), "job_id": job_id, "ended_by": None}]


class Summary:
    def __init__(self, ctx: Context, commits: Commits, links: LinkProbes | None = None) -> None:
        self.ctx = ctx
        self.state = ctx.state
        self.commits = commits
        self.links = links

    def status(self) -> dict[str, Any]:
        st, layout = self.state, self.ctx.layout
        ranks = []
        for r in range(layout.world):
            agent = st.agent_of(r)
            ranks.append(
                {
                    "rank": r,
                    "node": agent.node if agent else None,
                    "role": layout.role(r),
                    "shape_class": layout.shape_class(r).name,
                    "agent": agent.aid if agent else None,
                    "alive": bool(agent and agent.alive),
                }
            )
        standbys = [
            {
                "id": a.aid,
                "node": a.node,
                "roles": sorted(a.roles),
                "busy": a.busy,
                "rss_mb": {k: v.get("rss_mb") for k, v in a.roles.items()},
            }
            for a in st.agents.values()
            if a.idle_standby
        ]
        last = st.step_log[-1] if st.step_log else {}
        cluster = self.ctx.hooks.status()
        return {
            "run_dir": str(self.ctx.rundir.path),
            "mode": st.mode.value,
            "epoch": st.epoch,
            "step": st.step,
            "steps": self.ctx.cfg.train.steps,
            "step_time_s": last.get("dt"),
            "loss": last.get("loss"),
            "shape_classes": list(layout.roles),
            "ranks": ranks,
            "standbys": standbys,
            "events": self.ctx.events.items,
            **cluster,
            "incarnation": len(job_chain(self.ctx.events.items, cluster.get("main_job_id"))) - 1,
        }

    def memory(self) -> dict[str, float | None]:
        """The largest standby's resident set once warm and its peak while warming, against the largest
        rank's peak as a rank (MiB; a standby that joined reset its peak when it joined)."""
        agents = [a for a in self.state.agents.values() if a.roles]
        warm = [max(r["rss_mb"] for r in a.roles.values()) for a in agents]
        peaks = [p for a in agents for r in a.roles.values() if isinstance(p := r.get("peak_rss_mb"), (int, float))]
        return {
            "standby_rss_mb": max(warm, default=None),
            "standby_peak_rss_mb": max(peaks, default=None),
            "largest_rank_peak_rss_mb": self.commits.largest_rank_rss(),
        }

    def write(self) -> dict[str, Any]:
        st, layout = self.state, self.ctx.layout
        reports = {r: (m.shard_index, m.digest, m.state_digest) for r, m in st.done.items()}
        if layout.zero:
            reports = fold_slices(
                {r: (m.shard_index, m.digest, m.state_digest, m.slice, m.ward_digest) for r, m in st.done.items()},
                layout.buddy,
            )
        hashes = final_hashes(reports, layout.shards)
        if hashes["diverging"]:
            log.error("data-parallel replicas DIVERGED at the end: %s (no final hash)", hashes["diverging"])
            self.ctx.journal.write("replicas_diverged", diverging=hashes["diverging"])
        median = self.commits.median_step()
        losses = [e["loss"] for e in st.step_log if e.get("loss") is not None]
        summary_events, cluster = self.ctx.events.finalize(median), self.ctx.hooks.status()
        summary = {
            "run_id": self.ctx.rundir.name,
            "layout": {"dp": layout.dp, "pp": layout.pp, "tp": layout.tp, "zero": layout.zero},
            "steps": st.step,
            "resumed_from_step": st.start_step,
            **hashes,
            "replica_mismatch_steps": st.replica_mismatch,
            "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None,
            "median_step_s": median,
            "state_bytes": {r: m.state_bytes for r, m in sorted(st.done.items())},
            "optimizer_bytes": {r: m.optimizer_bytes for r, m in sorted(st.done.items())},
            "buddy_cost": {r: m.buddy.model_dump() for r, m in sorted(st.done.items()) if m.buddy is not None},
            "step_log": st.step_log,
            "events": summary_events,
            "standbys": [{"id": a.aid, "node": a.node, "roles": a.roles} for a in st.standbys()],
            "memory": self.memory(),
            "pending_notices": [dataclasses.asdict(n) for n in st.pending_notices],
            "gray": self.commits.gray.report() if self.commits.gray is not None else None,
            "links": self.links.report() if self.links is not None else None,
            "restart_mode": self.ctx.cfg.bench.restart_mode,
            "failed": st.failed_reason,
            "stopped": None if st.stopped_at is None else {"checkpoint_step": st.stopped_at},
            **cluster,
            "jobs": job_chain(summary_events, cluster.get("main_job_id")),
        }
        write_json_atomic(self.ctx.rundir.summary, summary, indent=1)  # pollers wait for it to exist
        for rec in summary["events"]:
            log.info("event: %s", describe(rec))
        return summary
