"""The downtime benchmark's figures (pure): rows whose parts add up, cells with every sample and
nearest-rank p50/p90, ratios against tmslurm, requeues without Slurm's fixed delay, merging cells."""

from __future__ import annotations

import subprocess
import sys

import pytest

from benchmarks import dtstats
from benchmarks.downtime import _is_rank_of

SWITCH = {
    "kind": "unexpected",
    "gap_s": 1.30,
    "notice_t": 100.9,
    "pick_s": 0.01,
    "phase2_s": 0.02,
    "transfer_s": 0.05,
    "first_step_s": 0.12,
    "detect_s": 0.0,
    "downtime_s": 1.2,
}
"""A switch after a failure whose instant the run did not know: noticed at its detection."""
RESTART = {
    "kind": "requeue_restart",
    "gap_s": 140.0,
    "notice_t": 100.2,
    "from_checkpoint_step": 20,
    "detect_s": 0.1,
    "stop_s": 0.5,
    "reschedule_s": 125.0,
    "startup_s": 6.0,
    "redo_s": 7.0,
    "lost_steps": 9,
    "downtime_s": 139.9,
}


@pytest.mark.parametrize(
    "xs,q,want",
    [
        ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 50, 5),
        ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 90, 9),
        ([0.5], 90, 0.5),
        ([], 50, None),
        ([1, 2], 50, 1),
        ([1, 2], 90, 2),
    ],
)
def test_nearest_rank_percentile(xs, q, want):
    assert dtstats.pct(sorted(xs), q) == want


@pytest.mark.parametrize(
    "event,ev,detect",
    [
        ("power-off", SWITCH, 0.9),  # detection measured from the injection (t=100.0), not the run's own
        (
            "planned",
            {**SWITCH, "kind": "planned", "detect_s": 0.7},
            0.7,
        ),  # a notice arrives while training goes on: the run's own
        ("power-off", RESTART, 0.3),  # the run knew the fault at 100.2 and detected it 0.1 s later
    ],
)
def test_row_parts_add_up_to_the_gap_and_downtime_subtracts_the_reference_step(event, ev, detect):
    row = dtstats.make_row("s", event, 0, ev, ref_step_s=0.1, t_inject=100.0, inject_step=25, offset=5)
    assert row["parts"]["detect_s"] == pytest.approx(detect)
    assert sum(row["parts"].values()) == pytest.approx(row["gap_s"])
    assert row["downtime_s"] == pytest.approx(row["gap_s"] - 0.1)
    assert row["no_delay_s"] is None


@pytest.mark.parametrize(
    "ev",
    [
        {**SWITCH, "last_commit_t": 99.95, "before_fault_s": 0.95},  # the run counted to its detection
        {
            **SWITCH,
            "last_commit_t": 99.95,
            "notice_t": 100.1,
            "detect_s": 0.8,
            "before_fault_s": 0.15,
        },  # it knew the fault
    ],
    ids=["instant unknown to the run", "instant known to the run"],
)
def test_the_step_in_flight_is_counted_to_the_injection_not_to_the_detection(ev):
    row = dtstats.make_row("s", "power-off", 0, ev, ref_step_s=0.1, t_inject=100.0, inject_step=25, offset=5)
    assert row["parts"]["before_fault_s"] == pytest.approx(0.05) and row["parts"]["detect_s"] == pytest.approx(0.9)
    assert list(row["parts"])[0] == "before_fault_s" and row["notice_s"] == pytest.approx(0.9)
    assert row["parts"]["other_s"] == pytest.approx(1.30 - 0.05 - 0.9 - 0.01 - 0.02 - 0.05 - 0.12)
    assert sum(row["parts"].values()) == pytest.approx(row["gap_s"])


def test_row_without_a_gap_has_no_downtime_and_no_other_part():
    row = dtstats.make_row(
        "s", "sigkill", 0, {"kind": "unexpected"}, ref_step_s=0.1, t_inject=0, inject_step=1, offset=1
    )
    assert row["downtime_s"] is None and "other_s" not in row["parts"]


def test_requeue_without_the_fixed_delay():
    row = dtstats.make_row(
        "requeue_restart",
        "planned",
        0,
        RESTART,
        ref_step_s=0.1,
        t_inject=100.0,
        inject_step=1,
        offset=1,
        fixed_delay_s=121.0,
    )
    assert row["no_delay_s"] == pytest.approx(140.0 - 0.1 - 121.0)


def _rows(strategy: str, event: str, downs: list[float], delay: float | None = None) -> list[dict]:
    return [
        {
            "strategy": strategy,
            "event": event,
            "downtime_s": d,
            "parts": {} if d is None else {"detect_s": d / 2},
            "no_delay_s": None if delay is None else d - delay,
        }
        for d in downs
    ]


def test_cells_list_every_sample_and_ratios_use_p50s():
    rows = (
        _rows("tmslurm", "planned", [0.1, 0.3, 0.2])
        + _rows("tmslurm", "power-off", [1.0, 1.2, 0.9])
        + _rows("injob_restart", "planned", [9.0, 8.0, 10.0])
        + _rows("injob_restart", "power-off", [12.0, 11.0, 13.0])
        + _rows("requeue_restart", "planned", [130.0, 140.0, 135.0], delay=121.0)
        + _rows("tmslurm", "sigkill", [None])
    )
    cs = dtstats.cells(rows)
    c = cs["tmslurm"]["planned"]
    assert c["samples"] == [0.1, 0.3, 0.2] and c["n"] == 3 and c["p50"] == 0.2 and c["p90"] == 0.3
    assert c["detect_p50"] == pytest.approx(0.1)
    assert "sigkill" not in cs["tmslurm"]
    r = dtstats.ratios(cs)
    assert r["ratio_planned"] == pytest.approx(9.0 / 0.2) and r["ratio_unexpected"] == pytest.approx(12.0 / 1.0)
    assert r["ratio_planned_requeue"] == pytest.approx(135.0 / 0.2)
    assert r["ratio_planned_requeue_no_delay"] == pytest.approx(14.0 / 0.2)
    assert r["ratio_unexpected_requeue"] is None and r["ratio_sigkill"] is None


def test_merge_replaces_only_the_cells_measured_again():
    old = _rows("tmslurm", "planned", [0.1]) + _rows("tmslurm", "power-off", [1.0])
    new = _rows("tmslurm", "planned", [0.2, 0.3])
    merged = dtstats.merge(old, new)
    assert [(r["event"], r["downtime_s"]) for r in merged] == [("power-off", 1.0), ("planned", 0.2), ("planned", 0.3)]


def test_table_shows_each_cell_with_n_and_every_event():
    rows = [
        dtstats.make_row(
            "tmslurm", "power-off", i, SWITCH, ref_step_s=0.1, t_inject=100.0, inject_step=30 + i, offset=10 + i
        )
        for i in range(2)
    ]
    cs = dtstats.cells(rows)
    md = dtstats.table({"cells": cs, "ratios": dtstats.ratios(cs), "rows": rows})
    assert "| power-off (silent) | 1.200s / 1.200s (n=2) | – | – |" in md
    assert md.count("| tmslurm | power-off |") == 3  # one parts row, two events


@pytest.mark.parametrize(
    "strategies,plan",
    [
        (
            "reference,tmslurm,injob_restart",
            [("tmslurm", ["planned", "sigkill", "sigstop"]), ("injob_restart", ["planned", "power-off"])],
        ),
        ("requeue_restart", [("requeue_restart", ["planned", "power-off"])]),
        ("reference", []),
    ],
)
def test_event_plan_lists_the_strategies_events_that_progress_counts(strategies, plan):
    from argparse import Namespace

    from benchmarks.downtime import event_plan

    args = Namespace(strategies=strategies, events="planned,sigkill,sigstop", restart_events="planned,power-off")
    assert event_plan(args) == plan


@pytest.mark.parametrize("who,ok", [(["--rank", "1"], True), (["--standby", "0"], True), (["--monitor"], False)])
def test_only_a_training_agent_of_the_run_may_be_signalled(tmp_path, who, ok):
    """A standby that took a rank over keeps its ``--standby`` command line and is a valid victim; a
    node monitor, or an agent of another run, never is."""
    argv = [
        sys.executable,
        "-c",
        "import sys; print('up', flush=True); sys.stdin.read()",
        "tmslurm.agent.main",
        "--run-dir",
        str(tmp_path),
        *who,
    ]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"up\n"  # it runs: its command line is in /proc
        assert _is_rank_of(proc.pid, tmp_path) is ok
        assert _is_rank_of(proc.pid, tmp_path / "other") is False
    finally:
        proc.communicate(b"")


def test_the_median_parts_table_lists_the_parts_in_the_order_they_happen():
    rows = [
        dtstats.make_row(
            "tmslurm",
            "power-off",
            0,
            {**SWITCH, "last_commit_t": 99.95},
            ref_step_s=0.1,
            t_inject=100.0,
            inject_step=25,
            offset=5,
        ),
        dtstats.make_row(
            "tmslurm",
            "planned",
            0,
            {**SWITCH, "kind": "planned", "apply_s": 0.01, "verify_wait_s": 0.0, "transfer_s": 0.0},
            ref_step_s=0.1,
            t_inject=100.0,
            inject_step=3,
            offset=3,
        ),
    ]
    header = dtstats._parts_table(rows)[0]
    assert header == (
        "| strategy | event | n | before_fault | detect | pick | phase2 | apply | transfer | verify_wait | "
        "first_step | other |"
    )
