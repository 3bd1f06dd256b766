"""One injected fault that hits several ranks at one instant, and the lab's slow faults, in the
controller's state machine (fake channels, fake cluster): who is told, what is journalled, and
which ranks' detection is timed from the fault."""

from __future__ import annotations

import queue

from tests.unit.controller_harness import Harness
from tmslurm.controller.items import FaultAt, NoticeIn
from tmslurm.wire.messages import FaultSpec


def _queued(h: Harness) -> list:
    items = []
    while True:
        try:
            items.append(h.ctl.ctx.queue.get_nowait())
        except queue.Empty:
            return items


def test_each_rank_of_a_multi_rank_kill_gets_the_fault_in_its_welcome(tmp_path):
    h = Harness(tmp_path, 2, 2, 1, "faults=[{step:3,kind:kill,ranks:[0,3]},{step:4,kind:stop,rank:1}]")
    faults = {r: h.got(r, "welcome")[0]["faults"] for r in range(4)}
    assert [f["index"] for f in faults[0]] == [0] and faults[0][0]["ranks"] == [0, 3]
    assert [f["index"] for f in faults[3]] == [0]
    assert [f["index"] for f in faults[1]] == [1] and faults[1][0]["ranks"] == [1]
    assert faults[2] == []
    # the first report marks it fired; the second rank's own report of the same fault is journalled too
    h.send(0, {"type": "fault", "index": 0, "rank": 0, "step": 3, "kind": "kill"})
    h.send(3, {"type": "fault", "index": 0, "rank": 3, "step": 3, "kind": "kill"})
    assert [(e["index"], e["rank"]) for e in h.journal("fault")] == [(0, 0), (0, 3)]
    assert set(h.state.fault_t) == {0, 3} and 0 in h.state.fired


def test_a_drain_of_several_ranks_notices_each_of_their_nodes(tmp_path):
    h = Harness(tmp_path, 2, 2, 2, "faults=[{step:1,kind:drain,ranks:[1,2]}]")
    h.commit_all()
    (firing,) = h.journal("fault_firing")
    assert firing["ranks"] == [1, 2] and firing["index"] == 0
    notices = [i.notice for i in _queued(h) if isinstance(i, NoticeIn)]
    assert [(n.kind, n.rank, n.source) for n in notices] == [("maintenance", 1, "fault"), ("maintenance", 2, "fault")]


def _spec(kind: str, ranks: list[int], amount: str = "") -> FaultSpec:
    return FaultSpec(index=0, step=1, kind=kind, rank=ranks[0], ranks=ranks, amount=amount, when="midstep")


def test_a_power_off_of_two_nodes_times_the_detection_of_both_from_one_moment(tmp_path):
    h = Harness(tmp_path)
    h.ctl.handle(FaultAt(_spec("power_off", [1, 3]), ("n1", "n3"), 12.5))
    (fault,) = h.journal("fault")
    assert fault["nodes"] == ["n1", "n3"] and fault["ranks"] == [1, 3] and fault["at"] == 12.5
    assert h.state.fault_t == {1: 12.5, 3: 12.5}


def test_a_slow_node_stays_in_the_run_and_times_nothing(tmp_path):
    """A throttled CPU or a slow link is not a failure: no detection clock starts for its ranks."""
    h = Harness(tmp_path)
    h.ctl.handle(FaultAt(_spec("throttle", [2], "30"), ("n2",), 20.0))
    h.ctl.handle(FaultAt(_spec("slowlink", [0, 1], "20mbit"), ("n0", "n1"), 21.0))
    assert [(e["kind"], e["ranks"], e["amount"]) for e in h.journal("fault")] == [
        ("throttle", [2], "30"),
        ("slowlink", [0, 1], "20mbit"),
    ]
    assert h.state.fault_t == {} and h.state.plan is None


def test_a_join_fault_travels_with_the_join_of_its_rank_only_when_due(tmp_path):
    h = Harness(tmp_path, 2, 2, 1, "faults=[{step:0,kind:kill,rank:2,when:join},{step:30,kind:kill,rank:1,when:join}]")
    assert all(h.got(r, "welcome")[0]["faults"] == [] for r in range(4))  # a join fault is not the worker's
    h.disconnect(2)  # rank 2 fails at step 0: the standby joins as rank 2 and gets the due fault
    h.abort_all([0, 1, 3])
    (join,) = h.got("s0", "join")
    assert join["rank"] == 2 and [(f["index"], f["when"]) for f in join["faults"]] == [(0, "join")]
