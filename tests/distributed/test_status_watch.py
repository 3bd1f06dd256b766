"""``tmslurm status --watch`` against a real short local run: it waits for the controller, shows the
live run (ranks up, a warm standby, steps/s), and ends by itself with the run."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.unit.test_launch_cli import CLI

pytestmark = pytest.mark.dist


def test_watch_follows_a_run_to_its_end(launch):
    run = launch(
        "parallel.dp=1",
        "parallel.pp=2",
        "standby.count=1",
        "standby.start_when_warm=true",
        "train.steps=60",
        "bench.step_delay_s=0.05",
    )
    run.wait_for(lambda entry: True)  # the run directory exists (a missing one is bad input)
    watch = subprocess.Popen(
        [sys.executable, "-c", CLI, "status", "--watch", "--interval", "0.3", str(run.run_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = watch.communicate(timeout=120)
    finally:
        watch.kill()
    assert watch.returncode == 0, err
    run.wait()
    blocks = [b for b in out.split("\n\n") if b.strip()]
    live = [b for b in blocks if b.startswith("run ") and "  running  " in b.splitlines()[0]]
    assert live, out[-3000:]
    assert any("steps/s" in b.splitlines()[0] and " ? steps/s" not in b for b in live), live[-1]
    assert any(" 0 up" in b and " 1 up" in b and "warm 2/2 (first, last)" in b for b in live), live[-1]
    assert blocks[-1].startswith("run ") and "  finished  step 60/60" in blocks[-1].splitlines()[0], blocks[-1]
    assert "\x1b" not in out
