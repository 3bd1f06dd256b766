"""Recovery when the recovery itself is hit (real processes, real gloo, real signals): several ranks
at one instant, the state's source or the joining standby dying in the middle of the transfer,
more failures than warm standbys, and a notice that meets a failure. Every run ends bit-identical
to the uninterrupted run; where no switch can cover a case, the checkpoint fallback does, and the
journal says why."""

from __future__ import annotations

import pytest

from tests.distributed.test_recovery import assert_exact, events_of

pytestmark = pytest.mark.dist

STEPS = 20
BASE = [
    f"train.steps={STEPS}",
    "bench.step_delay_s=0.05",
    "detect.heartbeat_timeout_s=2.0",
    "standby.start_when_warm=true",
]
DP2PP2 = ("parallel.dp=2", "parallel.pp=2")


def _exact(launch, baseline, layout, *extra):
    ref = baseline(*layout, f"train.steps={STEPS}")
    keys = {e.split("=", 1)[0] for e in extra}
    run = launch(*layout, *(b for b in BASE if b.split("=", 1)[0] not in keys), *extra)
    s = run.wait()
    assert_exact(s, ref)
    assert s["steps"] == STEPS
    return s, run.journal()


def test_three_ranks_of_three_stages_lost_at_one_instant_move_together(launch, baseline):
    """DP2 x PP3: one fault kills ranks 0, 4 and 2 (stages 0, 1, 2) mid-step 6; each stage keeps a
    replica, so one recovery moves all three to the three standbys."""
    s, journal = _exact(
        launch,
        baseline,
        ("parallel.dp=2", "parallel.pp=3"),
        "standby.count=3",
        "faults=[{step:6,kind:kill,ranks:[0,4,2]}]",
    )
    (ev,) = s["events"]
    assert ev["kind"] == "unexpected" and ev["ranks"] == [0, 2, 4] and ev["status"] == "done", ev
    assert sorted(e["rank"] for e in journal if e["type"] == "fault") == [0, 2, 4]


def test_the_source_dying_mid_transfer_is_covered_by_another_peer(launch, baseline):
    """DP4: rank 1 dies; its state's source (rank 0, the first live DP peer) dies after sending the
    transfer's header. The next recovery moves both, from ranks 2/3, to the two standbys."""
    s, journal = _exact(
        launch,
        baseline,
        ("parallel.dp=4", "parallel.pp=1"),
        "standby.count=2",
        "faults=[{step:6,kind:kill,rank:1},{step:6,kind:kill,rank:0,when:transfer}]",
    )
    assert [e["kind"] for e in s["events"] if e["status"] == "done"][-1] == "unexpected"
    assert {r for e in s["events"] for r in e["ranks"]} == {0, 1}
    assert not events_of(s, "restart")
    assert [e["step"] for e in journal if e["type"] == "fault" and e["rank"] == 0] == [6]


def test_the_joining_standby_dying_mid_transfer_is_replaced_by_the_next(launch, baseline):
    s, journal = _exact(
        launch,
        baseline,
        DP2PP2,
        "standby.count=2",
        "faults=[{step:6,kind:kill,rank:2},{step:6,kind:kill,rank:2,when:join}]",
    )
    assert not events_of(s, "restart")
    assert [e["ranks"] for e in s["events"] if e["status"] == "done"] == [[2]]
    joined = [e for e in journal if e["type"] == "joined" and e["rank"] == 2]
    assert len(joined) == 1
    assert any(e["type"] in ("standby_lost", "agent_lost") for e in journal)


def test_more_failures_than_warm_standbys_fall_back_to_the_checkpoint(launch, baseline):
    """One standby: the first kill takes it; the second (before a replacement is warm, or with
    none) restarts from the step-8 checkpoint, and the journal says why."""
    s, journal = _exact(
        launch,
        baseline,
        DP2PP2,
        "standby.count=1",
        "train.checkpoint_every=4",
        "faults=[{step:5,kind:kill,rank:1},{step:9,kind:kill,rank:2}]",
    )
    kinds = [e["kind"] for e in s["events"]]
    assert kinds[0] == "unexpected" and "restart" in kinds, s["events"]
    (restart,) = events_of(s, "restart")
    assert "standby" in restart["cause"] and restart["from_checkpoint_step"] == 8, restart


def test_a_kill_takes_the_only_standby_then_a_drain_notice_is_honoured_by_a_checkpoint_restart(launch, baseline):
    """The kill of rank 2 at step 4 takes the one standby (warm before step 0: BASE's
    standby.start_when_warm; none replaces it on cluster=local); the drain of rank 1 at step 8 then
    finds no standby at all, so the notice is honoured by a checkpoint at the next step and a restart
    from it: no step lost, the notice neither dropped nor left pending.

    The order is fixed so that one outcome is right. Drain first with a cold standby (as a user once
    ran it) had three, by when the standby warmed: a planned switch, a checkpoint restart, or the
    notice still pending at the end. A notice that survives a restart and is planned after it is
    tests/unit/test_controller.py's (deterministic there)."""
    s, journal = _exact(
        launch,
        baseline,
        DP2PP2,
        "standby.count=1",
        "train.checkpoint_every=4",
        "faults=[{step:4,kind:kill,rank:2},{step:8,kind:drain,rank:1}]",
    )
    unexpected, restart = s["events"]
    assert (unexpected["kind"], unexpected["ranks"], unexpected["status"]) == ("unexpected", [2], "done"), unexpected
    assert (restart["kind"], restart["trigger"], restart["ranks"]) == ("restart", "planned", [1]), restart
    assert restart["lost_steps"] == 0, restart  # the checkpoint at the step boundary: nothing redone
    assert s["pending_notices"] == []
    assert [e["ranks"] for e in journal if e["type"] == "checkpoint_then_restart"] == [[1]]
    assert [e.get("rank") for e in journal if e["type"] == "notice"] == [1]
