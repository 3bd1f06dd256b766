"""Validate before submitting: every refusal of ``tmslurm-launch`` (and of the sbatch wrapper) comes
before the run directory is created or anything is submitted.

Each case runs the launcher's entry point in an empty working directory (the runs root, where the
default ``runs/<time>`` would be written) and asserts the refusal's text and that the directory is
still empty afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tmslurm.cli.launch import main as launch_main
from tmslurm.slurm.proc.job import main as job_main

ROOT = Path(__file__).resolve().parents[2]

REFUSED = [
    pytest.param(["slurm.time=banana"], ["slurm.time='banana' is not a Slurm time"], id="time-not-a-time"),
    pytest.param(["slurm.spare_time=soon"], ["slurm.spare_time='soon' is not a Slurm time"], id="spare-time"),
    pytest.param(["slurm.spare_renew_s=30"], ["slurm.spare_renew_s=30 must be at least 60"], id="spare-renew"),
    pytest.param(
        ["slurm.time=00:02:00"],
        ["slurm.signal_lead_s=120 leaves the main job 0 s to train", "slurm.time=00:02:00", "slurm.time=00:04:00"],
        id="lead-eats-the-limit",
    ),
    pytest.param(
        ["slurm.time=00:03:00", "slurm.signal_lead_s=120"],
        ["slurm.signal_lead_s=120 leaves the main job 60 s", "slurm.signal_lead_s=90 or less"],
        id="lead-longer-than-training",
    ),
    pytest.param(["parallel.nodes=1"], ["parallel.nodes", "= 4"], id="too-few-nodes"),
    pytest.param(["parallel.ranks_per_node=3"], ["parallel.ranks_per_node=3 does not divide"], id="rpn-not-dividing"),
]


def _empty(root: Path) -> bool:
    return not any(root.iterdir())


@pytest.mark.parametrize("overrides, texts", REFUSED)
def test_a_refused_launch_writes_nothing(tmp_path, monkeypatch, capsys, overrides, texts):
    monkeypatch.chdir(tmp_path)
    assert launch_main(["cluster=slurm", *overrides]) == 2
    err = capsys.readouterr().err
    for text in texts:
        assert text in err, f"{text!r} not in {err!r}"
    assert _empty(tmp_path), sorted(p.name for p in tmp_path.iterdir())


def test_a_resume_without_a_complete_checkpoint_is_refused_before_the_run_directory(tmp_path, monkeypatch, capsys):
    old = tmp_path / "old"
    (old / "checkpoints").mkdir(parents=True)  # no checkpoint in it
    root = tmp_path / "root"
    root.mkdir()
    monkeypatch.chdir(root)
    assert launch_main(["cluster=local", f"train.resume_from={old}"]) == 2
    assert "no complete checkpoint" in capsys.readouterr().err
    assert _empty(root)


def test_cluster_slurm_without_sbatch_is_refused_before_the_run_directory(tmp_path, monkeypatch, capsys):
    bare = tmp_path / "bin"
    bare.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    monkeypatch.chdir(root)
    monkeypatch.setenv("PATH", str(bare))
    assert launch_main(["cluster=slurm"]) == 2
    assert "sbatch on PATH" in capsys.readouterr().err
    assert _empty(root)


TOO_SMALL = "this job has 1 node(s); the layout needs 4"


def test_check_refuses_an_allocation_smaller_than_the_layout(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "1")
    assert launch_main(["--check", "cluster=slurm"]) == 2
    err = capsys.readouterr().err
    assert TOO_SMALL in err and "sbatch -N 4" in err
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "4")
    assert launch_main(["--check", "cluster=slurm"]) == 0
    assert "config ok: 4 ranks on 4 node(s) (this job has 4 node(s))" in capsys.readouterr().out
    assert _empty(tmp_path)


def test_the_batch_entry_refuses_too_small_an_allocation_before_the_run_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "1")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    assert job_main(["parallel.dp=2", "parallel.pp=2"]) == 2
    assert TOO_SMALL in capsys.readouterr().err
    assert _empty(tmp_path)


def test_the_sbatch_wrapper_validates_first_and_ends_the_job_with_the_message(tmp_path):
    """The batch script as Slurm runs it (in a 1-node job): it exits with tmslurm-launch's refusal."""
    env = {
        **os.environ,
        "SLURM_SUBMIT_DIR": str(tmp_path),
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_JOB_ID": "77",
        "TMSLURM_PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT),
    }
    script = ROOT / "scripts" / "tmslurm.sbatch"
    p = subprocess.run(
        ["bash", str(script), "parallel.dp=2", "parallel.pp=2"], capture_output=True, text=True, env=env, timeout=120
    )
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {TOO_SMALL}"), p.stderr
    assert _empty(tmp_path)
    bad = subprocess.run(
        ["bash", str(script), "slurm.time=banana"], capture_output=True, text=True, env=env, timeout=120
    )
    assert bad.returncode == 2 and "error: slurm.time='banana' is not a Slurm time" in bad.stderr
    assert _empty(tmp_path)


@pytest.mark.parametrize(
    "overrides",
    [
        ["slurm.time=00:02:00", "slurm.signal_lead_s=30"],  # the time-limit lab test and benchmark
        ["slurm.time=00:04:00"],  # the default lead: 120 s to train, 120 s to checkpoint and stop
        ["slurm.time=1-00:00:00", "slurm.spare_time=00:20:00", "slurm.spare_renew_s=600"],
    ],
)
def test_time_limits_that_leave_time_to_train_are_accepted(overrides):
    from tmslurm.core.config import compose_config

    assert compose_config(["cluster=slurm", *overrides]).slurm.time == overrides[0].split("=")[1]
