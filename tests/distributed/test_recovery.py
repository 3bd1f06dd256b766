"""The TrainMover core end to end: real processes, real signals, exact final models.

Every run here ends with the same ``final_params_sha256`` and ``final_state_sha256`` (parameters and
optimizer state of every stage) as the uninterrupted run of its layout, with ``replicas_equal``.
"""

from __future__ import annotations

import os
import signal

import pytest

from tmslurm.wire.protocol import request

pytestmark = pytest.mark.dist

STEPS = 24
# Pace steps a little so standbys (which import torch and warm up) are ready by the faults' steps.
BASE = [
    f"train.steps={STEPS}",
    "bench.step_delay_s=0.05",
    "detect.heartbeat_timeout_s=2.0",
    "standby.start_when_warm=true",
]


def events_of(summary, kind):
    return [e for e in summary["events"] if e["kind"] == kind]


def assert_exact(summary, ref):
    """Bit-identical to the uninterrupted run: parameters, optimizer state, and equal replicas."""
    assert summary["replicas_equal"] is True and summary["diverging"] == [], summary["diverging"]
    assert summary["final_params_sha256"] == ref["final_params_sha256"] is not None, summary["events"]
    assert summary["final_state_sha256"] == ref["final_state_sha256"] is not None, summary["events"]


def _run(launch, baseline, *extra, layout=("parallel.dp=2", "parallel.pp=2")):
    ref = baseline(*layout, f"train.steps={STEPS}")
    s = launch(*layout, *BASE, *extra).wait()
    assert_exact(s, ref)
    assert s["steps"] == STEPS
    return s


def assert_planned(ev, rank: int, shadow: str | None) -> None:
    assert ev["ranks"] == [rank] and ev["standby"]
    for part in ("phase1_s", "phase2_s", "transfer_s", "first_step_s", "downtime_s"):
        assert isinstance(ev[part], float), part
    assert ev["shadowed"] is (shadow is not None)
    if shadow == "matched":  # no state moved in the pause: only fingerprints were compared
        assert ev["shadow_matched"] is True and ev["transfer_s"] == 0.0 and isinstance(ev["verify_s"], float)
        assert isinstance(ev["shadow_catchup_s"], float) and ev["shadow_steps"] >= 1
    elif shadow == "mismatch":  # loud, and repaired by a full transfer: the run above is still exact
        assert ev["shadow_matched"] is False and ev["transfer_s"] > 0.0


@pytest.mark.parametrize(
    "rank,extra,shadow",
    [
        (1, ("shadow.enabled=false",), None),  # the state travels in the pause
        (0, ("faults=[{step:12,kind:drain,rank:0},{step:0,kind:corrupt_shadow,rank:0}]",), "mismatch"),
    ],
    ids=["last-stage-state-in-pause", "forced-shadow-mismatch-falls-back"],
)
def test_planned_migration_is_exact(launch, baseline, rank, extra, shadow):
    """Shadowed moves of the first and the last stage are checked by the run of three events below."""
    faults = () if any(e.startswith("faults=") for e in extra) else (f"faults=[{{step:12,kind:drain,rank:{rank}}}]",)
    s = _run(launch, baseline, "standby.count=1", *faults, *extra)
    (ev,) = events_of(s, "planned")
    assert_planned(ev, rank, shadow)
    assert not events_of(s, "restart")


def test_planned_middle_stage_with_pp3(launch, baseline):
    s = _run(
        launch,
        baseline,
        "standby.count=1",
        "faults=[{step:12,kind:drain,rank:4}]",
        layout=("parallel.dp=2", "parallel.pp=3"),
    )
    (ev,) = events_of(s, "planned")
    assert ev["ranks"] == [4]


@pytest.mark.parametrize("overlap", ["false", "true"], ids=["held", "overlapped"])
def test_unexpected_failures_kill_then_stop_are_exact(launch, baseline, overlap):
    """A killed rank's exit is seen at once; a SIGSTOPped rank is reported by its node's monitor after
    detect.node_timeout_s (0.8 s), before BASE's 2 s heartbeat timeout. One run, two standbys. The
    ranks that send no state redo the step after the transfer (held) or beside it (overlapped)."""
    layout = ("parallel.dp=2", "parallel.pp=2")
    ref = baseline(*layout, f"train.steps={STEPS}")
    run = launch(
        *layout,
        *BASE,
        "standby.count=2",
        f"runtime.redo_overlap={overlap}",
        "faults=[{step:8,kind:kill,rank:2},{step:16,kind:stop,rank:1}]",
    )
    s = run.wait()
    assert_exact(s, ref)
    held = [e["held"] for e in run.journal() if e["type"] == "recover"]
    assert held == ([[1, 3], [0, 2]] if overlap == "false" else [[], []])  # every rank but the source (0, then 3)
    kill, stop = events_of(s, "unexpected")
    assert kill["ranks"] == [2] and kill["cause"] == "process exit" and kill["detect_s"] < 0.5, kill
    assert stop["ranks"] == [1] and stop["cause"] == "stopped" and stop["detect_s"] < 1.8, stop
    assert not events_of(s, "restart")


def test_rank_that_heartbeats_but_stops_training_is_hung_and_replaced_exactly(launch, baseline):
    """Its training thread sleeps before voting while its heartbeat thread goes on (fault ``hang``)."""
    s = _run(launch, baseline, "standby.count=1", "detect.hang_floor_s=1.0", "faults=[{step:12,kind:hang,rank:2}]")
    (ev,) = events_of(s, "unexpected")
    assert ev["ranks"] == [2] and ev["cause"] == "no progress" and not events_of(s, "restart")


def test_second_rank_killed_during_the_switch(launch, baseline):
    s = _run(
        launch,
        baseline,
        "standby.count=2",
        "faults=[{step:12,kind:kill,rank:1},{step:12,kind:kill,rank:2,when:recover}]",
    )
    evs = events_of(s, "unexpected")
    assert sorted(r for ev in evs for r in ev["ranks"]) == [1, 2], evs
    assert not events_of(s, "restart")


@pytest.mark.parametrize("async_", ["false", "true"], ids=["sync-checkpoints", "async-checkpoints"])
def test_only_standby_killed_in_warmup_then_failure_falls_back_to_checkpoint(launch, baseline, async_):
    run = launch(
        *("parallel.dp=2", "parallel.pp=2"),
        *BASE,
        "standby.count=1",
        "train.checkpoint_every=5",
        f"train.checkpoint_async={async_}",
        "faults=[{step:16,kind:kill,rank:3}]",
    )
    up = run.wait_for(lambda e: e["type"] == "agent_up" and e["agent"].startswith("standby"))
    os.kill(up["pid"], signal.SIGKILL)
    s = run.wait()
    assert_exact(s, baseline("parallel.dp=2", "parallel.pp=2", f"train.steps={STEPS}"))
    (ev,) = events_of(s, "restart")
    # a synchronous step-15 checkpoint is complete before step 15 runs; an asynchronous one may still be
    # in flight when the kill stops every rank: then it has no meta.json and the restart takes step 10
    assert ev["from_checkpoint_step"] in ((15,) if async_ == "false" else (10, 15))
    assert ev["lost_steps"] == 16 - ev["from_checkpoint_step"]
    journal = run.journal()
    assert not any(e["type"] == "standby_ready" for e in journal)
    assert any(e["type"] == "standby_lost" for e in journal)


def test_two_planned_migrations_and_a_failure_in_one_run(launch, baseline):
    """The drains move the first stage (rank 0) and the last stage (rank 3), each shadowed: the pause
    moves no state."""
    s = _run(
        launch,
        baseline,
        "standby.count=3",
        "faults=[{step:6,kind:drain,rank:0},{step:12,kind:drain,rank:3},{step:18,kind:kill,rank:1}]",
    )
    first, last = events_of(s, "planned")
    assert_planned(first, 0, "matched")
    assert_planned(last, 3, "matched")
    assert len(events_of(s, "unexpected")) == 1, s["events"]
    assert not events_of(s, "restart")


def test_untouched_groups_keep_their_objects_and_stayers_memory_is_flat(launch, baseline):
    run = launch("parallel.dp=2", "parallel.pp=2", *BASE, "standby.count=1", "faults=[{step:12,kind:drain,rank:0}]")
    s = run.wait()
    journal = run.journal()
    ids = {}
    for e in journal:
        if e["type"] == "groups":
            ids.setdefault(e["rank"], []).append(e)
    # rank 3 (stage 1, replica 1) is in no group with rank 0: it never rebuilt anything
    assert len(ids[3]) == 1
    # rank 1 rebuilt pp/replica0/0-1 only; its dp group is the very same object
    first, last = ids[1][0], ids[1][-1]
    assert first["ids"]["dp/stage1"] == last["ids"]["dp/stage1"]
    assert first["ids"]["pp/replica0/0-1"] != last["ids"]["pp/replica0/0-1"]
    assert last["gens"]["pp/replica0/0-1"] > first["gens"]["pp/replica0/0-1"]
    # rank 2 rebuilt dp/stage0 only
    assert ids[2][0]["ids"]["pp/replica1/0-1"] == ids[2][-1]["ids"]["pp/replica1/0-1"]
    assert ids[2][0]["ids"]["dp/stage0"] != ids[2][-1]["ids"]["dp/stage0"]
    (ev,) = events_of(s, "planned")
    switch_step = max(e["step"] for e in s["step_log"] if e["t_end"] <= ev["switched_t"])
    for rank in (1, 2, 3):
        before = max(
            e["peak_rss_mb"][str(rank)]
            for e in s["step_log"]
            if e["step"] <= switch_step and str(rank) in e["peak_rss_mb"]
        )
        after = max(e["peak_rss_mb"][str(rank)] for e in s["step_log"] if str(rank) in e["peak_rss_mb"])
        assert after - before < 8.0, (rank, before, after)


def test_wrong_token_is_refused_and_the_run_is_unaffected(launch, baseline):
    run = launch("parallel.dp=2", "parallel.pp=2", *BASE)
    run.wait_for(lambda e: e["type"] == "agent_up")
    reply = request(run.run_dir, {"type": "notice", "event": "maintenance", "rank": 1}, token="not-the-token")
    assert reply["type"] == "error" and "refused" in reply["error"]
    bad = request(run.run_dir, {"type": "notice", "event": "explode", "rank": 1})
    assert bad["type"] == "error" and "notice.event" in bad["error"] and "'maintenance' or 'failure'" in bad["error"]
    s = run.wait()
    assert_exact(s, baseline("parallel.dp=2", "parallel.pp=2", f"train.steps={STEPS}"))
    assert s["events"] == []
    journal = run.journal()
    assert any(e["type"] == "auth_refused" for e in journal)
    assert any(e["type"] == "bad_message" and "notice.event" in e["error"] for e in journal)
