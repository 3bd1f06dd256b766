"""scripts/local-slurm's progress helpers (sourced in bash, nothing started): the durations it
writes and the plain step lines of ``up``."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "local-slurm"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _bash(body: str) -> str:
    """Run ``body`` after sourcing the script (which then only defines its functions), with a fixed clock."""
    script = f'source "{SCRIPT}"\nnow() {{ echo 141.0; }}\nUP_T0=100\n{body}\n'
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30, check=True).stdout


@pytest.mark.parametrize(
    "seconds,text",
    [("0", "0s"), ("0.4", "0s"), ("-3", "0s"), ("41", "41s"), ("59.6", "1m00s"), ("250", "4m10s"), ("7500", "2h05m")],
)
def test_fmt_duration_writes_durations_as_tmslurm_progress_does(seconds, text):
    from tmslurm.core.progress import format_duration

    assert _bash(f"fmt_duration {seconds}") == text == format_duration(float(seconds))


@pytest.mark.parametrize(
    "args,line",
    [
        ('3 "starting munged"', "local-slurm: [3/8] starting munged (elapsed 41s)\n"),
        ('7 "starting slurmd on node2" 2/6', "local-slurm: [7/8] starting slurmd on node2 (2/6, elapsed 41s)\n"),
    ],
)
def test_up_step_writes_one_plain_line(args, line):
    out = _bash(f"up_step {args}")
    assert out == line and "\r" not in out and "\x1b" not in out
