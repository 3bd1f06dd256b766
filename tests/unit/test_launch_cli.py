"""The command lines as a user runs them: tmslurm-launch --cfg job, bad overrides, tmslurm status/notify."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tmslurm.cli.notify_targets import FINISHED, Skip, Target, survey, vet

CLI = "import sys; from tmslurm.cli.main import main; sys.exit(main())"  # what the `tmslurm` console script runs


def run(*args: str, cwd=None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def test_cfg_job_prints_the_resolved_config(tmp_path):
    p = run("-m", "tmslurm.cli.launch", "--cfg", "job", "parallel.pp=3", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "dp: 2" in p.stdout and "pp: 3" in p.stdout
    assert "task: tmslurm.train.model:ReferenceTask" in p.stdout
    assert not (tmp_path / "runs").exists()  # nothing started, no run directory
    assert "detect:" in p.stdout and "gray:" in p.stdout and "bench:" not in p.stdout


def test_cfg_job_shows_the_bench_section_only_when_a_bench_key_was_changed(tmp_path):
    p = run("-m", "tmslurm.cli.launch", "--cfg", "job", "bench.switch_mode=full", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "bench:" in p.stdout and "switch_mode: full" in p.stdout


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


def test_a_typo_gets_one_line_naming_the_key_it_meant(tmp_path):
    p = run("-m", "tmslurm.cli.launch", "parallel.dpp=2", cwd=tmp_path)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == ["error: unknown key parallel.dpp; did you mean parallel.dp?"]


def test_help_lists_the_groups_and_the_keys_with_their_docstrings(tmp_path):
    p = run("-m", "tmslurm.cli.launch", "--help", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    for line in ("cluster=slurm", "model=small", "+experiment=demo", "slurm.spare_time=null", "metrics.monitor_port=0"):
        assert line in out, line
    assert "parallel.dp=2" in out and "Data-parallel degree: number of model replicas." in out
    assert "docs/config-reference.md" in out
    assert max(len(line) for line in out.splitlines()) <= 120
    assert "bench." not in out and "restart_mode" not in out  # benchmark-only switches are not offered
    assert not (tmp_path / "runs").exists()


def test_cfg_job_with_hydra_run_dir_shows_it_as_the_run_dir(tmp_path):
    p = run("-m", "tmslurm.cli.launch", "--cfg", "job", "hydra.run.dir=elsewhere", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "run_dir: elsewhere" in p.stdout


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


def test_status_of_a_directory_that_is_not_a_run_says_so(tmp_path):
    p = run("-c", CLI, "status", str(tmp_path))
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        f"error: {tmp_path} is not a tmslurm run (it has no config.json or summary.json). "
        "Fix: pass the directory tmslurm-launch made (runs/<time>, or the run_dir= it was given), or --job JOBID"
    ]


def test_status_of_a_run_whose_controller_has_not_started_says_not_running_yet(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    p = run("-c", CLI, "status", str(tmp_path))
    assert p.returncode == 3
    assert p.stderr.startswith("error: the run's controller is not running yet")
    assert str(tmp_path / "controller.json") in p.stderr


def _starting_run(run_dir, *, controller: bool, token: bool):
    run_dir.mkdir(mode=0o700)
    (run_dir / "config.json").write_text("{}")
    if controller:
        (run_dir / "controller.json").write_text('{"host": "127.0.0.1", "port": 1}')
    if token:
        (run_dir / "token").write_text("t")
    return run_dir


@pytest.mark.parametrize(
    "make, rc, missing",
    [
        (None, 2, "run does not exist (no such run directory)"),
        (dict(controller=False, token=True), 3, "controller.json does not exist (the run's controller is not running"),
        (dict(controller=True, token=False), 2, "token does not exist (pass --token"),
    ],
    ids=["no-run-dir", "no-controller-json", "no-token"],
)
def test_notify_names_the_missing_file(tmp_path, make, rc, missing):
    """Exit 3 where the controller is not running (it cannot be reached), 2 for the other bad input."""
    run_dir = tmp_path / "run"
    if make is not None:
        _starting_run(run_dir, **make)
    p = run("-c", CLI, "notify", "--node", "n1", "--event", "maintenance", "--run-dir", str(run_dir))
    assert p.returncode == rc, (p.stdout, p.stderr)
    assert p.stderr.startswith("error: no run accepted the notice") and missing in p.stderr
    assert "not trusted" not in p.stderr


def test_notify_without_node_or_rank_fails_with_2(tmp_path):
    p = run("-c", CLI, "notify", "--event", "maintenance", "--runs-root", str(tmp_path))
    assert p.returncode == 2
    assert p.stderr.startswith("error:") and "--node" in p.stderr


def test_notify_finds_the_live_runs_under_the_runs_root_in_name_order(tmp_path):
    """Several run directories under ``--runs-root`` (sorting them as RunDir objects raised TypeError);
    a finished run (with its summary) is skipped, and does not count as a live run."""
    for name in ("b", "a", "done"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "controller.json").write_text('{"host": "127.0.0.1", "port": 1}')
    (tmp_path / "done" / "summary.json").write_text("{}")
    runs, aliases = survey(tmp_path)
    assert runs == [tmp_path / "a", tmp_path / "b", tmp_path / "done"] and aliases == []
    vetted = [vet(p, read_token=False, named=False) for p in runs]
    assert [v.run_dir for v in vetted if isinstance(v, Target)] == [tmp_path / "a", tmp_path / "b"]
    assert vetted[2] == Skip(run_dir=tmp_path / "done", why=FINISHED, live=False)


def test_notify_with_a_bad_event_is_an_argparse_error(tmp_path):
    p = run("-c", CLI, "notify", "--node", "n1", "--event", "reboot")
    assert p.returncode == 2
    assert "invalid choice" in p.stderr


def test_help_into_a_reader_that_is_gone_ends_quietly():
    """``tmslurm-launch --help | head -1``: the reader has closed the pipe (here before the command
    starts, so every write fails); no traceback, status 0."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "tmslurm.cli.launch", "--help"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr
