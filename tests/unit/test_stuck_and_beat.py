"""Two liveness deadlines of the controller, driven through fake channels: an applied switch or
recovery that does not finish within runtime.switch_timeout_s fences whoever has not reported and
recovers again; every agent gets a ``beat`` each runtime.controller_lost_s / 5."""

from __future__ import annotations

import time

import pytest

from tests.unit.controller_harness import Harness
from tests.unit.test_controller import notice
from tmslurm.controller.plan_types import PlannedSwitch, Recovery


def applied_planned_switch(h: Harness) -> PlannedSwitch:
    h.ctl.intake.notice(notice(rank=1, reason="psu"))
    plan = h.state.plan
    h.prepare_all()
    for r in range(4):
        h.vote(r)
    assert plan.applied
    h.send(1, {"type": "left", "rank": 1, "step": 1, "transfer_s": 0.01, "phase2_s": 0.01, "bytes": 10})
    return plan  # the joiner s0 has not reported "joined"


def applied_recovery(h: Harness) -> Recovery:
    h.disconnect(2)
    h.abort_all([0, 1, 3])
    plan = h.state.plan
    for r in (0, 3):
        h.send(r, {"type": "recovered", "epoch": plan.epoch, "rank": r, "build_s": 0.01})
    return plan  # rank 1 and the joiner s0 have not reported


@pytest.mark.parametrize(
    "make,late_s,stuck",
    [
        (applied_planned_switch, 30.0, False),
        (applied_planned_switch, 61.0, True),
        (applied_recovery, 59.0, False),
        (applied_recovery, 61.0, True),
    ],
)
def test_an_applied_plan_past_switch_timeout_fences_who_did_not_report(tmp_path, make, late_s, stuck):
    h = Harness(tmp_path)
    plan = make(h)
    waiting = sorted(plan.waiting)
    h.ctl.deadlines.tick(now=time.time() + late_s)
    if not stuck:
        assert h.state.plan is plan and not h.journal("stuck")
        return
    (entry,) = h.journal("stuck")
    assert entry["waiting"] == waiting and entry["epoch"] == plan.epoch
    assert ("standby", 0) in h.spawner.fenced  # the joiner that never joined is fenced by our own handle
    new = h.state.plan
    assert isinstance(new, Recovery) and new.epoch > plan.epoch and new.reason == "stuck in switch"
    assert h.got(0, "abort")[-1]["epoch"] == new.epoch


def test_every_live_agent_gets_a_beat_each_fifth_of_controller_lost_s(tmp_path):
    h = Harness(tmp_path, 2, 2, 1, "runtime.controller_lost_s=10")
    t0 = time.monotonic()
    h.ctl.deadlines.tick(now_m=t0)
    h.ctl.deadlines.tick(now_m=t0 + 1)  # within 2 s of the last beat: none
    assert all(len(h.got(who, "beat")) == 1 for who in (0, 1, 2, 3, "s0"))
    h.disconnect(3)
    h.ctl.deadlines.tick(now_m=t0 + 2.5)
    assert [len(h.got(who, "beat")) for who in (0, 1, 2, 3, "s0")] == [2, 2, 2, 1, 2]
