"""Tests of CliSlurmClient against fake Slurm commands (small shell scripts), and of the backend choice."""

from __future__ import annotations

import os
import stat
import sys
import time
import types
from pathlib import Path

import pytest

from tmslurm.core.errors import ConfigError, SlurmError, SlurmParseError
from tmslurm.slurm import pyslurm_backend
from tmslurm.slurm.client import HINT, CliSlurmClient, make_client
from tmslurm.slurm.pyslurm_backend import PyslurmClient, available

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


def sample_body(version: str, name: str) -> Path:
    """A copy of the sample's output without its ``$ command`` line, for a fake command to cat."""
    return FIXTURES / version / name


def fake(bin_dir: Path, name: str, body: str) -> Path:
    """Write an executable ``bin_dir/name`` shell script that logs its argv, then runs ``body``."""
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text(f'#!/bin/sh\necho "$0 $*" >> "{bin_dir}/calls.log"\n{body}\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def client_with(bin_dir: Path, timeout_s: float = 10.0) -> CliSlurmClient:
    return CliSlurmClient(timeout_s=timeout_s, env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})


def calls(bin_dir: Path) -> list[str]:
    return [line.split(" ", 1)[1] for line in (bin_dir / "calls.log").read_text().splitlines()]


def cat_sample(version: str, name: str) -> str:
    return f"tail -n +2 '{sample_body(version, name)}'"


# ---------------------------------------------------------------------------------------------
# failures
# ---------------------------------------------------------------------------------------------


def test_missing_command_raises_slurm_error_with_hint(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    client = CliSlurmClient(env={"PATH": str(empty)})
    with pytest.raises(SlurmError) as info:
        client.nodes()
    message = str(info.value)
    assert "scontrol -o show node" in message and "not found" in message
    assert HINT in message and "slurmctld reachable" in message
    assert not isinstance(info.value, SlurmParseError)


def test_garbage_output_raises_parse_error(tmp_path):
    bin_dir = tmp_path / "bin"
    fake(bin_dir, "scontrol", "echo 'this is not slurm output'")
    with pytest.raises(SlurmParseError) as info:
        client_with(bin_dir).nodes()
    assert "this is not slurm output" in str(info.value)
    assert "scontrol -o show node" in str(info.value)


def test_timeout_raises_slurm_error_and_kills_the_command(tmp_path):
    bin_dir = tmp_path / "bin"
    fake(bin_dir, "scontrol", "sleep 30")
    started = time.monotonic()
    with pytest.raises(SlurmError) as info:
        client_with(bin_dir, timeout_s=0.5).reservations()
    assert time.monotonic() - started < 10  # the sleeping grandchild did not hold us up
    assert "timed out after 0.5s" in str(info.value) and HINT in str(info.value)


def test_nonzero_exit_raises_with_exit_code_and_stderr(tmp_path):
    bin_dir = tmp_path / "bin"
    fake(bin_dir, "scontrol", "echo 'slurm_load_node error: Unable to contact slurm controller' >&2; exit 1")
    with pytest.raises(SlurmError) as info:
        client_with(bin_dir).nodes()
    message = str(info.value)
    assert "exit code 1" in message and "Unable to contact slurm controller" in message and HINT in message


def test_bad_timeout_and_backend_names():
    with pytest.raises(ConfigError):
        CliSlurmClient(timeout_s=0)
    with pytest.raises(ConfigError, match="auto, cli, pyslurm"):
        make_client("slurmrestd")


# ---------------------------------------------------------------------------------------------
# commands and parsing
# ---------------------------------------------------------------------------------------------


def test_nodes_passes_a_compressed_hostlist_and_parses(tmp_path):
    bin_dir = tmp_path / "bin"
    fake(bin_dir, "scontrol", cat_sample("24.11", "scontrol-o-show-node-idle.txt"))
    nodes = client_with(bin_dir).nodes(["tn1", "tn2", "tn3", "tn4"])
    assert [n.name for n in nodes] == ["tn1", "tn2", "tn3", "tn4"]
    assert calls(bin_dir) == ["-o show node tn[1-4]"]
    assert client_with(bin_dir).nodes([]) == []  # nothing asked, nothing run
    assert len(calls(bin_dir)) == 1


def test_nodes_skips_unknown_names(tmp_path):
    bin_dir = tmp_path / "bin"
    fake(
        bin_dir,
        "scontrol",
        f"{cat_sample('22.05', 'scontrol-show-node-draining.txt')}\necho 'Node tmn9 not found'; exit 1",
    )
    (node,) = client_with(bin_dir).nodes(["tmn2", "tmn9"])
    assert (node.name, node.state) == ("tmn2", "MIXED+DRAIN")


def test_job_found_and_unknown(tmp_path):
    bin_dir = tmp_path / "bin"
    fake(
        bin_dir,
        "scontrol",
        f'if [ "$4" = 10 ]; then {cat_sample("22.05", "scontrol-o-show-job-running.txt")};'
        " else echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1; fi",
    )
    client = client_with(bin_dir)
    job = client.job(10)
    assert (job.job_id, job.nodes, job.batch_host) == ("10", ["tmn1", "tmn2", "tmn3"], "tmn1")
    assert client.job(99) is None


def test_reservations_sacct_version(tmp_path):
    bin_dir = tmp_path / "bin"
    fake(bin_dir, "scontrol", cat_sample("24.11", "scontrol-o-show-res-maint.txt"))
    fake(bin_dir, "sacct", cat_sample("22.05", "sacct-parsable2.txt"))
    fake(bin_dir, "sinfo", "echo 'slurm 24.11.5'")
    client = client_with(bin_dir)
    (resv,) = client.reservations()
    assert resv.is_maint and resv.nodes == ["tn1"]
    assert len(client.sacct(10)) == 13
    assert client.version() == "24.11.5"
    assert calls(bin_dir)[1].startswith("-j 10 --parsable2 -o JobID,")


def test_actions_build_the_right_command_lines(tmp_path, monkeypatch):
    bin_dir, work = tmp_path / "bin", tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    fake(bin_dir, "sbatch", "echo '42;cluster'")
    fake(bin_dir, "scancel", "true")
    fake(bin_dir, "scontrol", 'case "$2" in jobid=*) touch slurm_job_10_resize.sh;; esac')
    client = client_with(bin_dir)
    assert client.submit("job.sh", ["--nodes=2", "--no-kill"], ["--epochs", "3"]) == "42"
    client.cancel(42)
    client.update_job_nodelist(10, ["tmn1", "tmn3"])
    client.update_node("tmn2", "DRAIN", "firmware upgrade")
    client.update_node("tmn2", "RESUME")
    assert calls(bin_dir) == [
        "--parsable --nodes=2 --no-kill job.sh --epochs 3",
        "42",
        "update jobid=10 nodelist=tmn[1,3]",
        "update nodename=tmn2 state=DRAIN reason=firmware upgrade",
        "update nodename=tmn2 state=RESUME",
    ]
    assert list(work.iterdir()) == []  # scontrol's resize scripts went to a scratch directory
    with pytest.raises(SlurmError, match="no nodes"):
        client.update_job_nodelist(10, [])


def test_time_format_is_forced_for_commands(tmp_path):
    bin_dir = tmp_path / "bin"
    fake(bin_dir, "sinfo", 'echo "slurm $SLURM_TIME_FORMAT"')
    client = CliSlurmClient(env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SLURM_TIME_FORMAT": "relative"})
    with pytest.raises(SlurmParseError, match="slurm standard"):
        client.version()  # the fake printed the variable it got: "standard", whatever we asked


# ---------------------------------------------------------------------------------------------
# backend choice (pyslurm is not installed here; fakes stand in for the module)
# ---------------------------------------------------------------------------------------------


class FixedVersion:
    def __init__(self, version=None, error=None):
        self._version, self._error = version, error

    def version(self):
        if self._error:
            raise self._error
        return self._version


def fake_pyslurm(version: str) -> types.ModuleType:
    module = types.ModuleType("pyslurm")
    module.__version__ = version
    return module


def test_make_client_auto_falls_back_to_cli_without_pyslurm(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "pyslurm", None)  # makes `import pyslurm` raise ImportError
    with caplog.at_level("INFO", logger="tmslurm.slurm.client"):
        client = make_client("auto")
    assert type(client) is CliSlurmClient
    assert "pyslurm not used" in caplog.text and "not installed" in caplog.text
    assert type(make_client("pyslurm")) is CliSlurmClient
    assert type(make_client("cli")) is CliSlurmClient


def test_available_reasons(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyslurm", None)
    ok, why = available(FixedVersion("22.05.8"))
    assert not ok and "not installed" in why
    monkeypatch.setitem(sys.modules, "pyslurm", fake_pyslurm("25.11.0"))
    ok, why = available(FixedVersion("22.05.8"))
    assert not ok and "25.11" in why and "22.05.8" in why
    ok, why = available(FixedVersion(error=SlurmError("no controller")))
    assert not ok and "no controller" in why
    monkeypatch.setitem(sys.modules, "pyslurm", fake_pyslurm(""))
    assert not available(FixedVersion("25.11.1"))[0]
    monkeypatch.setitem(sys.modules, "pyslurm", fake_pyslurm("25.11.0"))
    assert available(FixedVersion("25.11.1")) == (True, "pyslurm 25.11.0 matches Slurm 25.11.1")


def test_make_client_picks_a_matching_pyslurm(monkeypatch, tmp_path):
    bin_dir = tmp_path / "bin"
    fake(bin_dir, "sinfo", "echo 'slurm 25.11.1'")
    monkeypatch.setitem(sys.modules, "pyslurm", fake_pyslurm("25.11.0"))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert isinstance(make_client("auto"), PyslurmClient)


def test_pyslurm_client_maps_fake_objects():
    """Only the mapping, on stand-in objects shaped like pyslurm's (no real pyslurm here)."""
    module = fake_pyslurm("25.11.0")
    node = types.SimpleNamespace(name="n2", state="MIXED+DRAIN", reason="firmware upgrade")
    module.Nodes = types.SimpleNamespace(load=lambda: {"n2": node})
    job = types.SimpleNamespace(
        id=7,
        state="RUNNING",
        allocated_nodes="n[1-2]",
        batch_host="n1",
        requeue_count=0,
        is_requeueable=True,
        state_reason="None",
    )
    module.Job = types.SimpleNamespace(load=lambda job_id: job)
    client = PyslurmClient(FixedVersion("25.11.1"), module=module)
    (info,) = client.nodes(["n2"])
    assert (info.name, info.base_state, info.flags, info.reason) == ("n2", "MIXED", {"DRAIN"}, "firmware upgrade")
    assert client.nodes(["n9"]) == []
    assert client.job(7).nodes == ["n1", "n2"]
    assert client.version() == "25.11.1"
    assert pyslurm_backend._flag_names("MAINT,IGNORE_JOBS") == ["MAINT", "IGNORE_JOBS"]
