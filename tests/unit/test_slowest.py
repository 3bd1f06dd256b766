"""scripts/slowest: the slowest tests over the per-lane JUnit XML files that scripts/test writes
(read from the small files in tests/fixtures/junit)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "slowest"
JUNIT = ROOT / "tests" / "fixtures" / "junit"


def _slowest(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60, check=False)


def test_lists_the_slowest_over_both_lanes_slowest_first_then_lane_totals():
    proc = _slowest("-n", "3", str(JUNIT / "local.xml"), str(JUNIT / "slurm.xml"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "slowest 3 of 6 tests:",
        "  120.50 s  slurm  tests.slurm.test_long_runs.TestRequeue::test_requeue_twice",
        "   61.25 s  local  tests.distributed.test_recovery::test_kill_one_rank[tp2]",
        "   33.90 s  local  tests.distributed.test_shadow::test_shadow_takes_over",
        "lane local: 4 tests, 95.2 s summed",
        "lane slurm: 2 tests, 150.0 s summed",
    ]
    assert proc.stderr == ""


def test_default_count_is_25_and_lists_every_case_when_fewer():
    proc = _slowest(str(JUNIT / "local.xml"), str(JUNIT / "slurm.xml"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "slowest 6 of 6 tests:"
    assert proc.stdout.splitlines()[6] == "    0.00 s  local  tests.unit.test_gate::test_needs_linux"


def test_a_missing_lane_file_is_named_and_skipped(tmp_path):
    missing = tmp_path / "slurm.xml"
    proc = _slowest("-n", "1", str(JUNIT / "local.xml"), str(missing))
    assert proc.returncode == 0
    assert proc.stdout.splitlines() == [
        "slowest 1 of 4 tests:",
        "   61.25 s  local  tests.distributed.test_recovery::test_kill_one_rank[tp2]",
        "lane local: 4 tests, 95.2 s summed",
    ]
    assert f"skipped {missing}" in proc.stderr


def test_no_readable_file_fails(tmp_path):
    broken = tmp_path / "local.xml"
    broken.write_text("<testsuites><testsuite>")  # a lane killed while pytest wrote its file
    proc = _slowest(str(broken))
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert f"skipped {broken}" in proc.stderr
    assert "none of the files could be read" in proc.stderr
