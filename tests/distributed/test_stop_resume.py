"""``tmslurm stop`` on a real local run: it checkpoints with its final commit, writes a summary that
says so, and ``train.resume_from`` then ends with the uninterrupted run's exact hashes."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tmslurm.core.config import compose_config
from tmslurm.core.topology import Layout
from tmslurm.train.ckpt_index import latest_complete
from tmslurm.wire.protocol import request

pytestmark = pytest.mark.dist

MATH = ("train.steps=20",)
CLI = "import sys; from tmslurm.cli.main import main; sys.exit(main())"  # what the `tmslurm` console script runs


def wait_for_step(run, step: int, timeout: float = 120.0) -> int:
    """The run's committed steps once they reach ``step`` (asked of its controller)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert run.proc.poll() is None, f"run ended early:\n{run.output()[-3000:]}"
        if (run.run_dir / "controller.json").exists():
            reply = request(run.run_dir, {"type": "status"}, timeout_s=5.0)
            if reply["status"]["step"] >= step:
                return reply["status"]["step"]
        time.sleep(0.1)
    raise AssertionError(f"run {run.run_dir} did not reach step {step} in {timeout}s")


def test_a_stopped_run_resumes_to_the_uninterrupted_runs_hashes(launch, baseline):
    reference = baseline(*MATH)
    run = launch(*MATH, "bench.step_delay_s=0.2")
    at = wait_for_step(run, 3)
    p = subprocess.run(
        [sys.executable, "-c", CLI, "stop", str(run.run_dir)], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    assert "stop accepted at step" in p.stdout and f"train.resume_from={run.run_dir}" in p.stdout
    stopped = run.wait()
    k = stopped["stopped"]["checkpoint_step"]
    assert at < k < 20 and stopped["steps"] == k, (at, stopped["steps"], stopped["stopped"])
    shards = Layout.from_config(compose_config(["cluster=local", *MATH])).shard_names
    assert latest_complete(run.run_dir, shards) == k  # the checkpoint of the final commit, complete
    assert any(e["type"] == "stop_requested" for e in run.journal())
    resumed = launch(*MATH, f"train.resume_from={run.run_dir}").wait()
    assert resumed["resumed_from_step"] == k and resumed["step_log"][0]["step"] == k
    assert resumed["steps"] == 20 and resumed["stopped"] is None
    assert resumed["final_params_sha256"] == reference["final_params_sha256"] is not None
    assert resumed["final_state_sha256"] == reference["final_state_sha256"] is not None
