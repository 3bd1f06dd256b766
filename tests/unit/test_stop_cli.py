"""``tmslurm stop RUN_DIR | --job ID``: its arguments and errors, against real directories and a fake
controller on 127.0.0.1 (the stop of a real run is tests/distributed/test_stop_resume.py's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_client import fake, sample_body
from tests.unit.test_notify_runs import Controller, make_run

CLI = "import sys; from tmslurm.cli.main import main; sys.exit(main())"  # what the `tmslurm` console script runs


def stop(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CLI, "stop", *args], capture_output=True, text=True, timeout=60, env=env
    )


def a_run(path: Path, port: int) -> Path:
    run = make_run(path, port)
    (run / "config.json").write_text("{}")
    return run


@pytest.fixture
def controller():
    c = Controller({"type": "ok", "ok": True, "stopping_after_step": 7})
    yield c
    c.close()


def test_stop_asks_the_controller_with_the_run_token_and_says_how_to_resume(tmp_path, controller):
    run = a_run(tmp_path / "run", controller.port)
    p = stop(str(run))
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"{run}: stop accepted at step 7: the run checkpoints with its next step commit")
    assert p.stdout.strip().endswith(f"Resume with train.resume_from={run}")
    assert controller.received == [{"type": "stop", "token": "t"}]


def test_stop_by_job_id_finds_the_run_through_slurm(tmp_path, controller):
    run = a_run(tmp_path / "run", controller.port)
    record = sample_body("22.05", "scontrol-show-job-running.txt").read_text().split("\n", 1)[1]
    (tmp_path / "job.txt").write_text(
        record.replace("   StdErr=", f"   Comment=tmslurm run=run dir={run} \n   StdErr=", 1)
    )
    fake(tmp_path / "bin", "scontrol", f"cat '{tmp_path / 'job.txt'}'")
    p = stop("--job", "10", env={**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"})
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"{run}: stop accepted at step 7")
    assert controller.received == [{"type": "stop", "token": "t"}]


@pytest.mark.parametrize(
    "args, needle",
    [
        ([], "give a run directory or --job JOBID (one of them)"),
        (["RUN", "--job", "10"], "give a run directory or --job JOBID (one of them)"),
        (["--job", "x1"], "'x1' is not a Slurm job id"),
        (["NOPE"], "is not a run directory (no such directory)"),
        (["EMPTY"], "is not a tmslurm run (it has no config.json or summary.json)"),
        (["FINISHED"], "has already finished (it has a summary.json): there is nothing to stop"),
    ],
    ids=["nothing", "both", "bad-job-id", "no-such-dir", "not-a-run", "finished"],
)
def test_bad_input_is_one_error_line_and_exit_2(tmp_path, args, needle):
    (tmp_path / "EMPTY").mkdir()
    a_run(tmp_path / "FINISHED", 1)
    (tmp_path / "FINISHED" / "summary.json").write_text("{}")
    a_run(tmp_path / "RUN", 1)
    p = stop(*[str(tmp_path / a) if a.isupper() else a for a in args])
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert p.stderr.startswith("error: ") and needle in p.stderr and len(p.stderr.splitlines()) == 1
    assert p.stdout == ""


def test_a_run_without_controller_is_not_running_exit_3(tmp_path):
    run = a_run(tmp_path / "run", 1)
    (run / "controller.json").unlink()
    p = stop(str(run))
    assert p.returncode == 3, (p.stdout, p.stderr)
    assert p.stderr.startswith(f"error: {run} has no controller.json: the run's controller is not running")


def test_a_controller_that_refuses_is_an_error_exit_2(tmp_path):
    ending = Controller({"type": "error", "error": "the run has finished; it takes no more requests", "ending": True})
    try:
        run = a_run(tmp_path / "run", ending.port)
        p = stop(str(run), "--token", "other")
    finally:
        ending.close()
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert (
        p.stderr == f"error: {run}: the controller refused the stop: the run has finished; it takes no more requests\n"
    )
    assert json.dumps(ending.received) == json.dumps([{"type": "stop", "token": "other"}])
