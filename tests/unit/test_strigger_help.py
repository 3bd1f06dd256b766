"""``scripts/tmslurm-strigger --help`` prints its usage and exits 0, touching nothing (the Slurm
behaviour of the script is tests/slurm/test_strigger.py's)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "tmslurm-strigger"


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_the_usage_and_exits_0(tmp_path, flag):
    env = {"PATH": "/usr/bin:/bin", "TMSLURM_RUNS_ROOT": str(tmp_path)}  # a log would land in tmp_path
    p = subprocess.run(["bash", str(SCRIPT), flag], capture_output=True, text=True, timeout=30, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""
    lines = p.stdout.splitlines()
    assert lines[0].startswith("tmslurm-strigger: the program a cluster admin registers with `strigger`")
    assert "  tmslurm-strigger [--conf FILE] maintenance|failure HOSTLIST...   (node triggers)" in lines
    assert any(line.startswith("  TMSLURM_RUNS_ROOT ") for line in lines)  # the configuration keys too
    assert not any(line.startswith("#") or line == "set -u" for line in lines)  # only the header, unmarked
    assert list(tmp_path.iterdir()) == []  # no log, no state file
