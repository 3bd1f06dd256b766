"""benchmarks.gray's arithmetic over a run's journal and step log: detection, steps lost, false alarms."""

from __future__ import annotations

import json

from benchmarks.gray import _row, table
from tmslurm.core.rundir import RunDir


def _write(rd: RunDir, steps: list[tuple[int, float]], journal: list[dict]) -> None:
    rd.path.mkdir(parents=True, exist_ok=True)
    rd.steps.write_text("".join(json.dumps({"step": s, "t_end": t}) + "\n" for s, t in steps))
    rd.events.write_text("".join(json.dumps(e) + "\n" for e in journal))


def test_a_throttled_run_found_after_five_steps(tmp_path):
    rd = RunDir(tmp_path / "run")
    # 0.1 s steps until step 10, then 0.3 s steps until the move at step 16, then 0.1 s again
    t, steps = 0.0, []
    for s in range(22):
        t += 0.1 if s <= 10 or s > 16 else 0.3
        steps.append((s, round(t, 3)))
    _write(rd, steps, [{"type": "gray_evict", "t": 100.8, "step": 15, "rank": 1, "ratio": 3.1, "cause": "compute"}])
    summary = {
        "events": [{"kind": "planned", "status": "done", "target_step": 16, "ranks": [1]}],
        "gray": {"peak_ratio": {"3": 1.1}},
        "replicas_equal": True,
    }
    r = _row("throttle", "30", "node2", 10, 100.0, rd, summary)
    assert (r["evicted"], r["detect_steps"], r["detect_s"], r["moved_at_step"]) == (True, 5, 0.8, 16)
    assert r["median_step_before_s"] == 0.1 and r["median_step_slowed_s"] == 0.3
    assert r["steps_lost"] == 12.0  # six steps each 0.2 s (two steps' worth) longer
    assert r["false_alarms"] == 0
    assert "| throttle | 30 | True | compute | 5 | 0.8 | 12.0 |" in table([r])


def test_a_slow_link_found_by_the_link_probes(tmp_path):
    rd = RunDir(tmp_path / "run")
    _write(
        rd,
        [(s, 0.1 * s) for s in range(30)],
        [
            {
                "type": "gray_evict",
                "t": 64.5,
                "step": 14,
                "node": "node2",
                "cause": "link",
                "best_mbps": 2.9,
                "median_mbps": 410.0,
            }
        ],
    )
    # the slow rank was found hung first (its vote the only one missing): an unexpected event moved it
    summary = {
        "events": [{"kind": "unexpected", "status": "done", "target_step": 15, "ranks": [1]}],
        "gray": None,
        "links": {"best_mbps": {"node2": 2.9}},
        "replicas_equal": True,
    }
    r = _row("slowlink", "20mbit", "node2", 10, 60.0, rd, summary)
    assert (r["evicted"], r["found_by"], r["ratio"], r["best_mbps"], r["detect_s"]) == (True, "link", None, 2.9, 4.5)
    assert (r["moved_at_step"], r["moved_by"]) == (15, "unexpected")
    assert r["peak_ratio"] is None and r["link_best_mbps"] == {"node2": 2.9}
    assert "| slowlink | 20mbit | True | link | 4 | 4.5 |" in table([r])


def test_a_slow_link_not_found_and_an_eviction_before_the_fault_is_a_false_alarm(tmp_path):
    rd = RunDir(tmp_path / "run")
    _write(
        rd, [(s, 0.1 * s) for s in range(30)], [{"type": "gray_evict", "t": 50.0, "step": 4, "rank": 2, "ratio": 1.6}]
    )
    r = _row("slowlink", "20mbit", "node2", 10, 60.0, rd, {"events": [], "replicas_equal": True})
    assert (r["evicted"], r["detect_steps"], r["moved_at_step"], r["false_alarms"]) == (False, None, None, 1)
    assert r["steps_lost"] == 0.0
