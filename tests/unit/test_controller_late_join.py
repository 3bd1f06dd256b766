"""A joiner that finished its join while the controller dropped its plan (a second death came first).

The joiner's ``joined`` is then still in flight: the controller has already cancelled the plan,
counted the rank as dead again and put the process back in the warm pool. The process is a worker
by now and ignores ``join``; it must never be planned as a joiner again. Its late ``joined`` makes
it the slot owner (and the recovery is redone with it as an alive rank) or, when another process
already serves the rank, gets it fenced.
"""

from __future__ import annotations

import time

from tests.unit.controller_harness import Harness
from tmslurm.controller.plan_types import Recovery
from tmslurm.controller.state import Mode
from tmslurm.core.notices import Notice


def _joined(h: Harness, who: str, rank: int, epoch: int) -> None:
    h.send(
        who,
        {
            "type": "joined",
            "epoch": epoch,
            "rank": rank,
            "joiner": int(who[1:]),
            "step": 0,
            "transfer_s": 0.01,
            "phase1_s": 0.01,
            "bytes": 10,
            "rss_mb": 1.0,
        },
    )


def _aborted_with_s0_as_rank_2(h: Harness) -> None:
    h.abort_all([0, 1])
    h.send("s0", {"type": "aborted", "epoch": h.state.epoch, "rank": 2, "step": h.state.step, "status": {}})


def _second_death_before_joined(h: Harness) -> int:
    """Rank 2 dies, s0 is sent to replace it; rank 3 dies before s0's ``joined`` is handled."""
    h.disconnect(2)
    h.abort_all([0, 1, 3])
    first = h.state.plan
    assert [(m.rank, m.joiner) for m in first.moves] == [(2, h.aid("s0"))]
    h.disconnect(3)
    assert isinstance(h.state.plan, Recovery) and h.state.plan.dead == {2, 3}
    return first.epoch


def _assert_s0_owns_rank_2_and_only_rank_3_is_replaced(h: Harness, dropped_epoch: int) -> None:
    plan = h.state.plan
    assert isinstance(plan, Recovery) and not plan.applied and plan.dead == {3}
    assert h.state.slots[2] == h.aid("s0") and h.state.rank_alive(2)
    assert h.got("s0", "abort")[-1] == {"type": "abort", "epoch": plan.epoch, "step": 0}
    assert h.aid("s0") not in h.ctl.members.warm_pool()
    _aborted_with_s0_as_rank_2(h)  # s0 now answers as rank 2
    assert plan.applied and [(m.rank, m.joiner) for m in plan.moves] == [(3, h.aid("s1"))]
    assert [j["epoch"] for j in h.got("s0", "join")] in ([dropped_epoch], [dropped_epoch, dropped_epoch + 1])
    (late,) = h.journal("late_join")
    assert (late["rank"], late["epoch"], late["outcome"]) == (2, dropped_epoch, "adopted")
    assert h.spawner.fenced == [] and not h.journal("handler_error")


def test_late_joined_before_the_new_plan_makes_the_joiner_the_slot_owner(tmp_path):
    h = Harness(tmp_path, 2, 2, 2)
    dropped = _second_death_before_joined(h)
    _joined(h, "s0", 2, dropped)  # arrives while the new recovery still waits for 'aborted'
    _assert_s0_owns_rank_2_and_only_rank_3_is_replaced(h, dropped)


def test_late_joined_after_the_joiner_was_picked_again_replans_without_it(tmp_path):
    h = Harness(tmp_path, 2, 2, 2)
    dropped = _second_death_before_joined(h)
    h.abort_all([0, 1])
    repicked = h.state.plan
    assert h.aid("s0") in repicked.joiners()  # the controller could not know s0 had become rank 2
    _joined(h, "s0", 2, dropped)
    assert h.got("s1", "cancel")[-1]["epoch"] == repicked.epoch  # the plan that counted on s0 is dropped
    _assert_s0_owns_rank_2_and_only_rank_3_is_replaced(h, dropped)


def test_joiner_that_reported_joined_is_a_slot_owner_and_never_picked_again(tmp_path):
    h = Harness(tmp_path, 2, 2, 2)
    h.disconnect(2)
    h.abort_all([0, 1, 3])
    _joined(h, "s0", 2, h.state.plan.epoch)
    h.disconnect(3)  # the plan is still waiting for 'recovered': the second death drops it
    _aborted_with_s0_as_rank_2(h)
    assert [(m.rank, m.joiner) for m in h.state.plan.moves] == [(3, h.aid("s1"))]
    assert h.state.slots[2] == h.aid("s0") and not h.journal("late_join")


def test_late_joined_for_a_rank_someone_else_serves_fences_the_process(tmp_path):
    h = Harness(tmp_path, 2, 2, 2)
    h.ctl.intake.notice(Notice(kind="maintenance", rank=1, source="admin", reason="psu", time=time.time()))
    h.prepare_all()
    dropped = h.state.plan.epoch
    h.disconnect(3)  # a death before the switch was applied: the notice is retried, rank 1 stays
    assert h.state.slots[1] == h.aid(1) and h.state.rank_alive(1)
    _joined(h, "s0", 1, dropped)  # cannot happen with a correct standby; a process claiming it is fenced
    assert h.spawner.fenced == [("standby", 0)] and h.state.slots[1] == h.aid(1)
    assert h.journal("late_join")[0]["outcome"] == "fenced" and h.state.mode is Mode.RECOVERING
