"""Gray failures end to end (real processes, real gloo): a rank that stays slow is moved to a warm
standby with a planned switch, a single 2-second stall moves nothing, and both runs end bit-identical
to the uninterrupted run. The slowness here is in-process (fault ``slow``: every step of the rank
stalls); the failure lab's ``throttle`` of a whole node is tests/slurm/test_lab_faults.py."""

from __future__ import annotations

import pytest

from tests.distributed.test_recovery import assert_exact, events_of

pytestmark = pytest.mark.dist

STEPS = 24
LAYOUT = ("parallel.dp=2", "parallel.pp=2")
BASE = [
    *LAYOUT,
    f"train.steps={STEPS}",
    "bench.step_delay_s=0.05",
    "standby.count=1",
    "standby.start_when_warm=true",
    "gray.evict=true",
    "gray.window=6",
]


def test_a_slow_rank_is_moved_off_and_a_hiccup_moves_nothing(launch, baseline):
    ref = baseline(*LAYOUT, f"train.steps={STEPS}")
    slow = launch(*BASE, "faults=[{step:6,kind:slow,rank:1,amount:'0.3'}]")
    s = slow.wait()
    hiccup = launch(*BASE, "faults=[{step:6,kind:hiccup,rank:1,amount:'2'}]")
    h = hiccup.wait()

    assert_exact(s, ref)
    (ev,) = s["events"]
    assert ev["kind"] == "planned" and ev["ranks"] == [1] and ev["status"] == "done", ev
    (evict,) = [e for e in slow.journal() if e["type"] == "gray_evict"]
    # slow from step 6: found once 4 of its 6 windowed steps were slow
    # (step 9; the vote of a step carries its busy time)
    assert evict["rank"] == 1 and 9 <= evict["step"] <= 10 and evict["ratio"] >= 1.5, evict
    assert s["gray"]["evictions"] == [
        {
            "cause": "compute",
            "rank": 1,
            "node": evict["node"],
            "step": evict["step"],
            "ratio": evict["ratio"],
            "excess_s": evict["excess_s"],
        }
    ]

    assert_exact(h, ref)
    assert h["events"] == [] and not any(e["type"].startswith("gray") for e in hiccup.journal())
    assert [e["kind"] for e in hiccup.journal() if e["type"] == "fault"] == ["hiccup"]
    assert max(e["dt"] for e in h["step_log"]) >= 2.0  # the stall did happen
    # a healthy rank never came near the factor (what the default is chosen against)
    assert h["gray"]["peak_ratio"]["3"] < 1.5, h["gray"]
    # the node monitors probed each other's links all along (loopback here) and found nothing slow
    for summary in (s, h):
        assert summary["links"]["probes"] > 0 and summary["links"]["moved"] == [], summary["links"]
    assert len(events_of(s, "planned")) == 1
