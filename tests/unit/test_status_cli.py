"""``tmslurm status --watch`` and ``--job`` as a user runs them: a finished run, a run whose controller
is not (yet) there, Ctrl-C, a job id resolved through fake Slurm commands, and bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_client import fake
from tests.unit.test_launch_cli import CLI, _summary
from tmslurm.slurm.runtag import run_comment


def tmslurm(*args: str, path: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **({"PATH": path} if path is not None else {})}
    return subprocess.run(
        [sys.executable, "-c", CLI, *args], capture_output=True, text=True, timeout=60, env=env, cwd=cwd
    )


def _finished(run_dir: Path) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "summary.json").write_text(json.dumps(_summary()))
    return run_dir


def test_watch_of_a_finished_run_prints_one_plain_block_and_ends(tmp_path):
    p = tmslurm("status", "--watch", "--interval", "0.5", str(_finished(tmp_path / "run")))
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("run finished-run  finished  step 20/20") and "\x1b" not in p.stdout
    assert "standby0.123       spare0         warm: first, last" in p.stdout


def _starting(run_dir: Path) -> Path:
    """A run directory as tmslurm-launch leaves it before the controller advertises itself."""
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text("{}")
    return run_dir


def _watch(run_dir: Path, sigint_ignored: bool = False) -> subprocess.Popen:
    """``sigint_ignored``: start it as a shell without job control starts a background command."""
    return subprocess.Popen(
        [sys.executable, "-c", CLI, "status", "--watch", "--interval", "0.2", str(run_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None,
    )


def _first_line(proc: subprocess.Popen) -> str:
    line = proc.stdout.readline()
    assert line, proc.stderr.read()
    return line


def test_watch_waits_through_an_absent_controller_and_ends_with_the_run(tmp_path):
    run_dir = tmp_path / "run"
    _starting(run_dir)
    proc = _watch(run_dir)
    try:
        line = _first_line(proc)
        assert line.startswith("controller unreachable: ") and line.rstrip().endswith("retrying every 0.2s"), line
        _finished(run_dir)  # the run ends: its summary appears
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "run finished-run  finished" in out and "\x1b" not in out


@pytest.mark.parametrize("sigint_ignored", [False, True], ids=["foreground", "started-with-sigint-ignored"])
def test_ctrl_c_ends_the_watch_with_0(tmp_path, sigint_ignored):
    run_dir = tmp_path / "run"
    _starting(run_dir)
    proc = _watch(run_dir, sigint_ignored)
    try:
        assert "controller unreachable" in _first_line(proc)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err


def test_a_reader_that_goes_away_ends_the_watch_quietly(tmp_path):
    run_dir = tmp_path / "run"
    _starting(run_dir)
    proc = _watch(run_dir)
    try:
        assert "controller unreachable" in _first_line(proc)
        proc.stdout.close()  # like `| head -1` exiting
        err = proc.stderr.read()
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0 and err == "", err


def _fake_slurm(bin_dir: Path, jobs: dict[str, str]) -> str:
    """scontrol answering ``show job ID`` with a record carrying each job's comment; sacct knows nothing."""
    cases = "\n".join(
        f"  {jid}) printf 'JobId={jid} JobName=x\\n   JobState=RUNNING Restarts=0\\n   Comment=%s \\n   "
        f"StdOut=/dev/null\\n' '{comment}';;"
        for jid, comment in jobs.items()
    )
    fake(
        bin_dir,
        "scontrol",
        f'case "$3" in\n{cases}\n  *) echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1;;\nesac',
    )
    fake(bin_dir, "sacct", 'echo "JobID|State|WorkDir|Comment"')
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


def test_status_by_job_id_of_the_main_job_or_a_spare_from_any_directory(tmp_path):
    run_dir = _finished(tmp_path / "runs" / "demo")
    path = _fake_slurm(tmp_path / "bin", {"65": run_comment(run_dir), "66": run_comment(run_dir)})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for job in ("65", "66"):
        p = tmslurm("status", "--job", job, path=path, cwd=elsewhere)
        assert p.returncode == 0, p.stderr
        assert "run finished-run  mode=finished  step=20/20" in p.stdout


@pytest.mark.parametrize(
    "args, jobs, message",
    [
        (["--job", "99"], {}, "job 99 is unknown to Slurm"),
        (["--job", "70"], {"70": "nightly build"}, "job 70 is not a tmslurm job"),
        (["--job", "x1"], {}, "'x1' is not a Slurm job id"),
        (["--job", "65", "RUN"], {}, "give a run directory or --job JOBID (one of them)"),
        ([], {}, "give a run directory or --job JOBID (one of them)"),
        (["RUN", "--watch", "--json"], {}, "--watch and --json do not combine"),
        (["RUN", "--watch", "--interval", "0"], {}, "--interval must be > 0"),
        (["MISSING"], {}, "is not a run directory (no such directory)"),
        (["NOTARUN"], {}, "is not a tmslurm run (it has no config.json or summary.json)"),
        (["NOTARUN", "--watch"], {}, "is not a tmslurm run"),
    ],
)
def test_bad_input_is_one_error_line_and_exit_2(tmp_path, args, jobs, message):
    run_dir = _finished(tmp_path / "run")
    path = _fake_slurm(tmp_path / "bin", jobs)
    (tmp_path / "notarun").mkdir()
    named = {"RUN": str(run_dir), "MISSING": str(tmp_path / "missing"), "NOTARUN": str(tmp_path / "notarun")}
    args = [named.get(a, a) for a in args]
    p = tmslurm("status", *args, path=path)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert p.stderr.startswith("error:") and len(p.stderr.strip().splitlines()) == 1 and message in p.stderr


def test_status_by_job_id_without_slurm_names_the_missing_command(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    p = tmslurm("status", "--job", "65", path=str(empty))
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert p.stderr.startswith("error: cannot ask Slurm about job 65") and "'scontrol' not found" in p.stderr
