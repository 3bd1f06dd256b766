"""An event's pause parts and ``other`` add up to its gap, whatever its kind."""

from __future__ import annotations

import pytest

from tmslurm.controller.events import EventLog, describe, other_s, pause_parts
from tmslurm.controller.journal import Journal

CASES = {
    "planned (phase 1 in the background)": (
        {
            "kind": "planned",
            "detect_s": 0.0,
            "pick_s": 0.01,
            "phase1_s": 0.5,
            "phase2_s": 0.02,
            "transfer_s": 0.03,
            "first_step_s": 0.1,
        },
        ("detect_s", "pick_s", "phase2_s", "apply_s", "transfer_s", "first_step_s"),
    ),
    # the fingerprints are compared behind the first step (verify_s); only the vote's wait for them is in the pause
    "planned with a live shadow (no state in the pause)": (
        {
            "kind": "planned",
            "detect_s": 0.0,
            "pick_s": 0.01,
            "phase1_s": 0.5,
            "phase2_s": 0.02,
            "transfer_s": 0.0,
            "verify_s": 0.4,
            "verify_wait_s": 0.01,
            "shadow_catchup_s": 2.5,
            "first_step_s": 0.1,
        },
        ("detect_s", "pick_s", "phase2_s", "apply_s", "transfer_s", "verify_wait_s", "first_step_s"),
    ),
    "unexpected": (
        {
            "kind": "unexpected",
            "detect_s": 0.8,
            "pick_s": 0.0,
            "phase1_s": 0.05,
            "phase2_s": 0.0,
            "transfer_s": 0.02,
            "first_step_s": 0.1,
        },
        (
            "before_fault_s",
            "detect_s",
            "pick_s",
            "phase1_s",
            "phase2_s",
            "apply_s",
            "transfer_s",
            "verify_s",
            "verify_wait_s",
            "first_step_s",
        ),
    ),
    "unexpected, the fault's instant known": (
        {
            "kind": "unexpected",
            "before_fault_s": 2.3,
            "detect_s": 0.2,
            "pick_s": 0.0,
            "phase1_s": 0.05,
            "phase2_s": 0.0,
            "transfer_s": 1.1,
            "first_step_s": 4.5,
        },
        (
            "before_fault_s",
            "detect_s",
            "pick_s",
            "phase1_s",
            "phase2_s",
            "apply_s",
            "transfer_s",
            "verify_s",
            "verify_wait_s",
            "first_step_s",
        ),
    ),
    "in-job restart (set-up and load inside start-up)": (
        {
            "kind": "injob_restart",
            "from_checkpoint_step": 0,
            "detect_s": 0.0,
            "stop_s": 0.1,
            "startup_s": 5.0,
            "group_setup_s": 0.4,
            "ckpt_load_s": 0.2,
            "redo_s": 5.0,
        },
        ("detect_s", "stop_s", "reschedule_s", "startup_s", "redo_s"),
    ),
    "controller restart": (
        {"kind": "controller_restart", "before_death_s": 0.05, "restart_s": 1.4, "adopt_s": 0.06, "first_step_s": 0.07},
        ("before_death_s", "restart_s", "adopt_s", "first_step_s"),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_parts_and_other_sum_to_the_gap(case):
    rec, expected = CASES[case]
    assert pause_parts(rec) == expected
    rec = {**rec, "gap_s": 12.0}
    other = other_s(rec)
    assert sum(rec.get(p) or 0.0 for p in expected) + other == pytest.approx(12.0)
    text = describe({**rec, "other_s": other, "downtime_s": 11.9})
    assert "gap 12.000s = " in text and f"other {other:.3f}" in text


def test_a_completed_event_records_its_other_part(tmp_path):
    log = EventLog(Journal(tmp_path / "events.jsonl"))
    log.on_commit(0, 100.0, 0.1)
    rec = {
        "kind": "planned",
        "status": "switched",
        "target_step": 5,
        "switched_t": 100.4,
        "last_commit_t": 100.0,
        "detect_s": 0.0,
        "pick_s": 0.1,
        "phase1_s": 3.0,
        "phase2_s": 0.05,
        "transfer_s": 0.05,
    }
    log.open_record(rec)
    log.on_commit(5, 100.6, 0.1)
    assert rec["status"] == "done" and rec["gap_s"] == pytest.approx(0.6)
    assert rec["first_step_s"] == pytest.approx(0.2) and rec["other_s"] == pytest.approx(0.6 - 0.4)
    assert rec["pause_s"] == pytest.approx(0.6 - 0.2)  # the gap beyond the first step's own time


@pytest.mark.parametrize(
    "rec,expected",
    [
        ({"gap_s": 5.0, "first_step_s": 4.5}, 0.5),  # a slow step cannot hide the move's cost
        ({"gap_s": 1.0, "first_step_s": 1.2}, 0.0),  # never negative
        (
            {"gap_s": 5.0, "first_step_s": 4.0, "apply_s": 0.8},
            0.2,
        ),  # the switch step's own optimizer update is no cost of the move
        ({"gap_s": 12.0, "first_step_s": None}, None),  # a restart: no first step of its own
        ({"first_step_s": 0.2}, None),  # no gap (the event before the first commit)
    ],
)
def test_pause_is_the_gap_beyond_the_first_step(rec, expected):
    from tmslurm.controller.events import pause_s

    assert pause_s(rec) == (pytest.approx(expected) if expected is not None else None)
    assert ("pause=" in describe({"kind": "planned", **rec, "pause_s": pause_s(rec)})) is (expected is not None)


def _recovery(times: dict[str, float]):
    from tmslurm.controller.plan_types import Move, Recovery

    plan = Recovery(
        epoch=3,
        moves=[Move(rank=1, joiner="standby0", source=3)],
        groups=["dp/stage1"],
        reason="process exit",
        times=times,
        target_step=6,
    )
    return plan


@pytest.mark.parametrize(
    "times,before",
    [
        ({"failure": 102.5, "detect": 102.7, "pick": 102.7}, 2.5),  # an injected fault: its instant is known
        ({"detect": 102.7, "pick": 102.7}, None),  # a real failure: only its detection is
    ],
)
def test_the_step_in_flight_before_a_fault_is_a_part_and_the_pause_from_the_fault_excludes_it(tmp_path, times, before):
    log = EventLog(Journal(tmp_path / "events.jsonl"))
    log.on_commit(4, 100.0, 4.0)
    plan = _recovery(times)
    rec = log.begin(plan, {}, {})
    plan.parts.update({"phase1_s": 0.05, "phase2_s": 0.01, "transfer_s": 1.0})
    plan.times["switched"] = 104.0
    log.switched(plan)
    log.on_commit(6, 108.5, 4.0)  # the first step after the switch: 4.5 s
    assert rec["status"] == "done" and rec["gap_s"] == pytest.approx(8.5) and rec["pause_s"] == pytest.approx(4.0)
    if before is None:
        assert "before_fault_s" not in rec and rec["pause_from_fault_s"] is None
    else:
        assert rec["before_fault_s"] == pytest.approx(before) and rec["detect_s"] == pytest.approx(0.2)
        assert rec["pause_from_fault_s"] == pytest.approx(4.0 - before)
        assert "before_fault 2.500" in describe(rec)
    parts = sum(rec.get(p) or 0.0 for p in pause_parts(rec))
    assert parts + rec["other_s"] == pytest.approx(rec["gap_s"])
