"""The controller: one per run. Membership, step commits, event intake, switch orchestration.

Contract:
- Serves the run's control port (newline JSON, token-authenticated: agents, ``tmslurm notify``,
  ``tmslurm status``) and hosts the TCPStore the process groups rendezvous on. A request without the
  right token is refused and journalled; a malformed one gets an error reply; neither disturbs the run.
- Decides every step exactly once: ``commit`` when every slot voted in the current epoch, ``abort``
  when a failure comes first (a single thread makes the decisions, so there is no race).
- Turns notices (admin, Slurm watcher, injected faults) into planned switches and failures (process
  exit, missed heartbeats, broken connections) into recoveries; falls back to a checkpoint restart
  when no switch is possible. Never waits forever: every phase has a deadline, after which it
  escalates (fence the silent process, replan, or restart).
- Appends every event to ``events.jsonl`` and writes ``summary.json`` at the end.
"""

from __future__ import annotations

import logging
import queue
import socket
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch.distributed as dist

from tmslurm.config import RunConfig, to_dict
from tmslurm.errors import TmslurmError
from tmslurm.messages import Hello, NoticeRequest, StatusRequest, StopRequest
from tmslurm.runtime import switch as sw
from tmslurm.runtime.events import EventLog
from tmslurm.runtime.journal import Journal
from tmslurm.runtime.gate import Gate, GateLimits
from tmslurm.runtime.protocol import Channel
from tmslurm.runtime.recovery import RecoveryMixin
from tmslurm.runtime.restart import RestartMixin
from tmslurm.runtime.spawner import Spawner
from tmslurm.signing import NoticeVerifier, load_public_key
from tmslurm.topology import Layout

log = logging.getLogger(__name__)


@dataclass
class Agent:
    aid: str
    kind: str
    ident: int
    pid: int
    node: str
    channel: Channel
    last_seen: float
    rank: int | None = None
    alive: bool = True
    expected_exit: bool = False
    roles: dict[str, dict[str, Any]] = field(default_factory=dict)
    busy: bool = False
    host: str | None = None


def _notice_verifier(cfg: RunConfig, run_dir: Path) -> NoticeVerifier | None:
    path = cfg.runtime.admin_public_key_file
    if not path:
        return None
    try:
        return NoticeVerifier(load_public_key(Path(path)), run_dir.name, cfg.runtime.notice_max_age_s)
    except TmslurmError as exc:
        log.error("%s (signed admin notices will be refused)", exc)
        return None


class Controller(RecoveryMixin, RestartMixin):
    def __init__(self, cfg: RunConfig, run_dir: Path, token: str, spawner_factory: Callable[["Controller"], Spawner],
                 host: str = "127.0.0.1") -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.token = token
        self.host = host
        self.layout = Layout.from_config(cfg)
        self.world = self.layout.world
        self.journal = Journal(self.run_dir / "events.jsonl")
        self.events = EventLog(self.journal)
        self.q: "queue.Queue[tuple[str, Any, Any]]" = queue.Queue()
        self.agents: dict[str, Agent] = {}
        self.slots: dict[int, str] = {}
        self.epoch = 0
        self._epochs = 0
        self.step = 0
        self.resume_step = 0
        self.votes: dict[int, dict[str, Any]] = {}
        self.step_log: list[dict[str, Any]] = []
        self.mode = "starting"
        self.plan: sw.Plan | None = None
        self.pending_notices: list[dict[str, Any]] = []
        self.fired: set[int] = set()
        self.fault_t: dict[int, float] = {}  # rank -> when its injected fault fired
        self.done: dict[int, dict[str, Any]] = {}
        self.replica_mismatch: list[int] = []
        self.incarnation = 0
        self.standbys_started = 0
        self.comm_error_since: float | None = None
        self.on_step: list[Callable[[int], None]] = []
        self.on_switched: list[Callable[[sw.Plan], None]] = []
        self.inject_fault: Callable[[dict[str, Any]], None] | None = None
        self.notice_filter: Callable[[dict[str, Any]], bool] | None = None
        self.standby_target = cfg.standby.count * cfg.parallel.ranks_per_node
        self.replenish = cfg.standby.replenish or cfg.cluster == "slurm"
        self.stop_event = threading.Event()
        self.verifier = _notice_verifier(cfg, self.run_dir)
        self.conn_agent: dict[int, str] = {}
        self.expected: set[tuple[str, int]] = set()  # spawned, not yet said hello
        if cfg.train.resume_from:
            from tmslurm.train.checkpoint import latest_complete

            self.step = self.resume_step = latest_complete(self.run_dir, self.layout.shard_names) or 0
        self.requeued = False
        self.spawner = spawner_factory(self)
        self.resume_after_requeue()

    # ---- servers ------------------------------------------------------------------------------
    def start_servers(self) -> dict[str, Any]:
        self.store = dist.TCPStore(self.host, 0, is_master=True, wait_for_workers=False, use_libuv=True)
        self.server = socket.create_server((self.host, 0))
        self.gate = Gate(self.server, self.token, self.verifier, self.journal, self.q.put, self._touch, GateLimits())
        self.gate.start()
        self.address = {"host": self.host, "port": self.server.getsockname()[1], "store_port": self.store.port}
        return self.address

    def _touch(self, conn: int) -> None:
        agent = self.agents.get(self.conn_agent.get(conn, ""))
        if agent is not None:
            agent.last_seen = time.monotonic()

    # ---- main loop ----------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        for rank in range(self.world):
            self.spawn_worker(rank, 0)
        for i in range(self.standby_target):
            self._spawn_standby()
        self.mode = "running"
        while self.mode != "finished" and not self.stop_event.is_set():
            try:
                kind, a, b = self.q.get(timeout=0.05)
                self._handle(kind, a, b)
            except queue.Empty:
                pass
            self._tick()
        return self.finish()

    def _handle(self, kind: str, a: Any, b: Any) -> None:
        try:
            self._dispatch(kind, a, b)
        except Exception as exc:  # a bug must not end the run: journal it loudly and go on
            log.exception("controller handler for %s failed", kind)
            self.journal.write("handler_error", item=kind, error=repr(exc)[:300])
            if kind == "request":
                b.try_send({"type": "error", "error": f"internal error: {exc!r}"[:300]})
                b.close()

    def _dispatch(self, kind: str, a: Any, b: Any) -> None:
        if kind == "hello":
            self._hello(a, *b)
        elif kind == "disconnect":
            self._disconnect(self.conn_agent.get(a, ""))
        elif kind == "request":
            self._request(a, b)
        elif kind == "msg":
            handler = getattr(self, f"_on_{b.type}", None)
            agent = self.agents.get(self.conn_agent.get(a, ""))
            if handler is None or agent is None:
                log.warning("ignoring message %s from connection %s", b.type, a)
            elif agent.alive:
                handler(agent, b.model_dump())
        elif kind == "call":
            a()

    def _hello(self, msg: Hello, conn: int, ch: Channel) -> None:
        kind, ident = msg.kind, msg.id
        if (kind, ident) not in self.expected:
            # not a process this controller started and still waits for: an impostor or a late
            # duplicate. It gets no slot, and since it was never ours it is never signalled.
            self.journal.write("hello_refused", kind=kind, id=ident, node=msg.node, reported_pid=msg.pid)
            ch.try_send({"type": "error", "error": f"refused: no {kind} {ident} is expected by this run"})
            ch.close()
            return
        self.expected.discard((kind, ident))
        aid = f"{kind}{ident}.{msg.pid}#{conn}"
        agent = Agent(aid, kind, ident, msg.pid, msg.node, ch, time.monotonic(), host=msg.host)
        self.agents[aid] = agent
        self.conn_agent[conn] = aid
        if kind == "worker":
            agent.rank = ident
            self.slots[ident] = aid
        faults = [{"index": i, **f} for i, f in self._faults() if f["rank"] == ident and kind == "worker"]
        ch.try_send({"type": "welcome", "config": to_dict(self.cfg), "epoch": self.epoch, "generation": self.epoch,
                     "resume_step": self.resume_step, "faults": faults, "address": self.address})
        self.journal.write("agent_up", agent=aid, node=agent.node, pid=agent.pid)

    def spawn_worker(self, rank: int, incarnation: int) -> bool:
        self.expected.add(("worker", rank))
        return self.spawner.spawn_worker(rank, incarnation)

    def _faults(self) -> list[tuple[int, dict[str, Any]]]:
        return [(i, {"step": f.step, "kind": f.kind, "rank": f.rank, "when": f.when}) for i, f in enumerate(self.cfg.faults) if i not in self.fired]

    def broadcast(self, msg: dict[str, Any]) -> None:
        for rank in range(self.world):
            self.send_rank(rank, msg)

    def send_rank(self, rank: int, msg: dict[str, Any]) -> None:
        agent = self.agents.get(self.slots.get(rank, ""))
        if agent is not None and agent.alive:
            agent.channel.try_send(msg)

    def send_to(self, key: Any, msg: dict[str, Any]) -> None:
        if isinstance(key, int):
            self.send_rank(key, msg)
        elif key in self.agents:
            self.agents[key].channel.try_send(msg)

    # ---- commits ------------------------------------------------------------------------------
    def _on_vote(self, agent: Agent, msg: dict[str, Any]) -> None:
        if self.mode != "running" or msg.get("epoch") != self.epoch or msg.get("step") != self.step:
            return
        if self.slots.get(msg.get("rank")) != agent.aid:
            return  # a fenced or replaced process: its vote does not count
        self.votes[msg["rank"]] = msg
        if len(self.votes) == self.world and not self._hold_first_commit():
            self._commit()

    def _hold_first_commit(self) -> bool:
        """standby.start_when_warm: the first step commits once every standby is warm (or timed out)."""
        if not self.cfg.standby.start_when_warm or self.step_log or self.standby_target == 0:
            return False
        self.hold_since = getattr(self, "hold_since", None) or time.monotonic()
        seen = [a for a in self.agents.values() if a.kind == "standby"]
        warming = sum(1 for a in seen if a.alive and not set(a.roles) >= set(self.layout.roles))
        not_connected = self.standbys_started - len(seen)  # a standby that died is not waited for
        return warming + not_connected > 0 and time.monotonic() - self.hold_since < self.cfg.runtime.connect_timeout_s

    def release_held_commit(self) -> None:
        if self.mode == "running" and len(self.votes) == self.world and not self._hold_first_commit():
            self._commit()

    def _on_groups(self, agent: Agent, msg: dict[str, Any]) -> None:
        self.journal.write("groups", **{k: v for k, v in msg.items() if k != "type"})

    def _on_progress(self, agent: Agent, msg: dict[str, Any]) -> None:
        if msg.get("step") == self.step and self.slots.get(msg.get("rank")) == agent.aid:
            self.votes[msg["rank"]] = msg
            if len(self.votes) == self.world:
                self._record_step(time.time())
                self._advance()

    def _commit(self) -> None:
        now = time.time()
        decision = {"type": "decision", "step": self.step, "decision": "commit", "epoch": self.epoch}
        plan = self.plan
        attach = plan is not None and plan.kind == "planned" and plan.ready and not plan.applied and self.step + 1 < self.cfg.train.steps
        if attach:
            plan.applied = True
            plan.times["decision"] = now
            plan.info["step"] = self.step
            plan.info["target_step"] = self.step + 1
            plan.info["event"]["last_commit_t"] = now
            decision["switch"] = {"epoch": plan.epoch, "moves": [{"rank": m.rank, "joiner": m.joiner} for m in plan.moves]}
            decision["epoch"] = plan.epoch
            plan.waiting = {m.joiner for m in plan.moves} | {f"r{m.rank}" for m in plan.moves}
            for key, msg in plan.info.pop("deferred", {}).items():
                self.send_to(key, msg)
        final = getattr(self, "stop_requested", False) and not attach
        if final:
            decision["final"] = True
        pending = getattr(self, "batch_host_pending", None)
        if pending and pending.get("checkpoint_step") is None:
            decision["checkpoint"] = True
            pending["checkpoint_step"] = self.step + 1
            self.mode = "checkpointing"
        self.broadcast(decision)
        if attach:
            for m in plan.moves:
                self.send_to(m.joiner, {"type": "activate", "epoch": plan.epoch})
            self.epoch = plan.epoch
        self._record_step(now)
        self._advance(final)

    def _record_step(self, now: float) -> None:
        losses = [v["loss"] for v in self.votes.values() if v.get("loss") is not None]
        digests: dict[int, set[str]] = {}
        for r, v in self.votes.items():
            if "digest" in v:
                digests.setdefault(self.layout.shard(r), set()).add(v["digest"])
        if any(len(d) > 1 for d in digests.values()):
            self.replica_mismatch.append(self.step)
            log.error("data-parallel replicas differ before step %d", self.step)
        entry = {"step": self.step, "t_end": now, "dt": max(v.get("dt", 0.0) for v in self.votes.values()),
                 "loss": sum(losses) / len(losses) if losses else None, "epoch": self.epoch,
                 "peak_rss_mb": {r: v.get("peak_rss_mb") for r, v in sorted(self.votes.items())}}
        self.step_log.append(entry)
        self.events.on_commit(self.step, now, self.median_step())
        if self.step % 10 == 0 or self.step == self.cfg.train.steps - 1:
            log.info("step %d loss %.4f step time %.3fs", self.step, entry["loss"] or float("nan"), entry["dt"])

    def _advance(self, final: bool = False) -> None:
        self.votes = {}
        self.step += 1
        for cb in self.on_step:
            cb(self.step)
        if self.step >= self.cfg.train.steps or final:
            self.mode = "draining"
            return
        for i, f in self._faults():
            if f["kind"] in ("drain", "node_down") and f["step"] == self.step:
                self.fired.add(i)
                if self.inject_fault is not None:
                    self.inject_fault(f)  # through the cluster manager (scontrol), seen by the watcher
                else:
                    self.submit_notice({"kind": "maintenance", "rank": f["rank"], "source": "fault", "reason": "injected drain"})

    def median_step(self) -> float:
        gaps = [b["t_end"] - a["t_end"] for a, b in zip(self.step_log, self.step_log[1:]) if b["step"] == a["step"] + 1]
        return statistics.median(gaps) if gaps else 0.0

    # ---- notices ------------------------------------------------------------------------------
    def submit_notice(self, notice: dict[str, Any]) -> None:
        """Queue a notice from any thread (watcher, admin request, fault)."""
        self.q.put(("call", lambda: self._notice(notice), None))

    def ranks_of_node(self, node: str) -> list[int]:
        return sorted(r for r, aid in self.slots.items() if aid in self.agents and self.agents[aid].node == node and self.agents[aid].alive)

    def nodes(self) -> dict[str, str]:
        out = {}
        for aid in list(self.slots.values()):
            out[self.agents[aid].node] = "main"
        for a in self.agents.values():
            if a.kind == "standby" and a.alive and a.rank is None:
                out[a.node] = "spare"
        return out

    def _notice(self, notice: dict[str, Any]) -> None:
        if self.notice_filter is not None and self.notice_filter(notice):
            self.journal.write("notice", notice=notice, handled="batch host")
            return
        ranks = [notice["rank"]] if notice.get("rank") is not None else self.ranks_of_node(notice.get("node", ""))
        if not ranks:
            self._standby_notice(notice)
            return
        self.journal.write("notice", **notice, ranks=ranks)
        if notice["kind"] == "failure" and notice.get("source") == "slurm" and self._ranks_heartbeating(ranks):
            # cross-check: Slurm lost contact with the node's slurmd, but its ranks are alive and
            # heartbeating. If the node really died, their heartbeats stop and that is detected.
            log.warning("Slurm reports %s %s but its ranks %s are alive: not a failure of the run",
                        notice.get("node"), notice.get("reason", ""), ranks)
            self.journal.write("slurm_failure_not_confirmed", node=notice.get("node"), ranks=ranks)
            return
        if notice["kind"] == "failure":
            self.fail(set(ranks), f"notice: {notice.get('reason', '')}".strip(), detect_t=time.time())
        elif self.mode == "running" and self.plan is None:
            self._start_planned(ranks, notice)
        else:
            self.pending_notices.append(notice)

    def _ranks_heartbeating(self, ranks: list[int]) -> bool:
        fresh = 3 * self.cfg.runtime.heartbeat_interval_s if self.cfg.runtime.heartbeats else 0.0
        now = time.monotonic()
        agents = [self.agents.get(self.slots.get(r, "")) for r in ranks]
        return bool(agents) and all(a is not None and a.alive and now - a.last_seen < fresh for a in agents)

    def _standby_notice(self, notice: dict[str, Any]) -> None:
        for a in self.agents.values():
            if a.kind == "standby" and a.rank is None and a.node == notice.get("node") and a.alive:
                self.journal.write("standby_lost", agent=a.aid, reason=notice.get("reason", notice["kind"]))
                self._kill_agent(a)
                self._maybe_replenish()

    def _request(self, msg: NoticeRequest | StatusRequest | StopRequest, ch: Channel) -> None:
        try:
            if isinstance(msg, NoticeRequest):
                self._request_notice(msg, ch)
            elif isinstance(msg, StatusRequest):
                ch.try_send({"type": "status", "ok": True, "status": self.status()})
            elif isinstance(msg, StopRequest):
                self.stop_requested = True
                self.journal.write("stop_requested")
                ch.try_send({"type": "ok", "ok": True, "stopping_after_step": self.step})
        finally:
            ch.close()

    def _request_notice(self, msg: NoticeRequest, ch: Channel) -> None:
        node, rank = msg.node, msg.rank
        if rank is None and node not in self.nodes():
            ch.try_send({"type": "error", "error": f"unknown node {node!r}; this run uses: {', '.join(sorted(self.nodes()))}"})
            return
        if rank is not None and not 0 <= rank < self.world:
            ch.try_send({"type": "error", "error": f"unknown rank {rank!r}; valid: 0..{self.world - 1}"})
            return
        notice = {"kind": msg.event, "node": node, "rank": rank, "source": msg.source, "reason": msg.reason, "deadline": msg.deadline}
        self._notice(notice)
        ch.try_send({"type": "ok", "ok": True, "accepted": notice})

    # ---- planned switch -----------------------------------------------------------------------
    def _new_epoch(self) -> int:
        self._epochs = max(self._epochs, self.epoch) + 1
        return self._epochs

    def warm_pool(self) -> dict[str, set[str]]:
        return {a.aid: set(a.roles) for a in self.agents.values()
                if a.kind == "standby" and a.alive and a.rank is None and not a.busy and a.roles}

    def standby_nodes(self) -> dict[str, str]:
        return {a.aid: a.node for a in self.agents.values() if a.kind == "standby"}

    def _start_planned(self, ranks: list[int], notice: dict[str, Any]) -> None:
        t0 = time.time()
        if self.cfg.runtime.restart_mode != "tmslurm":
            self.restart(f"planned {notice.get('reason', '')} ({self.cfg.runtime.restart_mode})", ranks, "planned", t0)
            return
        try:
            moves = sw.pick_joiners(self.layout, ranks, self.warm_pool(), self.standby_nodes())
        except sw.PlanError as exc:
            if any(a.kind == "standby" and a.alive and a.rank is None and not a.busy for a in self.agents.values()):
                log.info("planned migration of ranks %s waits for a standby to finish warming up", ranks)
                self.pending_notices.append(notice)
                return
            log.warning("planned migration of ranks %s impossible (%s); falling back to a checkpoint restart", ranks, exc)
            self.restart(str(exc), ranks, "planned", t0)
            return
        full = self.cfg.runtime.switch_mode == "full"
        groups = self.layout.groups if full else self.layout.affected_groups(ranks)
        plan = sw.Plan("planned", self._new_epoch(), moves, sw.multi(self.layout, groups))
        plan.times.update(notice=notice.get("t", t0), detect=t0, pick=time.time())
        plan.info.update(reason=notice.get("reason", ""), source=notice.get("source", ""), node=notice.get("node"))
        for m in moves:
            self.agents[m.joiner].busy = True
        msgs = sw.planned_messages(self.layout, plan)
        self.plan = plan
        if full:  # no phase 1: everything is built inside the pause, after the next commit
            plan.info["deferred"] = msgs
            plan.ready = True
        else:
            plan.waiting = {k if isinstance(k, str) else f"r{k}" for k in msgs}
            for key, msg in msgs.items():
                self.send_to(key, msg)
        self.events.begin(plan, self.agents, self.slots)
        log.info("planned switch epoch %d: ranks %s -> %s (rebuilding %s)", plan.epoch, ranks, [m.joiner for m in moves], plan.groups)

    def _who(self, agent: Agent) -> str:
        """How a plan's waiting set names an agent: r<rank> for a slot owner, else its agent id."""
        owns_slot = agent.rank is not None and self.slots.get(agent.rank) == agent.aid
        return f"r{agent.rank}" if owns_slot else agent.aid

    def _on_prepared(self, agent: Agent, msg: dict[str, Any]) -> None:
        plan = self.plan
        if plan is None or msg.get("epoch") != plan.epoch:
            return
        if plan.applied:  # switch_mode=full: built inside the pause
            plan.parts["phase1_s"] = max(plan.parts.get("phase1_s", 0.0), float(msg.get("phase1_s") or 0.0))
            return
        if msg.get("error"):
            log.warning("phase 1 failed on %s: %s", agent.aid, msg["error"])
            self._cancel_plan(requeue=True)
            return
        plan.waiting.discard(self._who(agent))
        plan.parts["phase1_s"] = max(plan.parts.get("phase1_s", 0.0), float(msg.get("phase1_s") or 0.0))
        if not plan.waiting:
            plan.ready = True
            plan.times["phase1_done"] = time.time()

    def _on_switched(self, agent: Agent, msg: dict[str, Any]) -> None:
        if self.plan is not None and msg.get("epoch") == self.plan.epoch:
            self.plan.parts["phase2_s"] = max(self.plan.parts.get("phase2_s", 0.0), float(msg.get("phase2_s", 0.0)))

    def _on_left(self, agent: Agent, msg: dict[str, Any]) -> None:
        agent.expected_exit = True
        if self.plan is not None:
            self.plan.waiting.discard(f"r{msg['rank']}")
            self.plan.parts["phase2_s"] = max(self.plan.parts.get("phase2_s", 0.0), float(msg.get("phase2_s", 0.0)))
        self.journal.write("left", agent=agent.aid, rank=msg["rank"], node=agent.node, transfer_s=msg.get("transfer_s"))
        self._maybe_finish_plan()

    def _on_joined(self, agent: Agent, msg: dict[str, Any]) -> None:
        plan = self.plan
        if plan is None or msg.get("epoch") != plan.epoch:
            return
        rank = int(msg["rank"])
        old = self.agents.get(self.slots.get(rank, ""))
        if old is not None and old is not agent:
            old.expected_exit = True
        agent.rank = rank
        agent.busy = False
        self.slots[rank] = agent.aid
        plan.waiting.discard(agent.aid)
        plan.parts["transfer_s"] = max(plan.parts.get("transfer_s", 0.0), float(msg.get("transfer_s", 0.0)))
        plan.info.setdefault("bytes", 0)
        plan.info["bytes"] += int(msg.get("bytes", 0))
        rec = plan.info.get("event")
        if rec is not None:  # warm only if every joiner of the plan was
            rec["joiner_warm"] = rec.get("joiner_warm", True) and bool(msg.get("joiner_warm", True))
            if msg.get("warm_reason"):
                rec.setdefault("warm_reasons", []).append(f"rank {rank}: {msg['warm_reason']}")
        self.journal.write("joined", agent=agent.aid, rank=rank, node=agent.node, epoch=plan.epoch,
                           joiner_warm=msg.get("joiner_warm"), warm_reason=msg.get("warm_reason"))
        self._maybe_finish_plan()
        self._maybe_replenish()

    def _on_join_failed(self, agent: Agent, msg: dict[str, Any]) -> None:
        log.warning("standby %s failed to join: %s", agent.aid, msg.get("error"))
        agent.busy = False
        plan = self.plan
        if plan is not None and msg.get("epoch") == plan.epoch:
            if plan.kind == "planned" and not plan.applied:
                self._cancel_plan(requeue=True)
            else:
                self.fail(set(), f"joiner {agent.aid} failed", detect_t=time.time())

    def _maybe_finish_plan(self) -> None:
        plan = self.plan
        if plan is None or plan.waiting or (plan.kind == "planned" and not plan.applied):
            return
        plan.times["switched"] = time.time()
        self.events.switched(plan)
        self.plan = None
        for hook in self.on_switched:
            hook(plan)
        self.mode = "running"
        if self.pending_notices:
            self._notice(self.pending_notices.pop(0))

    def _cancel_plan(self, requeue: bool) -> None:
        plan, self.plan = self.plan, None
        if plan is None:
            return
        for key in {r for m in plan.moves for r in (m.joiner,)}:
            self.send_to(key, {"type": "cancel", "epoch": plan.epoch})
            if key in self.agents:
                self.agents[key].busy = False
        self.broadcast({"type": "cancel", "epoch": plan.epoch})
        self.events.cancel(plan)
        if requeue and plan.kind == "planned":
            alive = [r for r in plan.ranks if self.slots.get(r) in self.agents and self.agents[self.slots[r]].alive]
            if alive:
                self.pending_notices.append({"kind": "maintenance", "rank": alive[0], "source": "controller", "reason": plan.info.get("reason", "")})
