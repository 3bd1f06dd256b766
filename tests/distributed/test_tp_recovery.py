"""DP2 x PP2 x TP2 (8 ranks) through drains, kills and a failure during a switch: bit-identical ends.

Rank r = (dp * 2 + stage) * 2 + tp. Ranks 1, 2 and 4 differ from rank 0 in exactly one coordinate
(tp, pp, dp), so moving each of them exercises each dimension: a TP position, a pipeline stage (the
last-stage role) and a data-parallel replica. Every run ends with the uninterrupted run's
``final_params_sha256`` and ``final_state_sha256``; the drain run also checks that a switch rebuilt
only the leaver's groups (its TP group, its DP group, its pipeline pair).
"""

from __future__ import annotations

import pytest
from test_recovery import BASE, STEPS, assert_exact, events_of

pytestmark = pytest.mark.dist

TP_LAYOUT = ("parallel.dp=2", "parallel.pp=2", "parallel.tp=2")
# Ten processes (8 ranks, 2-3 standbys) start on 2 cores here: BASE's 2 s heartbeat timeout once
# declared a starting rank hung at step 0 (CI) and the run restarted. No test here hangs a rank;
# their faults are kills and drains, found by process exit and notices.
HEARTBEAT = "detect.heartbeat_timeout_s=10.0"


def _run(launch, baseline, *extra):
    ref = baseline(*TP_LAYOUT, f"train.steps={STEPS}")
    run = launch(*TP_LAYOUT, *BASE, HEARTBEAT, *extra)
    s = run.wait()
    assert_exact(s, ref)
    assert s["steps"] == STEPS and not events_of(s, "restart")
    return run, s


def test_drain_in_each_dimension_is_exact_and_rebuilds_only_the_leavers_groups(launch, baseline):
    run, s = _run(
        launch,
        baseline,
        "standby.count=3",
        "faults=[{step:6,kind:drain,rank:1},{step:12,kind:drain,rank:2},{step:18,kind:drain,rank:4}]",
    )
    evs = events_of(s, "planned")
    assert [ev["ranks"] for ev in evs] == [[1], [2], [4]], evs
    assert all(ev["joiner_warm"] is True for ev in evs), evs
    groups: dict[int, list[dict]] = {}
    for e in run.journal():
        if e["type"] == "groups":
            groups.setdefault(e["rank"], []).append(e)
    # rank 7 (dp1, pp1, tp1) shares no group with ranks 1, 2, 4: it never rebuilt anything
    assert len(groups[7]) == 1
    # rank 3 (dp0, pp1, tp1): rank 1 left its pipeline pair, rank 2 its TP group; its DP group never changed
    first, last = groups[3][0], groups[3][-1]
    assert first["ids"]["dp/stage1/tp1"] == last["ids"]["dp/stage1/tp1"]
    for name in ("pp/replica0/0-1/tp1", "tp/replica0/stage1"):
        assert first["ids"][name] != last["ids"][name], name
    # rank 5 (dp1, pp0, tp1): rank 1 left its DP group, rank 4 its TP group; its pipeline pair stayed
    first, last = groups[5][0], groups[5][-1]
    assert first["ids"]["pp/replica1/0-1/tp1"] == last["ids"]["pp/replica1/0-1/tp1"]
    assert first["ids"]["dp/stage0/tp1"] != last["ids"]["dp/stage0/tp1"]
    assert first["ids"]["tp/replica1/stage0"] != last["ids"]["tp/replica1/stage0"]


def test_kill_in_each_dimension_is_exact(launch, baseline):
    run, s = _run(
        launch,
        baseline,
        "standby.count=3",
        "faults=[{step:6,kind:kill,rank:1},{step:12,kind:kill,rank:2},{step:18,kind:kill,rank:4}]",
    )
    evs = events_of(s, "unexpected")
    assert sorted(r for ev in evs for r in ev["ranks"]) == [1, 2, 4], evs
    # the state of each lost rank came from its DP peer with the same (pp, tp): 1 <- 5, 2 <- 6, 4 <- 0
    sources = {m["rank"]: m["source"] for e in run.journal() if e["type"] == "recover" for m in e["moves"]}
    assert sources == {1: 5, 2: 6, 4: 0}, sources


def test_failure_during_a_switch_is_exact(launch, baseline):
    """Rank 1 dies; its TP peer rank 0 dies while rebuilding the groups the joiner needs."""
    _, s = _run(
        launch,
        baseline,
        "standby.count=2",
        "faults=[{step:12,kind:kill,rank:1},{step:12,kind:kill,rank:0,when:recover}]",
    )
    evs = events_of(s, "unexpected")
    assert sorted(r for ev in evs for r in ev["ranks"]) == [0, 1], evs


def test_second_death_outside_the_joiners_groups_during_recovery_is_exact(launch, baseline):
    """Rank 1 dies; rank 6 (no group in common with rank 1) dies while the recovery runs. The joiner
    for rank 1 may finish before the controller handles rank 6's death: it then owns rank 1 and is
    never sent to join again (the run used to stall on 60 s rebuild timeouts there)."""
    run, s = _run(
        launch,
        baseline,
        "standby.count=2",
        "faults=[{step:12,kind:kill,rank:1},{step:12,kind:kill,rank:6,when:recover}]",
    )
    journal = run.journal()
    assert {1, 6} <= {r for e in journal if e["type"] == "abort" for r in e["dead"]}, s["events"]
    assert [ev["ranks"] for ev in events_of(s, "unexpected")] in ([[1], [6]], [[1, 6]], [[6]]), s["events"]
    # a late 'joined' (the race) is adopted: the joiner owns rank 1 and only rank 6 is replaced after it
    for late in (e for e in journal if e["type"] == "late_join"):
        assert late["outcome"] == "adopted" and late["rank"] == 1, late
