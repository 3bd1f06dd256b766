"""The controller's state machine, driven with fake channels and a fake cluster: no process, no socket.

Table-driven over event orders: vote before failure, failure before vote, a second failure during a
switch, a late vote of a fenced process, a notice for an unknown node, a standby lost while joining.
"""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.controller_harness import FakeChannel, FakeCluster, FakeSpawner, Harness
from tmslurm.controller.deadlines import SPARES_CHECK_S
from tmslurm.controller.items import Batch, MessageIn, RequestIn
from tmslurm.controller.plan_types import PlannedSwitch, Recovery
from tmslurm.controller.state import Mode
from tmslurm.core.notices import Notice
from tmslurm.wire.messages import NoticeRequest, decode_agent


def notice(kind: str = "maintenance", source: str = "admin", **fields) -> Notice:
    return Notice(kind=kind, source=source, time=time.time(), **fields)


def vote_before_failure(h: Harness) -> None:
    for r in range(4):
        h.vote(r)
    h.disconnect(2)


def failure_before_vote(h: Harness) -> None:
    for r in (0, 1, 3):
        h.vote(r)
    h.disconnect(2)
    h.vote(2)  # whatever its connection still delivers: a dead process's vote


def second_failure_during_switch(h: Harness) -> None:
    h.ctl.intake.notice(notice(rank=1, reason="psu"))
    h.prepare_all()
    h.disconnect(3)


def late_vote_of_fenced_process(h: Harness) -> None:
    h.state.agents[h.aid(1)].last_seen -= 3600  # silent for an hour: hung
    h.ctl.deadlines.tick()
    for r in range(4):
        h.vote(r)  # rank 1's vote arrives late, from the fenced process


def notice_for_unknown_node(h: Harness) -> None:
    h.ctl.intake.notice(notice(node="nowhere", source="slurm", reason="drain"))
    for r in range(4):
        h.vote(r)


def standby_lost_while_joining(h: Harness) -> None:
    h.ctl.intake.notice(notice(rank=1, reason="psu"))
    h.disconnect("s0")


SCENARIOS = {
    # name: (events, step after, mode after, plan type after, epoch after, fenced (a process whose
    # connection closed has exited; a silent one is fenced), committed steps)
    "vote before failure": (vote_before_failure, 1, Mode.RECOVERING, Recovery, 1, [], [0]),
    "failure before vote": (failure_before_vote, 0, Mode.RECOVERING, Recovery, 1, [], []),
    "second failure during a switch": (second_failure_during_switch, 0, Mode.RECOVERING, Recovery, 2, [], []),
    "late vote of a fenced process": (
        late_vote_of_fenced_process,
        0,
        Mode.RECOVERING,
        Recovery,
        1,
        [("worker", 1)],
        [],
    ),
    "notice for an unknown node": (notice_for_unknown_node, 1, Mode.RUNNING, type(None), 0, [], [0]),
    "standby lost while joining": (standby_lost_while_joining, 0, Mode.RUNNING, type(None), 0, [], []),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_event_orders(tmp_path, name):
    events, step, mode, plan_type, epoch, fenced, committed = SCENARIOS[name]
    h = Harness(tmp_path)
    events(h)
    assert (h.state.step, h.state.mode, type(h.state.plan), h.state.epoch) == (step, mode, plan_type, epoch)
    assert h.spawner.fenced == fenced
    assert [d["step"] for d in h.got(0, "decision")] == committed
    assert not h.journal("handler_error")


def test_failure_before_vote_aborts_and_recovers_through_the_standby(tmp_path):
    h = Harness(tmp_path)
    failure_before_vote(h)
    assert h.got(0, "abort") == [{"type": "abort", "epoch": 1, "step": 0}] and not h.got(0, "decision")
    h.vote(0, epoch=0)  # an old-epoch vote is ignored
    assert h.state.votes == {}
    h.abort_all([0, 1, 3])
    plan = h.state.plan
    assert plan.applied and [m.rank for m in plan.moves] == [2] and plan.moves[0].source == 0
    assert h.got("s0", "join")[-1]["activate"] is True and h.got(0, "recover")[-1]["pairs"] == {"xfer/r2": [1, 0]}
    for r in (0, 1, 3):
        h.send(r, {"type": "recovered", "epoch": 1, "rank": r, "build_s": 0.01})
    h.send(
        "s0",
        {
            "type": "joined",
            "epoch": 1,
            "rank": 2,
            "joiner": 0,
            "step": 0,
            "transfer_s": 0.01,
            "phase1_s": 0.01,
            "bytes": 10,
            "rss_mb": 1.0,
        },
    )
    assert h.state.plan is None and h.state.mode is Mode.RUNNING and h.state.slots[2] == h.aid("s0")
    for r in (0, 1, 3):
        h.vote(r)
    h.vote("s0", rank=2)
    assert h.got(0, "decision")[-1] == {
        "type": "decision",
        "step": 0,
        "decision": "commit",
        "epoch": 1,
        "switch": None,
        "checkpoint": False,
        "final": False,
    }


@pytest.mark.parametrize("fault_at", [None, 5.0], ids=["instant unknown", "injected fault"])
def test_only_a_failure_whose_instant_is_known_has_a_step_in_flight_before_it(tmp_path, fault_at):
    """A process that dies on its own is known only by its detection: its event gets no
    ``before_fault_s`` (it would be the whole detection) and is noticed when it was detected."""
    h = Harness(tmp_path)
    for r in range(4):  # step 0 commits: the event has a last commit to count from
        h.vote(r)
    if fault_at is not None:
        h.state.fault_t[2] = time.time() - fault_at
    failure_before_vote(h)
    plan, rec = h.state.plan, h.ctl.ctx.events.items[-1]
    assert ("failure" in plan.times) is (fault_at is not None)
    assert rec["notice_t"] == plan.times.get("failure", plan.times["detect"])
    h.abort_all([0, 1, 3])
    for r in (0, 1, 3):
        h.send(r, {"type": "recovered", "epoch": 1, "rank": r, "build_s": 0.01})
    h.send(
        "s0",
        {
            "type": "joined",
            "epoch": 1,
            "rank": 2,
            "joiner": 0,
            "step": 0,
            "transfer_s": 0.01,
            "phase1_s": 0.01,
            "bytes": 10,
            "rss_mb": 1.0,
        },
    )
    assert rec["status"] == "switched" and rec["detect_s"] >= (fault_at or 0.0)
    assert ("before_fault_s" in rec) is (fault_at is not None)


@pytest.mark.parametrize("overlap, held", [(False, [1, 3]), (True, [])])
def test_ranks_that_send_no_state_redo_the_step_only_after_the_transfers(tmp_path, overlap, held):
    """runtime.redo_overlap=false: the ranks that are no source are told to hold, and get ``resume``
    once the recovery finished (the source sent, the joiner joined), not before."""
    h = Harness(tmp_path, 2, 2, 1, f"runtime.redo_overlap={str(overlap).lower()}")
    failure_before_vote(h)
    h.abort_all([0, 1, 3])
    assert [r for r in (0, 1, 3) if h.got(r, "recover")[-1]["hold"]] == held  # rank 0 is the source
    assert h.journal("recover")[-1]["held"] == held
    for r in (0, 1, 3):
        h.send(r, {"type": "recovered", "epoch": 1, "rank": r, "build_s": 0.01})
    assert not any(h.got(r, "resume") for r in (0, 1, 3))  # the joiner still receives the state
    h.send(
        "s0",
        {
            "type": "joined",
            "epoch": 1,
            "rank": 2,
            "joiner": 0,
            "step": 0,
            "transfer_s": 0.01,
            "phase1_s": 0.01,
            "bytes": 10,
            "rss_mb": 1.0,
        },
    )
    assert h.state.mode is Mode.RUNNING
    assert [r for r in (0, 1, 3) if h.got(r, "resume")] == held
    assert all(h.got(r, "resume") == [{"type": "resume", "epoch": 1}] for r in held)


def test_votes_of_the_redone_step_before_the_recovery_is_done_are_kept_not_dropped(tmp_path):
    """Ranks that finished the redone step may vote before the controller has read the last
    ``recovered``/``joined`` (other connections, or one relay frame read ahead of another node's):
    the votes wait, and the step commits the moment the recovery is done, not before."""
    h = Harness(tmp_path)
    failure_before_vote(h)
    h.abort_all([0, 1, 3])
    for r in (0, 1):
        h.send(r, {"type": "recovered", "epoch": 1, "rank": r, "build_s": 0.01})
    h.send(
        "s0",
        {
            "type": "joined",
            "epoch": 1,
            "rank": 2,
            "joiner": 0,
            "step": 0,
            "transfer_s": 0.01,
            "phase1_s": 0.01,
            "bytes": 10,
            "rss_mb": 1.0,
        },
    )
    for r in (0, 1):
        h.vote(r)
    h.vote("s0", rank=2)
    h.vote(3, epoch=0)  # an old epoch's vote is still dropped
    assert h.state.mode is Mode.RECOVERING and sorted(h.state.votes) == [0, 1, 2] and not h.got(0, "decision")
    h.send(3, {"type": "recovered", "epoch": 1, "rank": 3, "build_s": 0.01})
    assert h.state.mode is Mode.RUNNING and not h.got(0, "decision")  # rank 3 has not voted yet
    h.vote(3)
    assert h.got(0, "decision")[-1]["step"] == 0 and h.got(0, "decision")[-1]["epoch"] == 1


def test_planned_switch_rides_on_the_next_commit(tmp_path):
    h = Harness(tmp_path)
    h.ctl.intake.notice(notice(rank=1, reason="psu"))
    plan = h.state.plan
    assert isinstance(plan, PlannedSwitch) and not plan.ready and h.got("s0", "join")[-1]["activate"] is False
    assert not h.got(2, "prepare")  # rank 2 shares no group with rank 1: untouched
    h.prepare_all()
    assert plan.ready
    for r in range(4):
        h.vote(r)
    decision = h.got(0, "decision")[-1]
    assert decision["switch"] == {"epoch": 1, "moves": [{"rank": 1, "joiner": h.aid("s0")}]} and h.state.epoch == 1
    assert h.got("s0", "activate") == [{"type": "activate", "epoch": 1}]
    h.send(1, {"type": "left", "rank": 1, "step": 1, "transfer_s": 0.01, "phase2_s": 0.01, "bytes": 10})
    h.send(
        "s0",
        {
            "type": "joined",
            "epoch": 1,
            "rank": 1,
            "joiner": 0,
            "step": 1,
            "transfer_s": 0.01,
            "phase1_s": 0.01,
            "bytes": 10,
            "rss_mb": 1.0,
        },
    )
    assert h.state.plan is None and h.state.slots[1] == h.aid("s0") and h.cluster.released == [["n1"]]


def test_second_failure_during_a_switch_requeues_the_notice(tmp_path):
    h = Harness(tmp_path)
    second_failure_during_switch(h)
    assert [c["epoch"] for c in h.got(0, "cancel")] == [1] and h.got(0, "abort")[-1]["epoch"] == 2
    (again,) = h.state.pending_notices
    assert (again.kind, again.rank, again.source, again.reason) == ("maintenance", 1, "controller", "psu")


def test_standby_lost_while_joining_after_the_switch_was_applied_fails_the_step(tmp_path):
    h = Harness(tmp_path)
    h.ctl.intake.notice(notice(rank=1, reason="psu"))
    h.prepare_all()
    for r in range(4):
        h.vote(r)
    h.disconnect("s0")
    assert isinstance(h.state.plan, Recovery) and h.state.epoch == 2 and h.got(0, "abort")[-1]["step"] == 1


def test_hostile_hello_is_refused_and_nothing_is_fenced(tmp_path):
    h = Harness(tmp_path)
    ch = h.hello("evil", "worker", 1, "n1", pid=-1)
    assert ch.closed and "refused" in ch.sent[0]["error"] and h.state.slots[1] == h.aid(1)
    h.state.agents[h.aid(1)].last_seen -= 3600
    h.ctl.deadlines.tick()
    assert h.spawner.fenced == [("worker", 1)]  # its own handle; the reported pid 4242 goes nowhere
    assert h.journal("hello_refused")[0]["reported_pid"] == -1


def test_notice_request_for_unknown_node_or_rank_gets_an_error(tmp_path):
    h = Harness(tmp_path)
    for msg, error in (
        (NoticeRequest(type="notice", token="t", event="maintenance", node="nowhere"), "unknown node"),
        (NoticeRequest(type="notice", token="t", event="failure", rank=7), "unknown rank"),
    ):
        ch = FakeChannel()
        h.ctl.handle(RequestIn(msg, ch))
        assert ch.sent[0]["type"] == "error" and error in ch.sent[0]["error"] and ch.closed
    assert h.state.plan is None and h.state.mode is Mode.RUNNING


def test_no_standby_falls_back_to_a_restart_from_the_checkpoint(tmp_path):
    h = Harness(tmp_path, 2, 2, 0)
    h.disconnect(2)
    h.abort_all([0, 1, 3])
    assert h.spawner.workers[-4:] == [(0, 1), (1, 1), (2, 1), (3, 1)] and h.state.incarnation == 1
    assert h.state.expected == {("worker", r) for r in range(4)} and h.state.mode is Mode.RUNNING
    assert h.cluster.released == []  # every rank restarted on its own node: nothing to give back


class WaitingCluster(FakeCluster):
    """Restarted ranks wait for a spare allocation: ``waited`` seconds so far (a Slurm hook's answer)."""

    def __init__(self) -> None:
        super().__init__()
        self.waited: dict[int, float] = {}

    def waiting_ranks(self) -> dict[int, float]:
        return dict(self.waited)


@pytest.mark.parametrize("waited,ends", [(5.0, False), (121.0, True)])
def test_a_restart_waits_for_a_spare_allocation_but_never_hangs(tmp_path, waited, ends):
    cluster = WaitingCluster()
    h = Harness(tmp_path, 2, 2, 0, cluster=lambda cfg: (FakeSpawner(), cluster))
    h.disconnect(2)
    h.abort_all([0, 1, 3])
    cluster.waited = {2: waited}  # runtime.connect_timeout_s is 120
    h.ctl.deadlines.tick(now=time.time())
    assert (h.state.mode is Mode.FINISHED) is ends
    if ends:
        (failed,) = h.journal("run_failed")
        assert "no node to restart ranks [2]" in failed["reason"] and "connect_timeout_s" in failed["reason"]
    else:
        assert not h.journal("run_failed") and h.state.mode is Mode.RUNNING


AGENT_MESSAGES = st.sampled_from(
    [
        "vote",
        "prepared",
        "switched",
        "left",
        "aborted",
        "recovered",
        "joined",
        "join_failed",
        "comm_error",
        "done",
        "fault",
        "disconnect",
        "tick",
    ]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    steps=st.lists(
        st.tuples(AGENT_MESSAGES, st.sampled_from([0, 1, 2, 3, "s0", "s1"]), st.integers(0, 3), st.integers(0, 3)),
        max_size=40,
    )
)
def test_any_order_of_valid_messages_never_breaks_the_controller(tmp_path_factory, steps):
    h = Harness(tmp_path_factory.mktemp("c"), 2, 2, 2)
    epochs = [h.state.epoch]
    for kind, who, epoch, n in steps:
        rank = who if isinstance(who, int) else n
        msg = {
            "vote": {"type": "vote", "step": h.state.step, "epoch": epoch, "rank": rank, "dt": 0.0, "peak_rss_mb": 0.0},
            "prepared": {"type": "prepared", "epoch": epoch, "rank": rank},
            "switched": {"type": "switched", "epoch": epoch, "rank": rank, "phase2_s": 0.0},
            "left": {"type": "left", "rank": rank, "step": n, "transfer_s": 0.0, "phase2_s": 0.0, "bytes": 0},
            "aborted": {"type": "aborted", "epoch": epoch, "rank": rank, "step": n, "status": {}},
            "recovered": {"type": "recovered", "epoch": epoch, "rank": rank, "build_s": 0.0},
            "joined": {
                "type": "joined",
                "epoch": epoch,
                "rank": n,
                "joiner": 0,
                "step": n,
                "transfer_s": 0.0,
                "phase1_s": 0.0,
                "bytes": 0,
                "rss_mb": 0.0,
            },
            "join_failed": {"type": "join_failed", "epoch": epoch, "rank": n, "error": "x"},
            "comm_error": {"type": "comm_error", "rank": rank, "step": n, "epoch": epoch, "error": "x"},
            "done": {"type": "done", "rank": rank, "stage": n % 2, "digest": "d", "state_digest": "s", "step": n},
            "fault": {"type": "fault", "index": n, "rank": rank, "step": n, "kind": "kill"},
        }.get(kind)
        if kind == "disconnect":
            h.disconnect(who)
        elif kind == "tick":
            h.ctl.deadlines.tick(now=time.time() + 3600)
        else:
            h.send(who, msg)
        epochs.append(h.state.epoch)
    assert not h.journal("handler_error")
    assert epochs == sorted(epochs)
    assert all(kind in ("worker", "standby") for kind, _ in h.spawner.fenced)


def test_planned_event_without_standby_checkpoints_then_restarts_losing_nothing(tmp_path, monkeypatch):
    h = Harness(tmp_path, 2, 2, 0)
    for r in range(4):
        h.vote(r)
    h.ctl.intake.notice(notice(rank=1, reason="psu"))
    for r in range(4):
        h.vote(r)
    assert h.got(0, "decision")[-1]["checkpoint"] is True and h.state.mode is Mode.CHECKPOINTING
    assert h.state.step == 2 and h.state.checkpoint_then.checkpoint_step == 2
    monkeypatch.setattr("tmslurm.controller.restarts.latest_complete", lambda run_dir, pp: 2)
    h.ctl.deadlines.tick()
    (rec,) = h.ctl.ctx.events.items
    assert rec["from_checkpoint_step"] == 2 and rec["lost_steps"] == 0 and rec["trigger"] == "planned"
    assert h.spawner.workers[-4:] == [(r, 1) for r in range(4)] and h.state.step == 2


def test_launch_warns_when_every_failure_would_restart_from_step_0(caplog):
    from tmslurm.core.config import compose_config
    from tmslurm.run.prepare import warn_unprotected

    warn_unprotected(compose_config(["standby.count=0", "train.checkpoint_every=0"]))
    warn_unprotected(compose_config(["standby.count=1", "train.checkpoint_every=0"]))
    assert [r.message for r in caplog.records if "restarts the run from step 0" in r.message] != []
    assert len(caplog.records) == 1


def test_deadline_ticker_fires_once_per_period_however_many_items():
    from tmslurm.controller.loop import Ticker

    ticker = Ticker(0.05)
    fired = [t for t in (i * 0.001 for i in range(1000)) if ticker.due(t)]  # 1,000 queue items in 1 s
    assert len(fired) == 20 and fired[0] == 0.0
    assert all(b - a >= 0.05 - 1e-9 for a, b in zip(fired, fired[1:]))
    assert Ticker(0.05).due(123.0)  # the first check is never delayed


def test_launch_warns_when_a_slurm_run_has_no_periodic_checkpoint(caplog):
    from tmslurm.core.config import compose_config
    from tmslurm.run.prepare import warn_unprotected

    warn_unprotected(compose_config(["cluster=slurm", "standby.count=1"]))  # the Slurm default: periodic checkpoints
    assert caplog.records == []
    warn_unprotected(compose_config(["cluster=slurm", "standby.count=1", "train.checkpoint_every=0"]))
    (rec,) = caplog.records
    assert rec.levelname == "WARNING" and "train.checkpoint_every=K" in rec.message and "batch host" in rec.message


def test_a_restart_that_moves_a_rank_off_a_bad_node_gives_that_node_back(tmp_path):
    class Moving(FakeSpawner):
        def __init__(self) -> None:
            super().__init__()
            self.nodes = {r: f"n{r}" for r in range(4)}

        def spawn_worker(self, rank: int, incarnation: int) -> bool:
            if incarnation and rank == 2:
                self.nodes[2] = "spare0"  # n2 went bad: the restart puts rank 2 on a spare allocation
            return super().spawn_worker(rank, incarnation)

        def node_of_rank(self, rank: int) -> str:
            return self.nodes[rank]

    h = Harness(tmp_path, 2, 2, 0, cluster=lambda cfg: (Moving(), FakeCluster()))
    h.disconnect(2)
    h.abort_all([0, 1, 3])
    assert h.state.incarnation == 1 and h.cluster.released == [["n2"]]


def test_a_gate_batch_is_handled_item_by_item_in_order(tmp_path):
    h = Harness(tmp_path)
    step = h.state.step
    votes = [
        MessageIn(
            h.conns[r],
            decode_agent(
                {"type": "vote", "step": step, "epoch": 0, "rank": r, "loss": 1.0, "dt": 0.01, "peak_rss_mb": 1.0}
            ),
        )
        for r in range(4)
    ]
    # a handler failing on one item (a bug) leaves the items after it handled
    broken = MessageIn(h.conns[1], decode_agent({"type": "hb"}))

    def bug(agent, msg):
        raise RuntimeError("a bug in a handler")

    h.ctl.dispatch.handlers[type(broken.msg)] = bug
    h.ctl.handle(Batch([votes[0], votes[1], broken, votes[2], votes[3]]))
    assert h.state.step == step + 1 and h.got(0, "decision")[-1]["step"] == step
    assert [e["item"] for e in h.journal("handler_error")] == ["msg"]


@pytest.mark.parametrize(
    "msg",
    [
        {"type": "exited", "agent": "worker0.0#1", "pid": 1},
        {"type": "probed", "seq": 1, "seconds": 0.1},
        {"type": "sink", "host": "10.0.0.9", "port": 9},
        {"type": "hb"},
    ],
)
def test_a_monitors_message_from_a_worker_is_refused_and_changes_nothing(tmp_path, msg):
    h = Harness(tmp_path)
    before = (h.state.step, h.state.epoch, {a: x.alive for a, x in h.state.agents.items()})
    h.ctl.handle(MessageIn(h.conns[0], decode_agent(msg)))
    assert (h.state.step, h.state.epoch, {a: x.alive for a, x in h.state.agents.items()}) == before
    (refused,) = h.journal("message_refused")
    assert refused["msg"] == msg["type"] and refused["agent"] == h.aid(0)
    assert h.journal("handler_error") == []


def test_the_step_log_keeps_a_ranks_peak_rss_only_when_it_changed(tmp_path):
    h = Harness(tmp_path)
    h.commit_all()
    h.commit_all()
    for r in range(4):  # rank 2's peak grew (a high-water mark), the others' did not
        h.send(
            r,
            {
                "type": "vote",
                "step": h.state.step,
                "epoch": h.state.epoch,
                "rank": r,
                "loss": 1.0,
                "dt": 0.01,
                "peak_rss_mb": 5.0 if r == 2 else 1.0,
            },
        )
    assert [e["peak_rss_mb"] for e in h.state.step_log] == [{0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0}, {}, {2: 5.0}]


def test_a_notice_survives_a_checkpoint_restart_and_is_planned_once_the_ranks_are_back(tmp_path):
    """dp=1: a failure has no DP peer, so it restarts every rank even though the standby is warm. The
    maintenance notice whose switch the failure cancelled is planned again once every restarted rank
    has started (nothing else would retry it: no plan ends and no standby becomes warm)."""
    h = Harness(tmp_path, 1, 2, 1)
    h.ctl.intake.notice(notice(rank=1, reason="psu"))
    assert isinstance(h.state.plan, PlannedSwitch) and h.state.plan.ranks == [1]
    h.disconnect(0)
    h.abort_all([1])
    assert h.journal("restart") and h.state.plan is None and h.state.incarnation == 1
    (pending,) = h.state.pending_notices
    assert (pending.rank, pending.reason) == (1, "psu")
    for r in range(2):
        h.hello(f"w{r}", "worker", r, f"n{r}")
        assert h.state.plan is None  # not while the restarted ranks are still starting
        h.send(f"w{r}", {"type": "started", "rank": r, "step": 0, "groups_s": 0.01, "ckpt_load_s": 0.0})
    assert isinstance(h.state.plan, PlannedSwitch) and h.state.plan.ranks == [1] and not h.state.pending_notices
    assert h.ctl.summary.write()["pending_notices"] == []


def test_a_planned_move_the_run_ended_before_stays_a_pending_notice_in_the_summary(tmp_path):
    """The notice's planned switch was still in phase 1 when the last step committed (seen in CI: it
    began while a checkpoint restart's ranks started, and the run reached its end first): the
    summary lists no planned event and the notice as pending, with the notice's own time."""
    h = Harness(tmp_path, 2, 2, 1)
    h.ctl.intake.notice(notice(rank=1, reason="psu"))
    plan = h.state.plan
    assert isinstance(plan, PlannedSwitch) and not plan.applied
    h.ctl.plans.end_of_run()
    s = h.ctl.summary.write()
    assert [e for e in s["events"] if e["kind"] == "planned"] == []
    (pending,) = s["pending_notices"]
    assert (pending["rank"], pending["reason"], pending["time"]) == (1, "psu", plan.event["notice_t"])
    assert h.journal("event_cancelled")


class RequeueCluster(FakeCluster):
    def __init__(self) -> None:
        super().__init__()
        self.requeued: list[list[str]] = []

    def can_requeue(self) -> bool:
        return True

    def requeue(self, exclude: list[str]) -> bool:
        self.requeued.append(list(exclude))
        return True


class Nowhere(FakeSpawner):
    """Rank 2 has no node left in the job and no spare allocation to go to."""

    def spawn_worker(self, rank: int, incarnation: int) -> bool:
        super().spawn_worker(rank, incarnation)
        return rank != 2


@pytest.mark.parametrize("can_requeue", [True, False])
def test_a_restart_with_a_rank_that_has_nowhere_to_run_requeues_the_job_or_ends(tmp_path, can_requeue):
    """Found by the chaos soak: on a small cluster whose spare allocations all hold ranks already, a
    checkpoint restart ended the run. Where Slurm can requeue, the job is requeued instead (a fresh
    allocation of every node, resumed from the same checkpoint: exact); else the run ends, never hangs."""
    cluster = RequeueCluster() if can_requeue else FakeCluster()
    h = Harness(tmp_path, 2, 2, 0, cluster=lambda cfg: (Nowhere(), cluster))
    h.disconnect(2)
    h.abort_all([0, 1, 3])
    assert h.state.mode is Mode.FINISHED
    if can_requeue:
        (rq,) = h.journal("requeue")
        assert rq["kind"] == "no_node_requeue" and "no node in this job for ranks [2]" in rq["cause"]
        assert cluster.requeued == [[]] and h.state.requeued and not h.journal("run_failed")
        saved = json.loads((tmp_path / "requeue.json").read_text())
        assert saved["kind"] == "no_node_requeue" and not [e for e in saved["events"] if e.get("kind") == "restart"]
    else:
        (failed,) = h.journal("run_failed")
        assert failed["reason"] == "no node to restart ranks [2]" and not h.journal("requeue")


def test_replenish_counts_the_standbys_still_starting_not_every_one_ever_started(tmp_path):
    """A restarted controller knows only the standbys that came back, while ``standbys_started``
    also counts those that died under its predecessor: those are not 'starting', and a consumed or
    lost standby is still replaced (found by the chaos soak: after a controller restart, no standby
    was replaced again and the next failure had to restart from a checkpoint)."""
    h = Harness(tmp_path, 2, 2, 2, "standby.replenish=true")
    h.state.standbys_started += 5  # five earlier standbys died before this controller took over
    before = len(h.spawner.standbys)
    h.disconnect("s0")
    assert len(h.spawner.standbys) == before + 1 and ("standby", h.state.standbys_started - 1) in h.state.expected
    h.disconnect("s1")
    assert len(h.spawner.standbys) == before + 2  # the first replacement is starting: one more, not two


@pytest.mark.parametrize(
    "connected,since_s,restarts_again",
    [
        ([], 121.0, True),  # no rank came (every srun failed during a slurmctld outage)
        ([0, 1, 3], 121.0, True),  # rank 2's srun failed: its node went before it started
        ([0, 1, 3], 60.0, False),  # still within runtime.connect_timeout_s (120 s)
        ([0, 1, 2, 3], 121.0, False),
    ],
)
def test_restarted_ranks_that_never_connect_are_restarted_again(tmp_path, connected, since_s, restarts_again):
    """Found by the chaos soak: a restart whose rank steps failed to launch (slurmctld stopped) left the
    run with no process, no heartbeat and no vote, waiting forever."""
    h = Harness(tmp_path, 2, 2, 0)
    h.disconnect(2)
    h.abort_all([0, 1, 3])
    (first,) = h.journal("restart")
    incarnation = h.state.incarnation
    for r in connected:
        h.hello(("new", r), "worker", r, f"n{r}")
    h.state.restart_t = time.time() - since_s
    h.ctl.deadlines.tick(now=time.time())
    again = h.journal("restart")[1:]
    assert bool(again) is restarts_again and h.state.mode is Mode.RUNNING and not h.journal("run_failed")
    if restarts_again:
        missing = sorted(set(range(4)) - set(connected))
        assert f"ranks {missing} did not start within runtime.connect_timeout_s" in again[0]["cause"]
        assert h.state.incarnation == incarnation + 1 and again[0]["from_step"] == first["from_step"]
        ev = [e for e in h.ctl.ctx.events.items if e["kind"] == "restart"][-1]
        assert ev["ranks"] == missing and ev["notice_t"] == pytest.approx(time.time() - since_s, abs=5)


def test_a_standby_whose_allocation_is_gone_is_no_longer_expected_and_is_replaced(tmp_path):
    """Found by the chaos soak: a spare whose sbatch failed in a slurmctld outage stayed 'starting'
    forever, so replenish never asked for another and the pool stayed empty."""
    h = Harness(tmp_path, 2, 2, 1, "standby.replenish=true")
    h.disconnect("s0")  # consumed or lost: a replacement is asked for
    (index,) = [i for kind, i in h.state.expected if kind == "standby"]
    before = len(h.spawner.standbys)
    h.ctl.deadlines.tick(now=time.time())
    assert len(h.spawner.standbys) == before  # still starting: nothing more
    h.spawner.lost_standbys = [index, 99]  # its sbatch failed; 99 is no standby this controller expects
    h.ctl.deadlines.tick(now=time.time())
    assert ("standby", index) not in h.state.expected and len(h.spawner.standbys) == before + 1
    assert [e["standby"] for e in h.journal("standby_allocation_lost")] == [index]
    h.ctl.deadlines.tick(now=time.time())
    assert len(h.spawner.standbys) == before + 1  # handed over once


class SpareCheckCounter(FakeCluster):
    def __init__(self) -> None:
        super().__init__()
        self.checks = 0

    def check_spares(self) -> None:
        self.checks += 1


def test_a_first_commit_held_for_a_standby_whose_spare_job_died_looks_and_stops_waiting(tmp_path):
    """Found by a CI run: the only spare job died before its standby connected, nobody looked at the
    spares (that happens at committed steps), and the first commit waited runtime.connect_timeout_s,
    a 2-minute job's whole life. While it is held, the spares are looked at every SPARES_CHECK_S, and
    a standby whose allocation is gone is no longer waited for."""
    cluster = SpareCheckCounter()
    h = Harness(
        tmp_path,
        2,
        2,
        0,
        "standby.count=1",
        "standby.start_when_warm=true",
        "standby.replenish=false",
        "detect.heartbeat_timeout_s=60",  # the ticks below run ahead of the clock
        cluster=lambda cfg: (FakeSpawner(), cluster),
    )
    h.ctl.members.spawn_standby()
    (index,) = [i for kind, i in h.state.expected if kind == "standby"]
    for r in range(h.world):
        h.vote(r, rank=r)
    assert h.got(0, "decision") == [] and h.state.hold_since is not None  # held for the standby
    t0 = time.monotonic()
    h.ctl.deadlines.tick(now=time.time(), now_m=t0)
    h.ctl.deadlines.tick(now=time.time(), now_m=t0 + SPARES_CHECK_S / 2)
    assert cluster.checks == 1 and h.got(0, "decision") == []
    h.ctl.deadlines.tick(now=time.time(), now_m=t0 + SPARES_CHECK_S)
    assert cluster.checks == 2 and h.got(0, "decision") == []
    h.spawner.lost_standbys = [index]  # what the check found: its spare job ended
    h.ctl.deadlines.tick(now=time.time(), now_m=t0 + SPARES_CHECK_S + 0.1)
    assert [d["step"] for d in h.got(0, "decision")] == [0]  # not waited for any more


@pytest.mark.parametrize("standbys", [2, 1])
def test_a_drained_node_with_a_rank_and_a_standby_moves_the_rank_to_another_node(tmp_path, standbys):
    """A restart put rank 2 on the node of standby s0 (a spare's node). A drain of that node must move
    rank 2 off it: s0 is let go, never picked, and rank 2 goes to s1, or, with no other standby, to a
    checkpoint restart. (A CI chaos soak picked s0: rank 2 stayed on the drained node, and the
    successor of a killed controller saw the drain again, 74 s later, as a new notice.)"""
    h = Harness(tmp_path, 2, 2, standbys)
    h.state.agents[h.aid(2)].node = "s0"
    h.ctl.intake.notice(notice(node="s0", reason="drain", source="slurm"))
    assert [e["agent"] for e in h.journal("standby_lost")] == [h.aid("s0")] and ("standby", 0) in h.spawner.fenced
    if standbys == 2:
        plan = h.state.plan
        assert isinstance(plan, PlannedSwitch) and [(m.rank, m.joiner) for m in plan.moves] == [(2, h.aid("s1"))]
    else:
        assert h.state.plan is None and h.journal("checkpoint_then_restart")[-1]["ranks"] == [2]


def test_a_restart_event_names_the_nodes_its_ranks_ran_on(tmp_path):
    """As a switch's event does: the chaos checker ties an event to a fault by its ranks or nodes (a
    gray eviction of node n2 whose rank 2 found no standby restarted with ``node: ""``: a false alarm)."""
    h = Harness(tmp_path, 2, 2, 0)
    h.ctl.restarts.restart("no warm standby for role 'first' (rank 2)", [2], "planned", time.time())
    assert h.journal("event_open")[-1]["node"] == "n2"
    h.ctl.restarts.restart("process exit", [0, 3], "unexpected", time.time())
    assert h.journal("event_open")[-1]["node"] == "n0,n3"
