"""The controller's side of live shadowing, driven by fake channels: who is told to shadow, when the
switch may ride on a commit, and what the event and journal record."""

from __future__ import annotations

import time

import pytest

from tmslurm.controller.plans import PlannedSwitch
from tmslurm.notices import Notice
from tests.unit.controller_harness import Harness


def _notice(deadline_in: float | None) -> Notice:
    now = time.time()
    return Notice(kind="maintenance", source="admin", time=now, rank=1, reason="psu",
                  deadline=None if deadline_in is None else now + deadline_in)


def _commit(h: Harness) -> dict:
    for r in range(4):
        h.vote(r)
    return h.got(0, "decision")[-1]


@pytest.mark.parametrize("deadline_in,overrides,shadow", [
    (None, (), True),                                          # "as soon as possible": shadowing moves nothing in the pause
    (600.0, (), True),                                         # minutes of warning
    (3.0, (), False),                                          # too short to catch up: the state travels in the pause
    (600.0, ("runtime.shadow=false",), False),                 # switched off
    (None, ("runtime.switch_mode=full",), False),              # everything in the pause, by request
])
def test_who_is_told_to_shadow(tmp_path, deadline_in, overrides, shadow):
    h = Harness(tmp_path, 2, 2, 1, *overrides, shadow="runtime.shadow=false" not in overrides)
    h.ctl.intake.notice(_notice(deadline_in))
    plan = h.state.plan
    assert isinstance(plan, PlannedSwitch) and plan.shadow is shadow
    if "runtime.switch_mode=full" in overrides:
        return  # phase 1 is deferred to the pause
    assert h.got("s0", "join")[-1]["shadow"] is shadow
    assert h.got(1, "prepare")[-1]["shadow"] is shadow  # the leaver feeds the shadow
    assert h.got(3, "prepare")[-1]["shadow"] is False  # a stayer in the leaver's group does not


def test_the_switch_waits_for_the_shadow_then_records_it(tmp_path):
    h = Harness(tmp_path, shadow=True)
    h.ctl.intake.notice(_notice(None))
    plan = h.state.plan
    h.prepare_all()
    assert plan.ready and _commit(h)["switch"] is None  # phase 1 done, but the shadow has not caught up
    h.send("s0", {"type": "shadow_ready", "epoch": plan.epoch, "rank": 1, "step": 1, "catchup_s": 0.7})
    decision = _commit(h)
    assert decision["switch"] == {"epoch": plan.epoch, "moves": [{"rank": 1, "joiner": h.aid("s0")}]}
    h.send(1, {"type": "left", "rank": 1, "step": 2, "transfer_s": 0.003, "phase2_s": 0.01, "bytes": 0, "shadowed": True,
               "shadow_matched": True, "shadow_steps": 1, "shadow_wait_s": 0.02})
    h.send("s0", {"type": "joined", "epoch": plan.epoch, "rank": 1, "joiner": 0, "step": 2, "transfer_s": 0.004,
                  "phase1_s": 0.01, "bytes": 0, "rss_mb": 1.0, "shadowed": True, "shadow_matched": True, "shadow_steps": 1,
                  "shadow_catchup_s": 0.7})
    assert h.state.plan is None
    (rec,) = [e for e in h.ctl.ctx.events.items if e["kind"] == "planned"]
    assert rec["shadowed"] is True and rec["shadow_matched"] is True
    assert (rec["transfer_s"], rec["verify_s"], rec["shadow_catchup_s"]) == (0.0, 0.004, 0.7)
    assert rec["shadow_follow_s_per_step"] == pytest.approx(0.02)
    assert h.journal("shadow_ready") and not h.journal("shadow_mismatch")


def test_a_shadow_out_of_time_does_not_hold_the_switch(tmp_path):
    h = Harness(tmp_path, 2, 2, 1, "runtime.shadow_catchup_timeout_s=0", shadow=True)
    h.ctl.intake.notice(_notice(None))
    h.prepare_all()
    assert _commit(h)["switch"] is not None  # the rest of the state then travels in the pause, in order


def test_a_mismatch_is_journalled_loudly(tmp_path):
    h = Harness(tmp_path, shadow=True)
    h.ctl.intake.notice(_notice(None))
    plan = h.state.plan
    h.prepare_all()
    h.send("s0", {"type": "shadow_ready", "epoch": plan.epoch, "rank": 1, "step": 1, "catchup_s": 0.1})
    _commit(h)
    h.send(1, {"type": "left", "rank": 1, "step": 2, "transfer_s": 0.3, "phase2_s": 0.01, "bytes": 4096, "shadowed": True,
               "shadow_matched": False, "shadow_steps": 1, "shadow_wait_s": 0.0})
    (bad,) = h.journal("shadow_mismatch")
    assert (bad["rank"], bad["bytes"]) == (1, 4096)
