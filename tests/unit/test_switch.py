"""Switch planning (tmslurm.controller.switch_planning): dirty groups, state sources, joiners, per-process messages."""

from __future__ import annotations

import copy

import pytest

from tmslurm.controller.plan_types import Move, Plan
from tmslurm.controller.switch_planning import (
    PlanError,
    dirty_groups,
    dp_source,
    multi,
    pick_joiners,
    planned_messages,
    recovery_messages,
)
from tmslurm.core.topology import Layout
from tmslurm.wire.messages import Join, Prepare, Recover

L22 = Layout(2, 2)
M = 2  # micro-batches


def clean_status(layout: Layout, gen: int = 0) -> dict[int, dict[str, dict[str, int]]]:
    """What every rank reports after a complete step: M acts forward, M grads back, one all-reduce."""
    out: dict[int, dict[str, dict[str, int]]] = {}
    for rank in range(layout.world):
        row = {}
        for g in layout.groups_of(rank):
            if len(g.members) < 2:
                continue
            c = {"sent": 0, "recv": 0, "coll": 0, "pending": 0, "gen": gen}
            if g.name.startswith("dp/"):
                c["coll"] = 1
            else:
                c["sent"] = c["recv"] = M  # upstream sends acts and receives grads; downstream the reverse
            row[g.name] = c
        out[rank] = row
    return out


def test_clean_step_leaves_nothing_dirty():
    assert dirty_groups(L22, clean_status(L22)) == set()
    assert dirty_groups(Layout(2, 3), clean_status(Layout(2, 3))) == set()


def _mutate(rank, group, **fields):
    st = clean_status(L22)
    st[rank][group].update(fields)
    return st


@pytest.mark.parametrize(
    "status, dirty",
    [
        pytest.param(_mutate(0, "dp/stage0", pending=1), {"dp/stage0"}, id="pending-collective"),
        pytest.param(_mutate(1, "pp/replica0/0-1", pending=1), {"pp/replica0/0-1"}, id="pending-p2p"),
        pytest.param(_mutate(3, "dp/stage1", coll=0), {"dp/stage1"}, id="unequal-collective-counts"),
        pytest.param(_mutate(0, "pp/replica0/0-1", sent=M - 1), {"pp/replica0/0-1"}, id="send-without-recv"),
        pytest.param(_mutate(3, "pp/replica1/0-1", recv=M - 1), {"pp/replica1/0-1"}, id="recv-without-send"),
        pytest.param(_mutate(2, "dp/stage0", gen=1), {"dp/stage0"}, id="different-generations"),
    ],
)
def test_dirty_groups(status, dirty):
    assert dirty_groups(L22, status) == dirty


def test_group_with_a_dead_member_is_skipped():
    st = clean_status(L22)
    st[1]["dp/stage1"]["pending"] = 1  # rank 3 is dead: dp/stage1 is affected anyway
    st[2]["pp/replica1/0-1"]["sent"] = 0  # and so is pp/replica1/0-1
    st[0]["dp/stage0"]["coll"] = 0  # but this one, all alive, is really dirty
    del st[3]
    assert dirty_groups(L22, st) == {"dp/stage0"}


def test_group_missing_from_a_members_report_is_skipped():
    st = clean_status(L22)
    st[0]["pp/replica0/0-1"]["pending"] = 1
    del st[1]["pp/replica0/0-1"]  # rank 1 had abandoned it (not installed)
    assert dirty_groups(L22, st) == set()


def test_dp_source_is_an_alive_dp_peer():
    assert dp_source(L22, 1, {1}) == 3
    assert dp_source(L22, 2, {2}) == 0
    layout = Layout(3, 2)
    assert dp_source(layout, 1, {1, 3}) == 5  # first alive member of dp/stage1 = (1, 3, 5)


def test_dp_source_without_a_peer_is_a_plan_error():
    with pytest.raises(PlanError, match=r"rank 1 has no alive data-parallel peer \(dp=1\)"):
        dp_source(Layout(1, 2), 1, {1})
    with pytest.raises(PlanError, match="dp=2"):
        dp_source(L22, 1, {1, 3})


def test_pick_joiners_matches_roles():
    pool = {"s0": {"first"}, "s1": {"last"}}
    assert pick_joiners(L22, [1], pool) == [Move(1, "s1")]
    assert pick_joiners(L22, [0, 3], pool) == [Move(0, "s0"), Move(3, "s1")]


def test_pick_joiners_uses_each_standby_once():
    pool = {"s0": {"first", "last"}, "s1": {"first", "last"}}
    moves = pick_joiners(L22, [0, 2], pool)
    assert sorted(m.joiner for m in moves) == ["s0", "s1"]


@pytest.mark.parametrize(
    "ranks, pool, words",
    [
        ([1], {"s0": {"first"}}, ["role 'last'", "rank 1", "s0:['first']"]),
        ([1], {}, ["role 'last'", "standbys: none"]),
        ([0, 2], {"s0": {"first", "last"}}, ["role 'first'", "rank 2", "s0:['first', 'last']", "(s0 taken by rank 0)"]),
    ],
)
def test_pick_joiners_plan_error_lists_the_pool(ranks, pool, words):
    with pytest.raises(PlanError) as info:
        pick_joiners(L22, ranks, pool)
    for w in words:
        assert w in str(info.value)


def test_pick_joiners_prefers_one_spare_node_for_ranks_leaving_together():
    both = {"first", "last"}
    pool = {"a0": both, "b0": both, "b1": both}
    nodes = {"a0": "nodeA", "b0": "nodeB", "b1": "nodeB", "busy": "nodeA"}
    assert {m.joiner for m in pick_joiners(L22, [0, 1], pool)} == {"a0", "b0"}  # without nodes: split
    moves = pick_joiners(L22, [0, 1], pool, nodes)
    assert moves == [Move(0, "b0"), Move(1, "b1")]
    assert pick_joiners(L22, [1], pool, nodes) == [Move(1, "a0")]


def test_multi_drops_single_member_groups():
    layout = Layout(1, 2)
    assert multi(layout, layout.affected_groups([1])) == ["pp/replica0/0-1"]


def test_planned_messages_dp2_pp2():
    plan = Plan("planned", 3, [Move(1, "s0")], multi(L22, L22.affected_groups([1])))
    assert plan.groups == ["dp/stage1", "pp/replica0/0-1"]
    msgs = planned_messages(L22, plan)
    assert msgs == {
        0: Prepare(epoch=3, groups={"pp/replica0/0-1": 3}, pairs={}),
        3: Prepare(epoch=3, groups={"dp/stage1": 3}, pairs={}),
        1: Prepare(epoch=3, groups={}, pairs={"xfer/r1": [3, 0]}),
        "s0": Join(epoch=3, rank=1, groups={"dp/stage1": 3, "pp/replica0/0-1": 3}, xfer="xfer/r1", activate=False),
    }
    assert 2 not in msgs  # rank 2 shares no group with rank 1: it is never disturbed


def test_recovery_messages_dp2_pp2_with_a_dirty_group():
    dead = [1]
    moves = [Move(1, "s0", source=dp_source(L22, 1, set(dead)))]
    groups = multi(L22, set(L22.affected_groups(dead)) | {"pp/replica1/0-1"})
    plan = Plan("unexpected", 5, moves, groups)
    msgs = recovery_messages(L22, plan, alive=[0, 2, 3])
    assert msgs == {
        0: Recover(epoch=5, groups={"pp/replica0/0-1": 5}, pairs={}),
        2: Recover(epoch=5, groups={"pp/replica1/0-1": 5}, pairs={}),
        3: Recover(epoch=5, groups={"dp/stage1": 5, "pp/replica1/0-1": 5}, pairs={"xfer/r1": [5, 0]}),
        "s0": Join(epoch=5, rank=1, groups={"dp/stage1": 5, "pp/replica0/0-1": 5}, xfer="xfer/r1", activate=True),
    }


def test_recovery_messages_hold_only_the_ranks_that_send_no_state():
    dead = [1]
    moves = [Move(1, "s0", source=dp_source(L22, 1, set(dead)))]
    plan = Plan("unexpected", 5, moves, multi(L22, set(L22.affected_groups(dead))))
    msgs = recovery_messages(L22, plan, alive=[0, 2, 3], hold=True)
    assert {r: msgs[r].hold for r in (0, 2, 3)} == {0: True, 2: True, 3: False}  # rank 3 is the source
    no_move = Plan("unexpected", 6, [], multi(L22, {"pp/replica1/0-1"}))  # a dirty group, nobody joins
    assert not any(m.hold for m in recovery_messages(L22, no_move, alive=[0, 1, 2, 3], hold=True).values())


def test_recovery_messages_reach_alive_ranks_with_nothing_to_rebuild():
    layout = Layout(2, 3)
    plan = Plan("unexpected", 2, [Move(5, "s1", source=2)], multi(layout, layout.affected_groups([5])))
    msgs = recovery_messages(layout, plan, alive=[0, 1, 2, 3, 4])
    assert msgs[0] == Recover(epoch=2, groups={}, pairs={})
    assert msgs[2].pairs == {"xfer/r5": [2, 0]} and msgs[2].groups == {"dp/stage2": 2}
    assert msgs[4].groups == {"pp/replica1/1-2": 2}
    assert msgs["s1"].groups == {"dp/stage2": 2, "pp/replica1/1-2": 2}


def test_planners_do_not_mutate_their_inputs():
    st = clean_status(L22)
    before = copy.deepcopy(st)
    dirty_groups(L22, st)
    pool = {"s0": {"first"}, "s1": {"last"}}
    pick_joiners(L22, [0, 1], pool)
    assert st == before and pool == {"s0": {"first"}, "s1": {"last"}}
