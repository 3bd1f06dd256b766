"""Smoke test of ``bench control`` at N=8: the real controller process, simulated agents over TCP.

Runs admission, a few steps, a planned switch, a recovery and the stop, and checks the row: every
phase reached, positive figures, and every simulated slot owner received every decision.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.dist


@pytest.mark.parametrize("relay", [0, 4], ids=["direct", "node-relays"])
def test_control_bench_smallest(tmp_path, relay):
    """With ``--relay 4`` the agents of each simulated node talk through one simulated relay (votes by
    column, one decision frame per node): the same protocol run must reach the same end."""
    out = tmp_path / "control.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "control",
            "--sizes",
            "8",
            "--steps",
            "5",
            "--warmup",
            "2",
            "--relay",
            str(relay),
            "--out",
            str(tmp_path / "runs"),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["reached"] == "stopped" and "failed" not in row
    assert row["ranks"] == 8 and row["samples"] == 5
    for key in (
        "commit_p50_ms",
        "commit_p99_ms",
        "controller_cpu_ms_per_step",
        "rss_mb",
        "admit_s",
        "switch_plan_ms",
        "switch_done_ms",
        "recovery_ms",
        "heartbeats_per_s",
    ):
        assert row[key] > 0, key
    assert row["commit_p50_ms"] <= row["commit_p99_ms"]
    assert 0 < row["threads"] < row["ranks"]  # one gate thread reads every connection: not one per agent
    assert row["every_decision_received"] and row["decisions_missing"] == 0
    assert row["final_hash"] and row["controller_rc"] == 0 and row["agents_fenced"] == 0
    assert row["switch_prepares"] >= 1 and row["steps_committed"] > 7
    assert "| 8 |" in r.stdout
    assert row["ranks_per_relay"] == relay
    relays = [
        e
        for e in map(json.loads, (tmp_path / "runs" / "n8" / "events.jsonl").read_text().splitlines())
        if e["type"] == "relay"
    ]
    assert len(relays) == (8 // relay + 2 if relay else 0)  # one per training node and per spare node (2)
