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
from tmslurm.controller.items import HelloIn, MessageIn
from tmslurm.controller.snapshot import read_steps
from tmslurm.controller.state import Mode
from tmslurm.wire.messages import Hello, Rejoin, decode_agent
from tmslurm.controller.journal import read_journal

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


def rejoin(rank: int | None, decided: int | None, voted: int | None = None, epoch: int = 0, in_plan: bool = False,
           **decision: Any) -> Rejoin:
    d = None if decided is None else {"type": "decision", "step": decided, "epoch": epoch, **decision}
    return Rejoin.model_validate({"rank": rank, "epoch": epoch, "in_plan": in_plan, "decision": d,
                                  "vote": None if voted is None else vote(rank, voted, epoch)})


class Restarted:
    def __init__(self, tmp_path, alive: list[tuple[str, int]]) -> None:
        cfg = copy.deepcopy(_config(("parallel.dp=2", "parallel.pp=2", "standby.count=1", "train.steps=50")))
        self.spawner = FakeSpawner()
        self.ctl = Controller(cfg, tmp_path, self.spawner, FakeCluster(), ADDRESS, adopt=AdoptOrder(1, time.time(), alive))
        self.channels: dict[Any, FakeChannel] = {}
        self.conns: dict[Any, int] = {}

    def hello(self, who: Any, kind: str, ident: int, rj: Rejoin | None) -> FakeChannel:
        ch = FakeChannel()
        self.conns[who] = conn = 100 + len(self.conns)
        self.channels[who] = ch
        self.ctl.handle(HelloIn(Hello(type="hello", token="t", kind=kind, id=ident, node=f"n{ident}", rejoin=rj), conn, ch))
        return ch

    def journal(self, etype: str) -> list[dict[str, Any]]:
        return [e for e in read_journal(self.ctl.ctx.rundir.events) if e["type"] == etype]


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


# (what each rank reports: last decision received, vote waiting) -> outcome
CASES = {
    "all at the same decision, two votes waiting": ({0: (2, 3), 1: (2, 3), 2: (2, None), 3: (2, None)}, "adopted", []),
    "the dead controller's last decision reached only ranks 0 and 1": ({0: (3, 4), 1: (3, None), 2: (2, 3), 3: (2, 3)},
                                                                      "adopted", [2, 3]),
    "a rank missed a decision it never voted for": ({0: (3, None), 1: (3, None), 2: (2, None), 3: (3, None)}, "refused", []),
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
        assert st.mode is Mode.FINISHED and "cannot adopt" in st.failed_reason
        assert r.journal("adoption_refused")
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
    assert ev["gap_s"] == pytest.approx(ev["before_death_s"] + ev["restart_s"] + ev["adopt_s"] + ev["first_step_s"], abs=1e-6)


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
    assert r.ctl.state.mode is Mode.FINISHED and r.journal("adoption_refused")


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
    h.ctl.handle(HelloIn(Hello(type="hello", token="t", kind="monitor", id=0, node="n9", rejoin=rejoin(None, None)),
                         98, mon))
    assert mon.closed and [e["why"] for e in h.journal("hello_refused")] == ["a rejoin, but this controller did not restart"] * 2


def _begin_planned(tmp_path, epoch: int, ranks: list[int]) -> None:
    """What the dead controller journalled when it started the planned switch."""
    from tmslurm.controller.journal import Journal

    Journal(tmp_path / "events.jsonl").write("event_begin", kind="planned", cause="psu", epoch=epoch, ranks=ranks)


@pytest.mark.parametrize("who", ["ranks and joiner prepared", "only the joiner got its join"])
def test_a_planned_switch_caught_in_phase_1_is_rolled_back_and_planned_again(tmp_path, who):
    first_incarnation(tmp_path)
    _begin_planned(tmp_path, 1, [1])
    r = Restarted(tmp_path, ALL)
    r.hello("s0", "standby", 0, Rejoin.model_validate({"rank": None, "epoch": 0, "in_plan": True, "prepared": [1],
                                                       "decision": None, "vote": None}))
    for rank in range(4):
        rj = rejoin(rank, 2).model_copy(update={"in_plan": True, "prepared": [1]}) \
            if who == "ranks and joiner prepared" and rank in (1, 3) else rejoin(rank, 2)
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


@pytest.mark.parametrize("case", ["the joiner was activated"])
def test_a_plan_past_phase_1_is_still_refused(tmp_path, case):
    """A planned switch whose joiner is receiving the state (phase 2) is neither rolled back nor redone."""
    first_incarnation(tmp_path)
    r = Restarted(tmp_path, ALL)
    joiner = {"rank": None, "epoch": 0, "in_plan": True, "prepared": [] if case == "the joiner was activated" else [1],
              "decision": None, "vote": None}
    r.hello("s0", "standby", 0, Rejoin.model_validate(joiner))
    for rank in range(4):
        rj = rejoin(rank, 2)
        if rank == 1:
            rj = rj.model_copy(update={"in_plan": True, "prepared": [1], "aborting": case == "a rank saw an abort"})
        r.hello(rank, "worker", rank, rj)
    r.ctl.adoption.tick()
    assert r.ctl.state.mode is Mode.FINISHED and r.journal("adoption_refused")[0]["why"] == "a switch or recovery was in flight"


def test_a_recovery_caught_by_the_controllers_death_is_redone_from_its_start(tmp_path):
    """Rank 2 died, the dead controller had aborted step 3 (epoch 1) and the standby was receiving
    rank 2's state: the new controller cancels that join and runs the recovery again, epoch 2."""
    first_incarnation(tmp_path)
    alive = [k for k in ALL if k != ("worker", 2)]
    r = Restarted(tmp_path, alive)
    r.hello("s0", "standby", 0, Rejoin.model_validate({"rank": None, "epoch": 1, "in_plan": True, "prepared": [],
                                                       "decision": None, "vote": None}))
    for rank in (0, 1, 3):
        r.hello(rank, "worker", rank, rejoin(rank, 2).model_copy(update={"in_plan": True, "aborting": rank != 3}))
    r.ctl.adoption.tick()
    st = r.ctl.state
    assert not r.journal("adoption_refused") and r.journal("adopted")[0]["resumed_recovery"] is True
    assert {"type": "cancel", "epoch": 1} in r.channels["s0"].sent
    (abort,) = r.journal("abort")
    assert abort["dead"] == [2] and abort["epoch"] == 2 and abort["step"] == 3
    assert st.mode is Mode.RECOVERING and st.step == 3
    for rank in (0, 1, 3):
        assert {"type": "abort", "epoch": 2, "step": 3} in r.channels[rank].sent


def test_a_recovery_is_not_redone_over_decisions_that_differ(tmp_path):
    first_incarnation(tmp_path)
    r = Restarted(tmp_path, ALL)
    r.hello("s0", "standby", 0, rejoin(None, None))
    for rank in range(4):
        r.hello(rank, "worker", rank, rejoin(rank, 2 if rank else 1).model_copy(update={"in_plan": True, "aborting": True}))
    r.ctl.adoption.tick()
    assert r.ctl.state.mode is Mode.FINISHED and "decisions differ" in r.journal("adoption_refused")[0]["why"]


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
    assert r.ctl.state.mode is Mode.RUNNING and r.ctl.state.step == 3 and r.journal("adopted")[0]["resent_decision"] == []
