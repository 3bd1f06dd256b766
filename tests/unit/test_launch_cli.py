"""The command lines as a user runs them: tmslurm-launch --cfg job, bad overrides, tmslurm status/notify."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

CLI = "import sys; from tmslurm.cli.main import main; sys.exit(main())"  # what the `tmslurm` console script runs


def run(*args: str, cwd=None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def test_cfg_job_prints_the_resolved_config(tmp_path):
    p = run("-m", "tmslurm.cli.launch", "--cfg", "job", "parallel.pp=3", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "dp: 2" in p.stdout and "pp: 3" in p.stdout
    assert "task: tmslurm.train.model:ReferenceTask" in p.stdout
    assert not (tmp_path / "runs").exists()  # nothing started, no run directory


@pytest.mark.parametrize("override", ["parallel.dp=-1", "parallel.nodes=3", "parallel.dp=abc"])
def test_bad_override_prints_one_error_line_and_exits_2(tmp_path, override):
    p = run("-m", "tmslurm.cli.launch", override, cwd=tmp_path)
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("error:") and override.split("=")[0] in lines[0]
    assert not (tmp_path / "runs").exists()


def test_bad_override_of_hydra_kind_exits_2_with_error(tmp_path):
    p = run("-m", "tmslurm.cli.launch", "parallel.dp=abc", cwd=tmp_path)
    assert p.returncode == 2
    assert p.stderr.startswith("error:") and "parallel.dp=abc" in p.stderr


def _summary() -> dict:
    return {
        "run_id": "finished-run",
        "layout": {"dp": 2, "pp": 2, "tp": 1},
        "steps": 20,
        "final_params_sha256": "ab" * 32,
        "final_state_sha256": "12" * 32,
        "stage_digests": ["cd" * 32, "ef" * 32],
        "replicas_equal": True,
        "replica_mismatch_steps": [],
        "loss_first": 5.5,
        "loss_last": 3.25,
        "median_step_s": 0.05,
        "step_log": [],
        "events": [
            {
                "kind": "planned",
                "ranks": [1],
                "node": "local1",
                "downtime_s": 0.125,
                "detect_s": 0.0,
                "phase1_s": 0.2,
                "transfer_s": 0.01,
                "status": "done",
            }
        ],
        "standbys": [{"id": "standby0.123", "node": "spare0", "roles": {"first": {}, "last": {}}}],
        "restart_mode": "tmslurm",
        "main_job_id": None,
        "spare_job_ids": [],
    }


def test_status_of_a_finished_run_reads_its_summary(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps(_summary()))
    p = run("-c", CLI, "status", str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert "finished-run" in p.stdout and "mode=finished" in p.stdout and "step=20/20" in p.stdout
    assert "event planned ranks=[1] node=local1 downtime=0.125s" in p.stdout
    assert "standby standby0.123" in p.stdout and "first, last" in p.stdout


def test_status_json_of_a_finished_run(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps(_summary()))
    p = run("-c", CLI, "status", "--json", str(tmp_path))
    assert p.returncode == 0, p.stderr
    st = json.loads(p.stdout)
    assert st["final_params_sha256"] == "ab" * 32 and st["mode"] == "finished" and st["step"] == 20


def test_status_of_an_empty_directory_says_the_controller_is_not_running(tmp_path):
    p = run("-c", CLI, "status", str(tmp_path))
    assert p.returncode == 3
    assert p.stderr.startswith("error:") and "not running" in p.stderr


def test_notify_without_node_or_rank_fails_with_2(tmp_path):
    p = run("-c", CLI, "notify", "--event", "maintenance", "--runs-root", str(tmp_path))
    assert p.returncode == 2
    assert p.stderr.startswith("error:") and "--node" in p.stderr


def test_notify_with_a_bad_event_is_an_argparse_error(tmp_path):
    p = run("-c", CLI, "notify", "--node", "n1", "--event", "reboot")
    assert p.returncode == 2
    assert "invalid choice" in p.stderr
