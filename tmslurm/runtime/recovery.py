"""The controller's failure side: detection, abort, recovery through standbys, checkpoint restart.

Contract (methods mixed into :class:`~tmslurm.runtime.controller.Controller`, run on its one thread):
- :meth:`fail` handles dead or hung ranks: fence them (SIGKILL, so a stopped process can never wake
  up into the run), open a new epoch (older votes and reports are ignored), abort the uncommitted step
  on every alive rank, collect each rank's per-group op counts, then rebuild only the affected and
  dirty groups, switch in warm standbys, and have each joiner pull its state from a data-parallel peer.
  A failure during a recovery merges into it and replans under a new epoch.
- When no switch is possible it falls back to :meth:`~tmslurm.runtime.restart.RestartMixin.restart`.
- :meth:`_tick` enforces deadlines: missed heartbeats, ranks silent during an abort, a comm error
  nobody explains, and a phase 1 that does not finish.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from tmslurm.runtime import switch as sw
from tmslurm.runtime.events import describe
from tmslurm.runtime.final import final_hashes

log = logging.getLogger(__name__)


class RecoveryMixin:
    # ---- failures -----------------------------------------------------------------------------
    def fail(self, dead: set[int], cause: str, detect_t: float, failure_t: float | None = None) -> None:
        if self.mode in ("draining", "finished"):
            return
        self.comm_error_since = None
        if self.cfg.runtime.restart_mode != "tmslurm":
            self.restart(cause, sorted(dead), "unexpected", detect_t, failure_t)
            return
        for r in dead:
            self._fence_rank(r, cause)
        dead = set(dead) | self._absorb_plan()
        epoch = self._new_epoch()
        self.epoch = epoch
        self.mode = "recovering"
        self.votes = {}
        alive = [r for r in range(self.world) if r not in dead and self._rank_alive(r)]
        dead |= {r for r in range(self.world) if r not in alive}
        plan = sw.Plan("unexpected", epoch, [sw.Move(r, "") for r in sorted(dead)], [])
        plan.times.update(failure=failure_t or detect_t, detect=detect_t)
        plan.info.update(dead=dead, statuses={}, alive=alive, reason=cause, target_step=self.step)
        plan.waiting = {f"r{r}" for r in alive}
        plan.times["deadline"] = time.time() + 2 * self.cfg.runtime.heartbeat_timeout_s
        self.plan = plan
        self.events.begin(plan, self.agents, self.slots)
        self.journal.write("abort", epoch=epoch, step=self.step, dead=sorted(dead), cause=cause)
        log.warning("failure (%s) of ranks %s: aborting step %d, epoch %d", cause, sorted(dead), self.step, epoch)
        self.broadcast({"type": "abort", "epoch": epoch, "step": self.step})
        if not plan.waiting:
            self._plan_recovery()

    def _absorb_plan(self) -> set[int]:
        """Cancel the switch in progress; return ranks whose replacement had not completed."""
        plan = self.plan
        if plan is None:
            return set()
        if plan.kind == "planned" and not plan.applied:
            self._cancel_plan(requeue=True)
            return set()
        pending = {m.rank for m in plan.moves if self.slots.get(m.rank) not in self.agents
                   or not self.agents[self.slots[m.rank]].alive or self.agents[self.slots[m.rank]].kind == "worker" and plan.kind == "planned"}
        if plan.kind == "unexpected":
            pending |= {r for r in plan.info.get("dead", set()) if not self._rank_alive(r)}
        self._cancel_plan(requeue=False)
        return pending

    def _rank_alive(self, rank: int) -> bool:
        agent = self.agents.get(self.slots.get(rank, ""))
        return agent is not None and agent.alive and not agent.expected_exit

    def _fence_rank(self, rank: int, cause: str) -> None:
        agent = self.agents.get(self.slots.get(rank, ""))
        if agent is not None and agent.alive:
            self._kill_agent(agent)
            self.journal.write("fenced", agent=agent.aid, rank=rank, node=agent.node, cause=cause)

    def _kill_agent(self, agent: Any) -> None:
        agent.alive = False
        self.spawner.fence(agent.kind, agent.ident)  # its own handle: never a pid a client reported
        agent.channel.close()

    def _on_aborted(self, agent: Any, msg: dict[str, Any]) -> None:
        plan = self.plan
        if plan is None or plan.kind != "unexpected" or msg.get("epoch") != plan.epoch or plan.applied:
            return
        plan.info["statuses"][msg["rank"]] = msg.get("status", {})
        plan.waiting.discard(f"r{msg['rank']}")
        if not plan.waiting:
            self._plan_recovery()

    def _plan_recovery(self) -> None:
        plan = self.plan
        dead = sorted(plan.info["dead"])
        try:
            moves = sw.pick_joiners(self.layout, dead, self.warm_pool(), self.standby_nodes())
            for m in moves:
                m.source = sw.dp_source(self.layout, m.rank, set(dead))
        except sw.PlanError as exc:
            log.warning("no switch possible (%s): falling back to a checkpoint restart", exc)
            rec = plan.info.get("event")
            if rec is not None:
                rec["status"] = "cancelled"
            self.plan = None
            self.restart(f"{plan.info['reason']}; {exc}", dead, "unexpected", plan.times["detect"], plan.times["failure"])
            return
        dirty = sw.dirty_groups(self.layout, plan.info["statuses"])
        plan.moves = moves
        plan.groups = sw.multi(self.layout, set(self.layout.affected_groups(dead)) | dirty)
        plan.applied = True
        plan.times["pick"] = time.time()
        plan.info["dirty"] = sorted(dirty)
        for m in moves:
            self.agents[m.joiner].busy = True
        msgs = sw.recovery_messages(self.layout, plan, plan.info["alive"])
        plan.waiting = {k if isinstance(k, str) else f"r{k}" for k in msgs}
        self.journal.write("recover", epoch=plan.epoch, moves=[m.__dict__ for m in moves], groups=plan.groups, dirty=sorted(dirty))
        for key, msg in msgs.items():
            self.send_to(key, msg)

    def _on_recovered(self, agent: Any, msg: dict[str, Any]) -> None:
        plan = self.plan
        if plan is None or msg.get("epoch") != plan.epoch:
            return
        plan.waiting.discard(f"r{msg['rank']}")
        plan.parts["phase1_s"] = max(plan.parts.get("phase1_s", 0.0), float(msg.get("build_s") or 0.0))
        if msg.get("transfer_s") is not None:
            plan.parts["transfer_s"] = max(plan.parts.get("transfer_s", 0.0), float(msg["transfer_s"]))
        self._maybe_finish_plan()

    def _on_comm_error(self, agent: Any, msg: dict[str, Any]) -> None:
        self.journal.write("comm_error", rank=msg.get("rank"), step=msg.get("step"), error=str(msg.get("error"))[:300])
        plan = self.plan
        if plan is not None and plan.kind == "unexpected" and plan.applied and msg.get("epoch") == plan.epoch:
            self.fail(set(), f"rebuild failed on rank {msg.get('rank')}", time.time())
        elif self.mode == "running" and self.comm_error_since is None:
            self.comm_error_since = time.time()

    def _on_fault(self, agent: Any, msg: dict[str, Any]) -> None:
        self.fired.add(int(msg["index"]))
        self.fault_t[int(msg["rank"])] = time.time()
        self.journal.write("fault", **{k: v for k, v in msg.items() if k != "type"})

    def _failure_time(self, rank: int) -> float | None:
        return self.fault_t.pop(rank, None)

    def _disconnect(self, aid: str) -> None:
        agent = self.agents.get(aid)
        if agent is None or not agent.alive:
            return
        agent.alive = False
        if agent.expected_exit or self.mode in ("draining", "finished"):
            return
        now = time.time()
        if agent.rank is not None and self.slots.get(agent.rank) == aid:
            self.fail({agent.rank}, "process exit", now, self._failure_time(agent.rank))
        else:
            self._lost_standby(agent, "process exit")

    def _lost_standby(self, agent: Any, cause: str) -> None:
        self.journal.write("standby_lost", agent=agent.aid, node=agent.node, cause=cause)
        log.warning("standby %s lost (%s)", agent.aid, cause)
        plan = self.plan
        if plan is not None and any(m.joiner == agent.aid for m in plan.moves):
            if plan.kind == "planned" and not plan.applied:
                self._cancel_plan(requeue=True)
            else:
                self.fail(set(), f"joiner {agent.aid} lost", time.time())
        self._maybe_replenish()

    # ---- standbys -----------------------------------------------------------------------------
    def _spawn_standby(self) -> None:
        self.expected.add(("standby", self.standbys_started))
        self.spawner.spawn_standby(self.standbys_started)
        self.standbys_started += 1

    def _maybe_replenish(self) -> None:
        if not self.replenish or self.mode in ("draining", "finished"):
            return
        pool = [a for a in self.agents.values() if a.kind == "standby" and a.alive and a.rank is None]
        starting = self.standbys_started - sum(1 for a in self.agents.values() if a.kind == "standby")
        for _ in range(self.standby_target - len(pool) - max(0, starting)):
            self._spawn_standby()

    def _on_ready(self, agent: Any, msg: dict[str, Any]) -> None:
        agent.roles[msg["role"]] = {k: v for k, v in msg.items() if k != "type"}
        self.journal.write("standby_ready", agent=agent.aid, node=agent.node, **agent.roles[msg["role"]])
        self.release_held_commit()
        if self.pending_notices and self.plan is None and self.mode == "running":
            self._notice(self.pending_notices.pop(0))

    # ---- deadlines ----------------------------------------------------------------------------
    def _tick(self) -> None:
        now_m, now = time.monotonic(), time.time()
        for agent in list(self.agents.values()):
            if self.cfg.runtime.heartbeats and agent.alive and not agent.expected_exit and now_m - agent.last_seen > self.cfg.runtime.heartbeat_timeout_s:
                log.warning("%s missed heartbeats for %.1fs: fencing it", agent.aid, now_m - agent.last_seen)
                self.journal.write("hung", agent=agent.aid, node=agent.node, silent_s=now_m - agent.last_seen)
                self._kill_agent(agent)
                if agent.rank is not None and self.slots.get(agent.rank) == agent.aid:
                    self.fail({agent.rank}, "heartbeat timeout", now, self._failure_time(agent.rank))
                else:
                    self._lost_standby(agent, "heartbeat timeout")
        plan = self.plan
        if plan is not None and plan.kind == "unexpected" and not plan.applied and now > plan.times["deadline"]:
            silent = {int(w[1:]) for w in plan.waiting if w.startswith("r")}
            self.fail(silent, "silent during abort", now)
        elif plan is not None and plan.kind == "planned" and not plan.ready and now - plan.times["pick"] > self.cfg.runtime.connect_timeout_s:
            log.warning("phase 1 of epoch %d did not finish; cancelling", plan.epoch)
            self._cancel_plan(requeue=True)
        if self.comm_error_since is not None and self.mode == "running" and now - self.comm_error_since > self.cfg.runtime.heartbeat_timeout_s:
            self.fail(set(), "unexplained communication error", now)
        if self.mode == "draining" and self._drained():
            self.mode = "finished"
        self._tick_batch_host()
        if getattr(self, "hold_since", None) is not None and not self.step_log:
            self.release_held_commit()

    def _drained(self) -> bool:
        """Every rank reported its final digest, or the ones still missing died after the final
        commit and a data-parallel replica reported their stage (replicas are identical)."""
        if len(self.done) >= self.world:
            return True
        missing = [r for r in range(self.world) if r not in self.done]
        shards = {int(m.get("shard", m["stage"])) for m in self.done.values()}
        return all(not self._rank_alive(r) for r in missing) and shards >= set(range(self.layout.shards))

    def _on_done(self, agent: Any, msg: dict[str, Any]) -> None:
        self.done[int(msg["rank"])] = msg
        if len(self.done) >= self.world:
            self.mode = "finished"

    # ---- the end ------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        ranks = []
        for r in range(self.world):
            agent = self.agents.get(self.slots.get(r, ""))
            ranks.append({"rank": r, "node": agent.node if agent else None, "role": self.layout.role(r),
                          "agent": agent.aid if agent else None, "alive": bool(agent and agent.alive)})
        standbys = [{"id": a.aid, "node": a.node, "roles": sorted(a.roles), "busy": a.busy,
                     "rss_mb": {k: v.get("rss_mb") for k, v in a.roles.items()}}
                    for a in self.agents.values() if a.kind == "standby" and a.alive and a.rank is None]
        last = self.step_log[-1] if self.step_log else {}
        return {"run_dir": str(self.run_dir), "mode": self.mode, "epoch": self.epoch, "step": self.step,
                "steps": self.cfg.train.steps, "step_time_s": last.get("dt"), "loss": last.get("loss"),
                "ranks": ranks, "standbys": standbys, "events": self.events.items,
                "main_job_id": getattr(self, "main_job_id", None), "spare_job_ids": getattr(self, "spare_job_ids", [])}

    def finish(self) -> dict[str, Any]:
        if self.requeued:
            self.stop_event.set()
            self.spawner.stop_all()
            self.server.close()
            return {"requeued": True, "final_params_sha256": None}
        for agent in self.agents.values():
            if agent.alive:
                agent.channel.try_send({"type": "finish"})
        hashes = final_hashes({r: (m.get("shard", m["stage"]), m["digest"], m["state_digest"]) for r, m in self.done.items()},
                              self.layout.shards)
        if hashes["diverging"]:
            log.error("data-parallel replicas DIVERGED at the end: %s (no final hash)", hashes["diverging"])
            self.journal.write("replicas_diverged", diverging=hashes["diverging"])
        median = self.median_step()
        losses = [e["loss"] for e in self.step_log if e.get("loss") is not None]
        summary = {
            "run_id": self.run_dir.name, "layout": {"dp": self.layout.dp, "pp": self.layout.pp, "tp": self.layout.tp},
            "steps": self.step, **hashes,
            "replica_mismatch_steps": self.replica_mismatch,
            "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
            "median_step_s": median, "step_log": self.step_log, "events": self.events.finalize(median),
            "standbys": [{"id": a.aid, "node": a.node, "roles": a.roles} for a in self.agents.values() if a.kind == "standby"],
            "restart_mode": self.cfg.runtime.restart_mode, "failed": getattr(self, "failed_reason", None),
            "main_job_id": getattr(self, "main_job_id", None), "spare_job_ids": getattr(self, "spare_job_ids", []),
        }
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        for rec in summary["events"]:
            log.info("event: %s", describe(rec))
        time.sleep(0.3)
        self.stop_event.set()
        self.spawner.stop_all()
        self.server.close()
        return summary
