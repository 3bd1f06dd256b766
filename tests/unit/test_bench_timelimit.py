"""benchmarks.timelimit's arithmetic over a run's ``job_end_*`` events: the pause and its parts."""

from __future__ import annotations

import pytest

from benchmarks.timelimit import _row, table

# a job_end_resubmit event as a lab run recorded it (times shifted to 1000 s)
EVENT = {
    "kind": "job_end_resubmit",
    "notice_t": 1000.0,
    "requeue_t": 1000.09,
    "reschedule_s": 3.55,
    "startup_s": 13.43,
    "all_started_t": 1017.07,
    "first_step_t": 1017.12,
    "lost_steps": 0,
    "target_step": 111,
}


def test_a_boundary_splits_into_checkpoint_reschedule_startup_and_first_step():
    r = _row("resubmit", 0, EVENT, None)
    assert (r["boundary"], r["pause_s"], r["checkpoint_s"], r["reschedule_s"]) == (1, 17.12, 0.09, 3.55)
    assert (r["startup_s"], r["first_step_s"], r["lost_steps"], r["fixed_delay_s"]) == (13.43, 0.05, 0, None)


def test_the_table_takes_slurms_fixed_delay_out_of_a_requeues_pause_and_sums_lost_steps():
    rq = [
        _row(
            "requeue",
            i,
            {**EVENT, "first_step_t": 1000.0 + p, "all_started_t": 999.95 + p, "reschedule_s": p - 13.6},
            120.5 + i,
        )
        for i, p in enumerate((140.0, 142.0, 150.0))
    ]
    rs = [_row("resubmit", i, {**EVENT, "lost_steps": i}, None) for i in range(2)]
    text = table(rq + rs)
    line = next(x for x in text.splitlines() if x.startswith("| requeue |"))
    assert "| 3 | 142.00 (140.00-150.00) |" in line and "| 121.50 (120.50-122.50) |" in line
    assert "| 0.05 (0.05-0.05) | 20.50 (19.50-27.50) |" in line  # without the fixed delay: 19.5, 20.5, 27.5
    assert next(x for x in text.splitlines() if x.startswith("| resubmit |")).endswith("| 1 |")


@pytest.mark.parametrize("missing", ["startup_s", "all_started_t"])
def test_a_boundary_with_a_part_unmeasured_shows_none(missing):
    ev = {k: v for k, v in EVENT.items() if k != missing}
    r = _row("resubmit", 0, ev, None)
    assert r[missing.replace("all_started_t", "first_step_s")] is None
