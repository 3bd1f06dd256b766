"""A restarted controller re-adopts the live agents, or refuses: driven with fake channels, no process.

The first incarnation commits a few steps (its snapshot and step log on disk); a second controller
is built on the same run directory with an ``AdoptOrder`` and the agents say hello with a
``rejoin``. Table-driven over what the ranks report.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest

from tests.unit.controller_harness import ADDRESS, FakeChannel, FakeCluster, FakeSpawner, Harness, _config
from tmslurm.controller import Controller
from tmslurm.controller.adoption import AdoptOrder
from tmslurm.controller.items import Disconnected, HelloIn, MessageIn
from tmslurm.controller.journal import read_journal
from tmslurm.controller.snapshot import read_steps
from tmslurm.controller.state import Mode
from tmslurm.wire.messages import Hello, Rejoin, decode_agent

COMMITTED = 3  # steps 0..2 decided and logged by the first incarnation


def first_incarnation(tmp_path) -> Harness:
    h = Harness(tmp_path, 2, 2, 1)
    for _ in range(COMMITTED):
        h.commit_all()
    h.state.incarnation = 2  # two checkpoint restarts before the controller died
    h.ctl._offer_snapshot()
    h.ctl.snapshots.close()
    return h


def vote(rank: int, step: int, epoch: int = 0) -> dict[str, Any]:
    return {"type": "vote", "step": step, "epoch": epoch, "rank": rank, "loss": 1.0, "dt": 0.01, "peak_rss_mb": 1.0}


def rejoin(
    rank: int | None,
    decided: int | None,
    voted: int | None = None,
    epoch: int = 0,
    in_plan: bool = False,
    **decision: Any,
) -> Rejoin:
    d = None if decided is None else {"type": "decision", "step": decided, "epoch": epoch, **decision}
    return Rejoin.model_validate(
        {
            "rank": rank,
            "epoch": epoch,
            "in_plan": in_plan,
            "decision": d,
            "vote": None if voted is None else vote(rank, voted, epoch),
        }
    )


class Restarted:
    def __init__(self, tmp_path, alive: list[tuple[str, int]]) -> None:
        cfg = copy.deepcopy(_config(("parallel.dp=2", "parallel.pp=2", "standby.count=1", "train.steps=50")))
        self.spawner = FakeSpawner()
        self.ctl = Controller(
            cfg, tmp_path, self.spawner, FakeCluster(), ADDRESS, adopt=AdoptOrder(1, time.time(), alive)
        )
        self.channels: dict[Any, FakeChannel] = {}
        self.conns: dict[Any, int] = {}

    def hello(self, who: Any, kind: str, ident: int, rj: Rejoin | None) -> FakeChannel:
        ch = FakeChannel()
        self.conns[who] = conn = 100 + len(self.conns)
        self.channels[who] = ch
        self.ctl.handle(
            HelloIn(Hello(type="hello", token="t", kind=kind, id=ident, node=f"n{ident}", rejoin=rj), conn, ch)
        )
        return ch

    def journal(self, etype: str) -> list[dict[str, Any]]:
        return [e for e in read_journal(self.ctl.ctx.rundir.events) if e["type"] == etype]


def restarted_after_refusal(r: Restarted, why: str | None = None) -> bool:
    """Refused, and instead of ending, every rank restarts from the latest complete checkpoint (none
    here: step 0) in the same job: the workers that came back are fenced, four new ones are spawned,
    the journal says why, and the restart is one job-wide event that redoes the committed steps."""
    st = r.ctl.state
    (refused,) = r.journal("adoption_refused")
    (restart,) = r.journal("restart")
    came_back = {("worker", int(k)) for k in r.channels if isinstance(k, int)}
    ev = r.ctl.ctx.events.items[-1]
    return (
        refused["fallback"] == "checkpoint_restart"
        and (why is None or why in refused["why"])
        and st.mode is Mode.RUNNING
        and st.failed_reason is None
        and st.step == 0
        and restart["from_step"] == 0
        and restart["lost_steps"] == COMMITTED
        and came_back <= set(r.spawner.fenced)
        and sorted(r.spawner.workers)[-4:] == [(k, st.incarnation) for k in range(4)]
        and ev["ranks"] == []
        and ev["from_checkpoint_step"] == 0
        and "could not adopt" in ev["cause"]
    )


ALL = [("standby", 0), ("worker", 0), ("worker", 1), ("worker", 2), ("worker", 3)]


def test_restore_takes_back_the_step_log_and_waits_for_every_live_process(tmp_path):
    first_incarnation(tmp_path)
    assert [e["step"] for e in read_steps(tmp_path / "steps.jsonl")] == [0, 1, 2]
    r = Restarted(tmp_path, ALL)
    assert r.ctl.state.mode is Mode.ADOPTING and r.ctl.state.step == COMMITTED
    assert r.ctl.state.incarnation == 2  # a later restart names its processes after the ones before
    assert r.spawner.workers == [] and r.spawner.standbys == []  # it spawns nothing
    for rank in range(3):
        r.hello(rank, "worker", rank, rejoin(rank, COMMITTED - 1))
    r.ctl.adoption.tick()
    assert r.ctl.state.mode is Mode.ADOPTING  # worker 3 and the standby are still expected
    # a rejoin is no start-up: its silence gets heartbeat_timeout_s (tests/unit/test_startup_silence.py)
    assert not any(a.starting for a in r.ctl.state.agents.values())


def test_a_fault_fired_after_the_last_snapshot_is_not_handed_out_again(tmp_path):
    """The snapshot is written after a commit; a worker's fault that fired mid-step after it is known
    only from the journal. The restarted controller must count it as fired, or a restarted rank gets
    it again in its welcome and dies a second time (seen in CI: a kill -9 of the controller right
    after a checkpoint restart caused by the fault)."""
    h = first_incarnation(tmp_path)
    h.ctl.ctx.journal.write("fault", index=0, rank=2, step=COMMITTED, kind="kill")
    h.ctl.ctx.journal.write("fault_firing", index=1, kind="power_off", rank=None, ranks=[3])
    r = Restarted(tmp_path, ALL)
    assert r.ctl.state.fired == {0, 1}


def test_a_restart_after_the_last_snapshot_keeps_its_incarnation(tmp_path):
    """Processes are named after their incarnation (a Slurm step is fenced by that name): a restarted
    controller that took an older number from the snapshot would start ``rank2.3`` while the fence
    of the previous ``rank2.3`` is still on its way."""
    h = first_incarnation(tmp_path)  # incarnation 2 in the snapshot
    h.ctl.ctx.journal.write("restart", epoch=5, cause="process exit", from_step=0, lost_steps=3, incarnation=3)
    r = Restarted(tmp_path, ALL)
    assert r.ctl.state.incarnation == 3


def test_a_restart_still_open_when_the_controller_died_is_taken_back_and_completes(tmp_path):
    """Seen in the hour-long soak: a restart, then a requeue, then a kill -9 of the controller before the
    first commit; both events were only in the dead controller's memory and vanished from the summary."""
    h = first_incarnation(tmp_path)
    h.ctl.restarts.restart("process exit", [2], "unexpected", time.time())
    (held,) = [e for e in h.ctl.ctx.events.items if e["kind"] == "restart"]
    r = Restarted(tmp_path, ALL)
    (back,) = [e for e in r.ctl.ctx.events.items if e["kind"] == "restart"]
    assert back["eid"] == held["eid"] and back["status"] == "switched" and back["target_step"] == COMMITTED
    r.ctl.ctx.events.on_commit(COMMITTED, time.time(), 0.01)
    assert back["status"] == "done" and back["gap_s"] > 0


def _open(eid: str, **extra: Any) -> dict[str, Any]:
    return {"type": "event_open", "eid": eid, "kind": "restart", "status": "switched", "target_step": 9, **extra}


# journal -> eids of the events a restarted controller holds
RESTORED = {
    "open": ([_open("a")], ["a"]),
    "completed": ([_open("a"), {**_open("a"), "type": "event", "status": "done"}], ["a"]),
    "dropped (its restart could not start the ranks)": ([_open("a"), {"type": "event_dropped", "eid": "a"}], []),
    "held by the job before a requeue, not carried over": ([_open("a"), {"type": "resumed_after_lost_controller"}], []),
    "carried over by the requeue and held again": ([_open("a"), {"type": "resumed_after_requeue"}, _open("a")], ["a"]),
}


@pytest.mark.parametrize("case", list(RESTORED))
def test_restored_events_are_the_completed_and_the_still_open_of_this_job(case):
    from tmslurm.controller.events import EventLog

    journal, eids = RESTORED[case]
    log = EventLog(journal=None)  # type: ignore[arg-type]  (restore writes nothing)
    log.restore(journal, None)
    assert [e["eid"] for e in log.items] == eids


# (what each rank reports: last decision received, vote waiting) -> outcome
CASES = {
    "all at the same decision, two votes waiting": ({0: (2, 3), 1: (2, 3), 2: (2, None), 3: (2, None)}, "adopted", []),
    "the dead controller's last decision reached only ranks 0 and 1": (
        {0: (3, 4), 1: (3, None), 2: (2, 3), 3: (2, 3)},
        "adopted",
        [2, 3],
    ),
    "a rank missed a decision it never voted for": (
        {0: (3, None), 1: (3, None), 2: (2, None), 3: (3, None)},
        "refused",
        [],
    ),
    "decisions two steps apart": ({0: (4, None), 1: (2, 3), 2: (3, None), 3: (3, None)}, "refused", []),
}


@pytest.mark.parametrize("case", list(CASES))
def test_adoption_decides_from_what_the_ranks_received(tmp_path, case):
    reports, outcome, resent = CASES[case]
    first_incarnation(tmp_path)
    r = Restarted(tmp_path, ALL)
    r.hello("s0", "standby", 0, rejoin(None, None))
    for rank, (decided, voted) in reports.items():
        r.hello(rank, "worker", rank, rejoin(rank, decided, voted))
    r.ctl.adoption.tick()
    st = r.ctl.state
    if outcome == "refused":
        assert restarted_after_refusal(r)
        return
    last = max(d for d, _ in reports.values())
    adopted = r.journal("adopted")[0]
    assert adopted["resent_decision"] == resent
    for rank in range(4):
        decisions = [m for m in r.channels[rank].sent if m["type"] == "decision"]
        assert [m["step"] for m in decisions] == ([last] if rank in resent else [])
    assert st.step == last + 1 and st.mode is Mode.RUNNING
    assert sorted(st.votes) == sorted(k for k, (_, v) in reports.items() if v == last + 1)
    assert [e["step"] for e in st.step_log] == list(range(last + 1))  # a decided step never logged is restored
    for rank in range(4):  # one held by a recovery whose resume died with the controller goes on
        assert [m for m in r.channels[rank].sent if m["type"] == "resume"] == [{"type": "resume", "epoch": st.epoch}]


def test_votes_sent_while_adopting_count_and_the_step_commits(tmp_path):
    first_incarnation(tmp_path)
    r = Restarted(tmp_path, ALL)
    r.hello("s0", "standby", 0, rejoin(None, None))
    for rank in range(4):
        r.hello(rank, "worker", rank, rejoin(rank, 2, 3 if rank < 2 else None))
    for rank in (2,):  # computed during the outage, voted after its rejoin, before the adoption decided
        r.ctl.handle(MessageIn(r.conns[rank], decode_agent(vote(rank, 3))))
    r.ctl.adoption.tick()
    assert sorted(r.ctl.state.votes) == [0, 1, 2]
    r.ctl.handle(MessageIn(r.conns[3], decode_agent(vote(3, 3))))
    assert r.ctl.state.step == 4  # committed
    assert [m["step"] for m in r.channels[0].sent if m["type"] == "decision"] == [3]
    ev = [e for e in r.ctl.ctx.events.items if e["kind"] == "controller_restart"][0]
    assert ev["status"] == "done"
    assert ev["gap_s"] == pytest.approx(
        ev["before_death_s"] + ev["restart_s"] + ev["adopt_s"] + ev["first_step_s"], abs=1e-6
    )


@pytest.mark.parametrize("bad", ["in_plan", "epochs", "switch", "fresh_worker"])
def test_adoption_refuses_what_it_cannot_know(tmp_path, bad):
    first_incarnation(tmp_path)
    r = Restarted(tmp_path, ALL)
    r.hello("s0", "standby", 0, rejoin(None, None, in_plan=bad == "in_plan"))
    for rank in range(4):
        if bad == "fresh_worker" and rank == 3:
            r.hello(rank, "worker", rank, None)
            continue
        kw: dict[str, Any] = {}
        if bad == "switch" and rank == 0:
            kw["switch"] = {"epoch": 1, "moves": [{"rank": 0, "joiner": "standby0.1#1"}]}
        r.hello(rank, "worker", rank, rejoin(rank, 2, epoch=1 if bad == "epochs" and rank == 1 else 0, **kw))
    r.ctl.adoption.tick()
    assert restarted_after_refusal(r)


def test_with_nobody_alive_the_successor_restarts_every_rank_from_the_checkpoint(tmp_path):
    """The controller died while none of its processes ran (a checkpoint restart whose ranks were not up
    yet): the supervisor still starts a successor, which waits for nobody and restarts in the same job."""
    first_incarnation(tmp_path)
    r = Restarted(tmp_path, [])
    assert r.ctl.state.expected == set()
    r.ctl.adoption.tick()
    assert restarted_after_refusal(r, "no rank came back")
    assert r.ctl.state.epoch > 0 and r.ctl.state.incarnation > 2  # nothing reused from the dead incarnation


def test_a_process_that_never_rejoins_is_fenced_and_its_rank_recovered(tmp_path, monkeypatch):
    first_incarnation(tmp_path)
    r = Restarted(tmp_path, ALL)
    monkeypatch.setattr(r.ctl.ctx.cfg.runtime, "controller_lost_s", 0.0)  # the rejoin window is over at once
    r.hello("s0", "standby", 0, rejoin(None, None))
    for rank in range(3):
        r.hello(rank, "worker", rank, rejoin(rank, 2))
    r.ctl.adoption.tick()
    assert ("worker", 3) in r.spawner.fenced
    assert r.ctl.state.mode is Mode.RECOVERING and r.journal("adopted")[0]["missing"] == ["worker3"]
    assert r.ctl.state.epoch > 0  # the recovery runs under a new epoch, above every one seen


def test_a_rejoin_cannot_take_another_ranks_slot(tmp_path):
    first_incarnation(tmp_path)
    r = Restarted(tmp_path, ALL)
    r.hello(0, "worker", 0, rejoin(0, 2))
    ch = r.hello("impostor", "worker", 1, rejoin(0, 2))  # worker 1 claiming rank 0
    assert ch.closed and ch.sent[-1]["type"] == "error"
    assert r.ctl.state.slots[0].startswith("worker0.")


def test_a_controller_that_did_not_restart_refuses_every_rejoin(tmp_path):
    """A fenced process whose connection the controller closed reconnects: it must not take the
    slot its replacement was spawned for (the replacement's fresh hello is what is expected)."""
    h = Harness(tmp_path, 2, 2, 1)
    h.ctl.members.spawn_worker(3, 1)  # a restart spawned a new rank 3; the old process reconnects first
    ch = FakeChannel()
    h.ctl.handle(HelloIn(Hello(type="hello", token="t", kind="worker", id=3, node="n3", rejoin=rejoin(3, 2)), 99, ch))
    assert ch.closed and "did not restart" in ch.sent[-1]["error"]
    assert ("worker", 3) in h.state.expected  # still waiting for the new process
    mon = FakeChannel()
    h.ctl.handle(
        HelloIn(Hello(type="hello", token="t", kind="monitor", id=0, node="n9", rejoin=rejoin(None, None)), 98, mon)
    )
    assert (
        mon.closed
        and [e["why"] for e in h.journal("hello_refused")] == ["a rejoin, but this controller did not restart"] * 2
    )


def _begin_planned(tmp_path, epoch: int, ranks: list[int]) -> None:
    """What the dead controller journalled when it started the planned switch."""
    from tmslurm.controller.journal import Journal

    Journal(tmp_path / "events.jsonl").write("event_begin", kind="planned", cause="psu", epoch=epoch, ranks=ranks)


@pytest.mark.parametrize("who", ["ranks and joiner prepared", "only the joiner got its join"])
def test_a_planned_switch_caught_in_phase_1_is_rolled_back_and_planned_again(tmp_path, who):
    first_incarnation(tmp_path)
    _begin_planned(tmp_path, 1, [1])
    r = Restarted(tmp_path, ALL)
    r.hello(
        "s0",
        "standby",
        0,
        Rejoin.model_validate(
            {"rank": None, "epoch": 0, "in_plan": True, "prepared": [1], "decision": None, "vote": None}
        ),
    )
    for rank in range(4):
        rj = (
            rejoin(rank, 2).model_copy(update={"in_plan": True, "prepared": [1]})
            if who == "ranks and joiner prepared" and rank in (1, 3)
            else rejoin(rank, 2)
        )
        r.hello(rank, "worker", rank, rj)
    r.ctl.adoption.tick()
    st = r.ctl.state
    assert st.mode is Mode.RUNNING and not r.journal("adoption_refused")
    (rb,) = r.journal("plan_rolled_back")
    assert rb["epochs"] == [1] and rb["noticed_again"] == [1]
    for who_ in ("s0", 0, 1, 2, 3):
        assert {"type": "cancel", "epoch": 1} in r.channels[who_].sent
    (again,) = st.pending_notices
    assert (again.kind, again.rank, again.reason) == ("maintenance", 1, "psu") and st.retry_notices


# ---- a planned switch past phase 1: its decision (step 3, epoch 1: rank 1 -> standby 0) went out --------------
JOINER = "standby0.0#7"  # the standby's agent id under the dead controller: same process, another connection
SWITCH = {"epoch": 1, "moves": [{"rank": 1, "joiner": JOINER}]}
PREPARED = (0, 1, 3)  # the ranks of the groups rank 1's move rebuilds (dp/stage1, pp/replica0/0-1)


def rank_report(rank: int, how: str, **decision: Any) -> Rejoin:
    """One rank's rejoin: ``applied`` (got the switch's decision and applied it), ``pending`` (got it,
    not applied yet), ``leaving`` (the leaver: got it, handing over), ``missed`` (voted step 3, got
    nothing since step 2), ``bare`` (missed it and prepared nothing)."""
    got = {"type": "decision", "step": 3, "epoch": 1, "switch": SWITCH, **decision}
    prep = [1] if rank in PREPARED and how in ("pending", "missed") else []
    if how == "missed" or how == "bare":
        return rejoin(rank, 2, 3).model_copy(update={"in_plan": bool(prep), "prepared": prep, "step": 3})
    epoch, step = (1, 4) if how == "applied" else (0, 4 if how == "leaving" else 3)
    return Rejoin.model_validate(
        {
            "rank": rank,
            "epoch": epoch,
            "decision": got,
            "vote": None,
            "in_plan": bool(prep),
            "prepared": prep,
            "step": step,
        }
    )


def joiner_report(how: str, epoch: int = 1) -> Rejoin:
    """``prepared`` (phase 1 done, never activated), ``activated`` (receiving the state), ``joined`` (rank 1)."""
    if how == "joined":
        return Rejoin.model_validate(
            {"rank": 1, "epoch": epoch, "decision": None, "vote": None, "in_plan": False, "step": 4}
        )
    return Rejoin.model_validate(
        {
            "rank": None,
            "epoch": epoch,
            "decision": None,
            "vote": None,
            "in_plan": True,
            "prepared": [epoch] if how == "prepared" else [],
        }
    )


def joined_msg() -> dict[str, Any]:
    return {
        "type": "joined",
        "epoch": 1,
        "rank": 1,
        "joiner": 0,
        "step": 4,
        "transfer_s": 0.1,
        "phase1_s": 0.2,
        "bytes": 10,
        "rss_mb": 1.0,
    }


def switch_caught(tmp_path, ranks: dict[int, str], joiner: str | None, **decision: Any) -> Restarted:
    """The dead controller committed step 3 with the switch; the live processes rejoin as reported."""
    first_incarnation(tmp_path)
    _begin_planned(tmp_path, 1, [1])
    alive = [("worker", r) for r in sorted(ranks)] + ([("standby", 0)] if joiner else [])
    r = Restarted(tmp_path, alive)
    if joiner is not None:
        r.hello("s0", "standby", 0, joiner_report("activated" if joiner == "joins while adopting" else joiner))
    for rank, how in sorted(ranks.items()):
        r.hello(rank, "worker", rank, rank_report(rank, how, **decision))
    if joiner == "joins while adopting":
        r.ctl.handle(MessageIn(r.conns["s0"], decode_agent(joined_msg())))
        r.ctl.handle(MessageIn(r.conns["s0"], decode_agent(vote(1, 4, epoch=1))))
    return r


# (each rank's report, the joiner's) -> (ranks sent the decision again, joiner sent its activate)
COMPLETED = {
    "every rank got it, the joiner awaits its activate": (
        {0: "applied", 1: "leaving", 2: "applied", 3: "applied"},
        "prepared",
        [],
        True,
    ),
    "ranks 0 and 1 got it, the joiner was activated": (
        {0: "applied", 1: "leaving", 2: "missed", 3: "missed"},
        "activated",
        [2, 3],
        False,
    ),
    "only the leaver got it": ({0: "missed", 1: "leaving", 2: "missed", 3: "missed"}, "prepared", [0, 2, 3], True),
    "the leaver missed it": ({0: "applied", 1: "missed", 2: "applied", 3: "pending"}, "prepared", [1], True),
    "the joiner had joined, the leaver exited": ({0: "applied", 2: "applied", 3: "applied"}, "joined", [], False),
    "the joiner joined while the controller adopted": (
        {0: "applied", 1: "leaving", 2: "applied", 3: "pending"},
        "joins while adopting",
        [],
        False,
    ),
}


@pytest.mark.parametrize("case", list(COMPLETED))
def test_a_planned_switch_whose_decision_went_out_is_completed(tmp_path, case):
    ranks, joiner, resent, activated = COMPLETED[case]
    r = switch_caught(tmp_path, ranks, joiner)
    r.ctl.adoption.tick()
    st = r.ctl.state
    assert not r.journal("adoption_refused") and not r.journal("abort")
    (adopted,) = r.journal("adopted")
    assert adopted["completed_switch"] == 1 and adopted["resent_decision"] == resent
    assert adopted["activated"] == ([1] if activated else [])
    for rank in ranks:
        decisions = [m for m in r.channels[rank].sent if m["type"] == "decision"]
        assert decisions == (
            [
                {
                    "type": "decision",
                    "step": 3,
                    "decision": "commit",
                    "epoch": 1,
                    "switch": SWITCH,
                    "checkpoint": False,
                    "final": False,
                }
            ]
            if rank in resent
            else []
        )
    assert ({"type": "activate", "epoch": 1} in r.channels["s0"].sent) is activated
    assert st.mode is Mode.RUNNING and st.step == 4 and st.epoch == 1
    # the rest goes as after any phase 2: the leaver leaves, the joiner joins, step 4 commits with it
    joiner_aid = r.ctl.state.conn_agent[r.conns["s0"]]
    if 1 in ranks:
        leaver = st.agents[st.conn_agent[r.conns[1]]]
        assert st.owns_slot(leaver, 1) is (ranks[1] == "missed")  # only a leaver that must apply it still serves it
        assert leaver.expected_exit is (ranks[1] != "missed") and leaver.rank == 1
        leave = {"type": "left", "rank": 1, "step": 4, "transfer_s": 0.1, "phase2_s": 0.01, "bytes": 10}
        r.ctl.handle(MessageIn(r.conns[1], decode_agent(leave)))
        r.ctl.handle(Disconnected(r.conns[1]))  # it exits
        assert [e["rank"] for e in r.journal("left")] == [1] and not r.journal("standby_lost")
    if joiner in ("prepared", "activated"):
        assert st.plan is not None and st.plan.waiting >= {joiner_aid}
        r.ctl.handle(MessageIn(r.conns["s0"], decode_agent(joined_msg())))
    assert st.plan is None and st.slots[1] == joiner_aid  # the switch is finished
    for rank in (0, 2, 3):
        r.ctl.handle(MessageIn(r.conns[rank], decode_agent(vote(rank, 4, epoch=1))))
    r.ctl.handle(MessageIn(r.conns["s0"], decode_agent(vote(1, 4, epoch=1))))
    assert st.step == 5
    (planned,) = [e for e in r.ctl.ctx.events.items if e["kind"] == "planned"]
    assert planned["status"] == "done" and planned["epoch"] == 1 and planned["completed_by_incarnation"] == 1
    assert planned["cause"] == "psu" and planned["target_step"] == 4


# what makes a switch past phase 1 impossible to complete -> the reason journalled
REFUSED = {
    "the joiner did not come back": (
        dict(ranks={0: "applied", 1: "leaving", 2: "applied", 3: "applied"}, joiner=None),
        "did not come back",
    ),
    "a rank that missed it prepared nothing": (
        dict(ranks={0: "applied", 1: "leaving", 2: "applied", 3: "bare"}, joiner="prepared"),
        "holds no groups prepared for epoch 1",
    ),
    "the decision also carried a checkpoint": (
        dict(ranks={0: "applied", 1: "leaving", 2: "applied", 3: "applied"}, joiner="prepared", checkpoint=True),
        "also carried a checkpoint",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_switch_past_phase_1_that_cannot_be_completed_is_refused(tmp_path, case):
    kw, why = REFUSED[case]
    r = switch_caught(tmp_path, **kw)
    r.ctl.adoption.tick()
    assert restarted_after_refusal(r, why)


def test_a_joiner_in_another_epoch_is_not_taken_for_the_switchs(tmp_path):
    first_incarnation(tmp_path)
    r = Restarted(tmp_path, ALL)
    r.hello("s0", "standby", 0, joiner_report("activated", epoch=2))
    for rank, how in {0: "applied", 1: "leaving", 2: "applied", 3: "applied"}.items():
        r.hello(rank, "worker", rank, rank_report(rank, how))
    r.ctl.adoption.tick()
    assert restarted_after_refusal(r, "is not joining the switch of epoch 1")


def test_an_activated_joiner_with_no_decision_anywhere_is_still_refused(tmp_path):
    """A joiner receiving the state while no rank holds the decision that carried the switch: the
    activate could only follow that decision, so nothing here is explained; nothing is guessed."""
    first_incarnation(tmp_path)
    r = Restarted(tmp_path, ALL)
    r.hello("s0", "standby", 0, joiner_report("activated"))
    for rank in range(4):
        rj = rejoin(rank, 2)
        if rank == 1:
            rj = rj.model_copy(update={"in_plan": True, "prepared": [1]})
        r.hello(rank, "worker", rank, rj)
    r.ctl.adoption.tick()
    assert restarted_after_refusal(r, "a switch or recovery was in flight")


def _restarted_in_recovery(tmp_path, aborting: tuple[int, ...]) -> Restarted:
    """Rank 2 died; the dead controller had aborted step 3 (epoch 1) and standby s0 was receiving rank
    2's state. The ranks in ``aborting`` saw that abort."""
    first_incarnation(tmp_path)
    r = Restarted(tmp_path, [k for k in ALL if k != ("worker", 2)])
    r.hello(
        "s0",
        "standby",
        0,
        Rejoin.model_validate(
            {"rank": None, "epoch": 1, "in_plan": True, "prepared": [], "decision": None, "vote": None}
        ),
    )
    for rank in (0, 1, 3):
        r.hello(
            rank, "worker", rank, rejoin(rank, 2).model_copy(update={"in_plan": True, "aborting": rank in aborting})
        )
    return r


def test_a_recovery_caught_by_the_controllers_death_is_redone_from_its_start(tmp_path):
    """Rank 2 died, the dead controller had aborted step 3 (epoch 1) and the standby was receiving
    rank 2's state: the new controller cancels that join and runs the recovery again, epoch 2."""
    r = _restarted_in_recovery(tmp_path, aborting=(0, 1))
    r.ctl.adoption.tick()
    st = r.ctl.state
    assert not r.journal("adoption_refused") and r.journal("adopted")[0]["resumed_recovery"] is True
    assert {"type": "cancel", "epoch": 1} in r.channels["s0"].sent
    (abort,) = r.journal("abort")
    assert abort["dead"] == [2] and abort["epoch"] == 2 and abort["step"] == 3
    assert st.mode is Mode.RECOVERING and st.step == 3
    for rank in (0, 1, 3):
        assert {"type": "abort", "epoch": 2, "step": 3} in r.channels[rank].sent


def test_a_recovery_of_ranks_that_got_no_decision_yet_is_redone_at_the_step_they_compute(tmp_path):
    """Every live rank was started (or joined) since the last decision: none holds one, each computes
    step 3 when the dead controller aborted it. The recovery is redone at step 3, not at the run's
    start step (which would commit steps 0..2 again: a step logged twice with no restart to say so)."""
    first_incarnation(tmp_path)
    r = Restarted(tmp_path, [k for k in ALL if k != ("worker", 2)])
    r.hello("s0", "standby", 0, rejoin(None, None))
    for rank in (0, 1, 3):
        r.hello(
            rank,
            "worker",
            rank,
            rejoin(rank, None, epoch=1).model_copy(update={"step": 3, "in_plan": True, "aborting": True}),
        )
    r.ctl.adoption.tick()
    (abort,) = r.journal("abort")
    assert r.journal("adopted")[0]["resumed_recovery"] is True and abort["step"] == 3 and abort["dead"] == [2]
    assert r.ctl.state.step == 3


def test_a_recovery_join_that_finishes_while_adopting_is_ignored_as_before(tmp_path):
    """Only a committed switch's joiner takes its slot from a ``joined`` sent while adopting; a
    recovery's joiner does not: the recovery is redone with its rank dead."""
    r = _restarted_in_recovery(tmp_path, aborting=(0, 1, 3))
    r.ctl.handle(MessageIn(r.conns["s0"], decode_agent({**joined_msg(), "rank": 2, "step": 3})))
    r.ctl.handle(MessageIn(r.conns["s0"], decode_agent(vote(2, 3, epoch=1))))
    assert r.ctl.state.slots[2] == r.ctl.state.conn_agent[r.conns["s0"]]  # meanwhile its votes are kept
    r.ctl.adoption.tick()
    (abort,) = r.journal("abort")
    assert abort["dead"] == [2] and r.journal("adopted")[0]["resumed_recovery"] is True
    assert r.ctl.state.agents[r.ctl.state.conn_agent[r.conns["s0"]]].rank is None


def test_a_recovery_is_not_redone_over_decisions_that_differ(tmp_path):
    first_incarnation(tmp_path)
    r = Restarted(tmp_path, ALL)
    r.hello("s0", "standby", 0, rejoin(None, None))
    for rank in range(4):
        r.hello(
            rank, "worker", rank, rejoin(rank, 2 if rank else 1).model_copy(update={"in_plan": True, "aborting": True})
        )
    r.ctl.adoption.tick()
    assert restarted_after_refusal(r, "decisions differ")


def test_a_recovery_is_not_redone_when_a_rank_with_no_decision_computes_another_step(tmp_path):
    first_incarnation(tmp_path)
    r = Restarted(tmp_path, ALL)
    r.hello("s0", "standby", 0, rejoin(None, None))
    for rank in range(4):
        rj = rejoin(rank, None if rank == 3 else 2).model_copy(update={"step": 5 if rank == 3 else 3})
        r.hello(rank, "worker", rank, rj.model_copy(update={"in_plan": True, "aborting": True}))
    r.ctl.adoption.tick()
    assert restarted_after_refusal(r, "decisions differ: [2, 4]")


def test_a_standby_that_joined_and_got_no_decision_yet_is_placed_by_its_step(tmp_path):
    """The controller died after a recovery, before the redone step committed: the joiner of rank 2
    (epoch 1) has no decision; it computes step 3 like the others, so the run is adopted."""
    first_incarnation(tmp_path)
    r = Restarted(tmp_path, ALL)
    r.hello("s0", "standby", 0, rejoin(None, None))
    for rank in range(4):
        rj = rejoin(rank, None if rank == 2 else 2, epoch=1).model_copy(update={"step": 3})
        r.hello(rank, "worker", rank, rj)
    r.ctl.adoption.tick()
    assert (
        r.ctl.state.mode is Mode.RUNNING and r.ctl.state.step == 3 and r.journal("adopted")[0]["resent_decision"] == []
    )


def test_a_listed_process_the_dead_controller_found_lost_is_not_waited_for(tmp_path):
    """The supervisor lists worker 1 as alive (a powered-off node's srun lingers), but the dead
    controller's journal found its node lost after it came up, and standby 0 took rank 1: the
    adoption does not wait runtime.controller_lost_s for it (found by the chaos soak: 15 s of
    downtime per controller restart). A worker 2 lost and then restarted is still waited for."""
    h = first_incarnation(tmp_path)
    h.ctl.ctx.journal.write("node_lost", node="n1", agents=["worker1.4242#2"])
    h.ctl.ctx.journal.write("fenced", agent="worker2.4242#3", rank=2)
    h.ctl.ctx.journal.write("agent_up", agent="worker2.5151#9", node="n2", pid=5151)
    r = Restarted(tmp_path, ALL)
    assert r.ctl.state.expected == {("standby", 0), ("worker", 0), ("worker", 2), ("worker", 3)}


def test_standbys_whose_spare_job_is_still_queued_stay_expected_after_the_adoption(tmp_path):
    """Standbys 5 and 6 were asked for by the dead controller; their spare jobs are still queued
    (no process yet, so the supervisor does not list them). The new controller keeps expecting them:
    their hello is accepted when their jobs start (found by the chaos soak: refused, 'no standby 6
    is expected', their jobs ended, and the next restart found no spare allocation)."""
    first_incarnation(tmp_path)
    r = Restarted(tmp_path, ALL)
    r.ctl.ctx.spawner.pending = [0, 5, 6]  # standby 0 is connected: not expected twice
    r.hello("s0", "standby", 0, rejoin(None, None))
    for rank in range(4):
        r.hello(rank, "worker", rank, rejoin(rank, COMMITTED - 1))
    r.ctl.adoption.tick()
    assert r.journal("adopted") and r.ctl.state.expected == {("standby", 5), ("standby", 6)}
    ch = r.hello("s6", "standby", 6, None)
    assert not any(m.get("type") == "error" for m in ch.sent), ch.sent
