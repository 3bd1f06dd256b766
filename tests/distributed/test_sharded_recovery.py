"""The sharded optimizer (parallel.zero=1) end to end: real processes, real gloo, real signals.

Each run ends with the same ``final_state_sha256`` as the uninterrupted zero=1 run of its layout. At
zero=1 that hash covers every rank's own optimizer slice, and it is only given when each buddy's copy
equals the slice it shadows (controller/final_hashes.py ``fold_slices``). So an exact end also proves that
the buddy copies stayed exact through the failure.
"""

from __future__ import annotations

import pytest

from tests.distributed.test_recovery import assert_exact, events_of

pytestmark = pytest.mark.dist

STEPS = 16
BASE = [
    f"train.steps={STEPS}",
    "bench.step_delay_s=0.05",
    "detect.heartbeat_timeout_s=2.0",
    "standby.start_when_warm=true",
    "parallel.zero=1",
]
DP2PP2 = ("parallel.dp=2", "parallel.pp=2")
DP4PP1 = ("parallel.dp=4", "parallel.pp=1")


def _run(launch, baseline, layout, *extra):
    ref = baseline(*layout, "parallel.zero=1", f"train.steps={STEPS}")
    assert ref["layout"]["zero"] == 1 and ref["final_state_sha256"]
    s = launch(*layout, *BASE, *extra).wait()
    assert_exact(s, ref)
    assert s["steps"] == STEPS
    return s


# A drain, a kill and a stop share one run per layout (each had a run of its own: two runs fewer in
# CI); each finds a warm standby of its own and is over before the next fires (a recovery holds
# every rank, a zero=1 planned switch moves the slices in its pause).
@pytest.mark.parametrize(
    "layout,faults,standbys,kinds",
    [
        (
            DP2PP2,
            "{step:4,kind:drain,rank:1},{step:8,kind:kill,rank:2},{step:12,kind:stop,rank:3}",
            3,
            ["planned", "unexpected", "unexpected"],
        ),
        (DP2PP2, "{step:6,kind:kill,rank:0},{step:6,kind:kill,rank:3}", 2, ["unexpected"]),  # two DP groups, one step
        (
            DP4PP1,
            "{step:4,kind:drain,rank:2},{step:8,kind:kill,rank:1},{step:12,kind:stop,rank:3}",
            3,
            ["planned", "unexpected", "unexpected"],
        ),
        (DP4PP1, "{step:6,kind:kill,rank:0},{step:6,kind:kill,rank:3}", 2, ["unexpected"]),  # two buddy pairs, one step
    ],
    ids=["dp2pp2-drain-kill-stop", "dp2pp2-two-groups", "dp4-drain-kill-stop", "dp4-two-pairs"],
)
def test_failures_at_zero1_are_exact(launch, baseline, layout, faults, standbys, kinds):
    s = _run(launch, baseline, layout, f"standby.count={standbys}", f"faults=[{faults}]")
    assert sorted(e["kind"] for e in s["events"]) == kinds, s["events"]  # no checkpoint restart among them
    lost = sorted(r for e in s["events"] for r in e["ranks"])
    assert lost == sorted(int(f.split("rank:")[1].rstrip("}")) for f in faults.split("},{")), s["events"]
    for ev in events_of(s, "planned"):
        assert ev["shadowed"] is False  # zero=1 moves the leaver's slices in the pause (no live shadow)
    # every rank holds its slice and its buddy's: equal optimizer bytes on every rank of a stage
    # (dp=4 against zero=0: tests/unit/test_sharded_optimizer.py)
    assert len(set(s["optimizer_bytes"].values())) == (1 if layout == DP4PP1 else 2)


def test_a_slice_and_its_buddy_lost_together_restart_from_the_checkpoint_exactly(launch, baseline):
    s = _run(
        launch,
        baseline,
        DP2PP2,
        "standby.count=2",
        "train.checkpoint_every=4",
        "faults=[{step:9,kind:kill,rank:0},{step:9,kind:kill,rank:2}]",
    )
    (ev,) = events_of(s, "restart")
    assert "buddy" in ev["cause"] and "exists nowhere else" in ev["cause"], ev
    assert ev["from_checkpoint_step"] == 8 and ev["lost_steps"] == 1
