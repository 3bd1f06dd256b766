"""The controller's side of live shadowing, driven by fake channels: who is told to shadow, when the
switch may ride on a commit, and what the event and journal record."""

from __future__ import annotations

import time

import pytest

from tests.unit.controller_harness import Harness
from tmslurm.controller.events import pause_parts
from tmslurm.controller.plan_types import PlannedSwitch
from tmslurm.core.notices import Notice


def _notice(deadline_in: float | None) -> Notice:
    now = time.time()
    return Notice(
        kind="maintenance",
        source="admin",
        time=now,
        rank=1,
        reason="psu",
        deadline=None if deadline_in is None else now + deadline_in,
    )


def _commit(h: Harness) -> dict:
    for r in range(4):
        h.vote(r)
    return h.got(0, "decision")[-1]


@pytest.mark.parametrize(
    "deadline_in,overrides,shadow",
    [
        (None, (), True),  # "as soon as possible": shadowing moves nothing in the pause
        (600.0, (), True),  # minutes of warning
        (3.0, (), False),  # too short to catch up: the state travels in the pause
        (600.0, ("shadow.enabled=false",), False),  # switched off
        (None, ("bench.switch_mode=full",), False),  # everything in the pause, by request
    ],
)
def test_who_is_told_to_shadow(tmp_path, deadline_in, overrides, shadow):
    h = Harness(tmp_path, 2, 2, 1, *overrides, shadow="shadow.enabled=false" not in overrides)
    h.ctl.intake.notice(_notice(deadline_in))
    plan = h.state.plan
    assert isinstance(plan, PlannedSwitch) and plan.shadow is shadow
    if "bench.switch_mode=full" in overrides:
        return  # phase 1 is deferred to the pause
    assert h.got("s0", "join")[-1]["shadow"] is shadow
    assert h.got(1, "prepare")[-1]["shadow"] is shadow  # the leaver feeds the shadow
    assert h.got(3, "prepare")[-1]["shadow"] is False  # a stayer in the leaver's group does not


def _switched(h: Harness) -> PlannedSwitch:
    """A shadowed move of rank 1 to standby s0, switched: left and joined, not checked yet."""
    h.ctl.intake.notice(_notice(None))
    plan = h.state.plan
    h.prepare_all()
    assert plan.ready and _commit(h)["switch"] is None  # phase 1 done, but the shadow has not caught up
    h.send("s0", {"type": "shadow_ready", "epoch": plan.epoch, "rank": 1, "step": 1, "catchup_s": 0.7})
    decision = _commit(h)
    assert decision["switch"] == {"epoch": plan.epoch, "moves": [{"rank": 1, "joiner": h.aid("s0")}]}
    h.send(
        1,
        {
            "type": "left",
            "rank": 1,
            "step": 2,
            "transfer_s": 0.003,
            "phase2_s": 0.01,
            "bytes": 0,
            "shadowed": True,
            "shadow_steps": 1,
            "shadow_wait_s": 0.02,
            "apply_s": 0.05,
        },
    )
    h.send(
        "s0",
        {
            "type": "joined",
            "epoch": plan.epoch,
            "rank": 1,
            "joiner": 0,
            "step": 2,
            "transfer_s": 0.004,
            "phase1_s": 0.01,
            "bytes": 0,
            "rss_mb": 1.0,
            "shadowed": True,
            "shadow_steps": 1,
            "shadow_catchup_s": 0.7,
            "apply_s": 0.06,
        },
    )
    assert h.state.plan is None
    return plan


def _checked(plan: PlannedSwitch, matched: bool, **extra) -> dict:
    return {
        "type": "shadow_checked",
        "epoch": plan.epoch,
        "rank": 1,
        "step": 2,
        "matched": matched,
        "verify_s": 0.2,
        "wait_s": 0.01,
        **extra,
    }


def test_the_switch_waits_for_the_shadow_then_records_its_check_behind_the_first_step(tmp_path):
    h = Harness(tmp_path, shadow=True)
    plan = _switched(h)
    (rec,) = [e for e in h.ctl.ctx.events.items if e["kind"] == "planned"]
    assert rec["shadowed"] is True and "shadow_matched" not in rec  # switched before anything was compared
    assert (rec["transfer_s"], rec["apply_s"], rec["shadow_catchup_s"]) == (0.0, 0.06, 0.7)
    h.send("s0", _checked(plan, True))
    assert rec["shadow_matched"] is True and (rec["verify_s"], rec["verify_wait_s"]) == (0.2, 0.01)
    assert rec["shadow_follow_s_per_step"] == pytest.approx(0.02)
    h.commit_all({1: "s0"})
    assert rec["status"] == "done"
    # the check ran behind the first step: its wait is a part of the pause, taken out of the first step
    assert rec["first_step_s"] == pytest.approx(rec["first_step_t"] - rec["switched_t"] - 0.01)
    parts = pause_parts(rec)
    assert "verify_wait_s" in parts and "verify_s" not in parts
    assert rec["other_s"] == pytest.approx(rec["gap_s"] - sum(rec[p] or 0.0 for p in parts))
    assert rec["pause_s"] == pytest.approx(max(0.0, rec["gap_s"] - rec["first_step_s"] - 0.06))
    assert h.journal("shadow_ready") and h.journal("shadow_checked") and not h.journal("shadow_mismatch")


def test_the_leavers_node_is_given_back_only_after_the_check(tmp_path):
    """The leaver sends its fingerprint from its node after the switch: giving the node back to Slurm
    first would kill it mid-check (seen on the lab: the new rank then had no verdict and exited)."""
    h = Harness(tmp_path, shadow=True)
    plan = _switched(h)
    assert h.cluster.released == [] and h.state.release_after_check == {plan.epoch: ["n1"]}
    h.send("s0", _checked(plan, True))
    assert h.cluster.released == [["n1"]] and not h.state.release_after_check


def test_a_switch_without_a_shadow_gives_the_node_back_at_once(tmp_path):
    h = Harness(tmp_path)  # shadows off: the state travels in the pause, the leaver is done at `left`
    h.ctl.intake.notice(_notice(None))
    plan = h.state.plan
    h.prepare_all()
    assert _commit(h)["switch"] is not None
    h.send(1, {"type": "left", "rank": 1, "step": 2, "transfer_s": 0.01, "phase2_s": 0.01, "bytes": 64})
    h.send(
        "s0",
        {
            "type": "joined",
            "epoch": plan.epoch,
            "rank": 1,
            "joiner": 0,
            "step": 2,
            "transfer_s": 0.01,
            "phase1_s": 0.01,
            "bytes": 64,
            "rss_mb": 1.0,
        },
    )
    assert h.state.plan is None and h.cluster.released == [["n1"]]


def test_a_check_from_another_rank_changes_nothing(tmp_path):
    h = Harness(tmp_path, shadow=True)
    plan = _switched(h)
    h.send(2, _checked(plan, False))  # rank 2's process cannot speak for rank 1
    (rec,) = [e for e in h.ctl.ctx.events.items if e["kind"] == "planned"]
    assert "shadow_matched" not in rec and not h.journal("shadow_mismatch") and not h.got(0, "abort")


def test_a_shadow_out_of_time_does_not_hold_the_switch(tmp_path):
    h = Harness(tmp_path, 2, 2, 1, "shadow.catchup_timeout_s=0", shadow=True)
    h.ctl.intake.notice(_notice(None))
    h.prepare_all()
    assert _commit(h)["switch"] is not None  # the rest of the state then travels in the pause, in order


def test_a_mismatch_is_journalled_loudly_and_the_first_step_is_aborted_to_be_redone(tmp_path):
    h = Harness(tmp_path, shadow=True)
    plan = _switched(h)
    step = h.state.step
    h.send("s0", _checked(plan, False, bytes=4096, transfer_s=0.3))
    (bad,) = h.journal("shadow_mismatch")
    assert (bad["rank"], bad["bytes"]) == (1, 4096)
    (rec,) = [e for e in h.ctl.ctx.events.items if e["kind"] == "planned"]
    assert rec["shadow_matched"] is False and rec["transfer_s"] == 0.3
    (abort,) = h.got(0, "abort")  # every rank drops the step computed on the wrong copy ...
    assert abort["step"] == step and h.got("s0", "abort")
    assert h.state.step == step  # ... and redoes it: nothing was committed
