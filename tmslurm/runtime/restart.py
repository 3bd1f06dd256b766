"""The controller's restart paths: in-job restart, requeue restart, and the batch-host requeue.

Contract (methods mixed into the controller, run on its one thread):
- :meth:`restart` — fallback when no switch is possible, and the *in-job restart* baseline
  (``runtime.restart_mode=injob_restart``, torchrun/elastic style): every rank is killed and started
  again (new processes: Python + torch import, groups from scratch, checkpoint load, warm-up), from
  the latest complete checkpoint or step 0; lost steps are redone, so the result stays exact.
- :meth:`requeue` — the *requeue restart* baseline (``runtime.restart_mode=requeue_restart`` on
  Slurm, submitit/Lightning style) and the batch-host path: the controller saves its step log and
  the open event to ``requeue.json``, then requeues its own Slurm job (optionally excluding nodes).
  The requeued job's controller (:meth:`resume_after_requeue`) picks the event up and completes it,
  so the downtime includes Slurm's rescheduling delay.
- :meth:`checkpoint_and_requeue` — used when the batch host must be drained: checkpoint at the next
  step boundary, then requeue excluding that node; the requeued job resumes exactly.
Restart parts: detect, stop, reschedule (requeue only), startup (process start to all ranks up,
including imports and checkpoint load), group_setup, ckpt_load, redo (all up to the first new step's
commit: warm-up plus redone steps), first_step.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable

from tmslurm.train.checkpoint import latest_complete

log = logging.getLogger(__name__)


class RestartMixin:
    requeue_hook: Callable[[list[str]], None] | None = None

    def restart(self, cause: str, ranks: list[int], kind: str, detect_t: float, failure_t: float | None = None) -> None:
        if self.cfg.runtime.restart_mode == "requeue_restart" and self.requeue_hook is not None:
            self.requeue(cause, ranks, kind, detect_t, failure_t, exclude=[])
            return
        t0 = time.time()
        target = self.step
        self._stop_all_ranks()
        self.epoch = self._new_epoch()
        k = latest_complete(self.run_dir, self.layout.shard_names) or 0
        mode = self.cfg.runtime.restart_mode
        rec = self._restart_record("restart" if mode == "tmslurm" else mode, kind, cause, ranks, detect_t, failure_t, target, k)
        rec["stop_s"] = time.time() - t0
        self.journal.write("restart", epoch=self.epoch, cause=cause, from_step=k, lost_steps=target - k)
        log.warning("restarting every rank from checkpoint step %d (%s)", k, cause)
        self._respawn_all(k)

    def _restart_record(self, kind: str, trigger: str, cause: str, ranks: list[int], detect_t: float,
                        failure_t: float | None, target: int, from_step: int) -> dict[str, Any]:
        rec = {"kind": kind, "trigger": trigger, "cause": cause, "epoch": self.epoch, "ranks": ranks, "node": "",
               "standby": "", "notice_t": failure_t or detect_t, "last_commit_t": self.events.last_commit_t,
               "detect_s": max(0.0, detect_t - (failure_t or detect_t)), "from_checkpoint_step": from_step,
               "lost_steps": target - from_step, "target_step": target, "status": "switched", "switched_t": time.time()}
        self.events.items.append(rec)
        return rec

    def _stop_all_ranks(self) -> None:
        if self.plan is not None:
            self._cancel_plan(requeue=False)
        for r in range(self.world):
            agent = self.agents.get(self.slots.get(r, ""))
            if agent is not None and agent.alive:
                agent.expected_exit = True
                self._kill_agent(agent)

    def _respawn_all(self, from_step: int) -> None:
        self.step = self.resume_step = from_step
        self.votes = {}
        self.incarnation += 1
        self.restart_t = time.time()
        self.started: dict[int, dict[str, Any]] = {}
        failed = [r for r in range(self.world) if self.spawn_worker(r, self.incarnation) is False]
        self.mode = "running"
        if failed:  # never hang: end the run with what it has, the checkpoint stays for a resume
            log.error("ranks %s cannot be restarted anywhere; ending the run (resume with train.resume_from)", failed)
            self.journal.write("run_failed", reason=f"no node to restart ranks {failed}")
            self.failed_reason = f"no node to restart ranks {failed}"
            self._stop_all_ranks()
            self.mode = "finished"

    def _on_started(self, agent: Any, msg: dict[str, Any]) -> None:
        rec = next((r for r in reversed(self.events.items) if r.get("from_checkpoint_step") is not None and r["status"] == "switched"), None)
        if rec is None or msg.get("step") != rec["from_checkpoint_step"]:
            return
        rec["group_setup_s"] = max(rec.get("group_setup_s", 0.0), float(msg.get("groups_s", 0.0)))
        rec["ckpt_load_s"] = max(rec.get("ckpt_load_s", 0.0), float(msg.get("ckpt_load_s", 0.0)))
        self.started[msg["rank"]] = msg
        if len(self.started) == self.world:
            rec["startup_s"] = time.time() - self.restart_t
            rec["all_started_t"] = time.time()

    # ---- requeue ------------------------------------------------------------------------------
    def requeue(self, cause: str, ranks: list[int], kind: str, detect_t: float, failure_t: float | None,
                exclude: list[str]) -> None:
        t0 = time.time()
        target = self.step
        self._stop_all_ranks()
        state = {"cause": cause, "ranks": ranks, "trigger": kind, "detect_t": detect_t, "failure_t": failure_t,
                 "target_step": target, "last_commit_t": self.events.last_commit_t, "step_log": self.step_log,
                 "events": self.events.items, "stop_s": time.time() - t0, "requeue_t": time.time(),
                 "exclude": exclude, "fired": sorted(self.fired), "kind": "requeue_restart" if self.cfg.runtime.restart_mode == "requeue_restart" else "batch_host_requeue"}
        (self.run_dir / "requeue.json").write_text(json.dumps(state, default=str))
        self.journal.write("requeue", cause=cause, target_step=target, exclude=exclude)
        log.warning("requeueing the job (%s); it resumes from the latest checkpoint", cause)
        self.requeued = True
        self.mode = "finished"
        self.requeue_hook(exclude)

    def resume_after_requeue(self) -> None:
        """Called at start-up: pick up the event a previous incarnation of the job left open."""
        path = self.run_dir / "requeue.json"
        if not path.is_file():
            return
        state = json.loads(path.read_text())
        path.rename(self.run_dir / f"requeue-{int(state['requeue_t'])}.json")
        self.step_log = state["step_log"]
        self.fired = set(state.get("fired", []))
        self.events.items = state["events"]
        self.events.last_commit_t = state["last_commit_t"]
        k = self.step
        rec = self._restart_record(state["kind"], state["trigger"], state["cause"], state["ranks"], state["detect_t"],
                                   state["failure_t"], state["target_step"], k)
        rec["stop_s"] = state["stop_s"]
        rec["reschedule_s"] = time.time() - state["requeue_t"]
        self.restart_t = time.time()
        self.started = {}
        self.journal.write("resumed_after_requeue", from_step=k, reschedule_s=rec["reschedule_s"])

    def checkpoint_and_requeue(self, node: str, reason: str) -> None:
        """The batch host must go: checkpoint at the next boundary, then requeue excluding it."""
        if getattr(self, "batch_host_pending", None):
            return
        self.batch_host_pending = {"node": node, "reason": reason, "t": time.time()}
        self.journal.write("batch_host_notice", node=node, reason=reason)
        log.warning("the batch host %s must leave (%s): checkpoint, then requeue without it", node, reason)

    def _tick_batch_host(self) -> None:
        pending = getattr(self, "batch_host_pending", None)
        if not pending or pending.get("checkpoint_step") is None:
            return
        if latest_complete(self.run_dir, self.layout.shard_names) == pending["checkpoint_step"]:
            self.requeue(f"batch host {pending['node']} leaving: {pending['reason']}", [], "planned",
                         pending["t"], pending["t"], exclude=[pending["node"]])
