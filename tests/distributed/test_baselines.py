"""The restart baselines are fair: a planned event is honoured the way a good restart-based system
would (checkpoint at the next step boundary, then restart from it: no step lost), and the result is
exact. (The requeue baseline takes the same path on Slurm, then requeues: tests/slurm.)"""

from __future__ import annotations

from tests.distributed.test_recovery import _run, events_of


def test_injob_restart_honours_a_drain_notice_and_loses_no_step(launch, baseline):
    s = _run(
        launch, baseline, "standby.count=0", "bench.restart_mode=injob_restart", "faults=[{step:10,kind:drain,rank:1}]"
    )
    (ev,) = events_of(s, "injob_restart")
    assert ev["trigger"] == "planned" and ev["ranks"] == [1]
    assert ev["lost_steps"] == 0 and ev["from_checkpoint_step"] == ev["target_step"] == 11, ev
    assert isinstance(ev["downtime_s"], float) and ev["other_s"] is not None
