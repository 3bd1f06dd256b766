"""Which run a Slurm job belongs to (:mod:`tmslurm.slurm.runtag`): the comment's format and its
parsing, the job record from real ``scontrol show job`` / ``sacct`` output, the derivation of the run
directory, and :func:`resolve_job`'s failures, including through the CLI client with fake commands."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_client import client_with, fake, sample_body
from tmslurm.core.errors import SlurmError, SlurmParseError, TmslurmError
from tmslurm.slurm.client import CliSlurmClient
from tmslurm.slurm.runtag import (
    JobRecord,
    RunTag,
    parse_job_record,
    parse_run_tag,
    parse_sacct_record,
    resolve_job,
    run_comment,
    run_dir_of,
)


@pytest.mark.parametrize(
    "name", ["run", "demo-2", "with space", 'it\'s "quoted"', "pipe|and%percent", "tab\there", "ünï"]
)
def test_the_comment_is_three_words_and_reads_back(tmp_path, name):
    run_dir = tmp_path / name
    comment = run_comment(run_dir)
    assert len(comment.split()) == 3 and "'" not in comment and '"' not in comment and "|" not in comment
    assert parse_run_tag(comment) == RunTag(name, run_dir)


def test_a_relative_run_dir_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert parse_run_tag(run_comment(Path("runs/demo"))) == RunTag("demo", tmp_path / "runs" / "demo")


@pytest.mark.parametrize(
    "comment, tag",
    [
        ("tmslurm run=demo dir=/shared/runs/demo", RunTag("demo", Path("/shared/runs/demo"))),
        ("tmslurm run=demo", RunTag("demo", None)),  # a tmslurm from before dir=
        ("  tmslurm run=demo dir=/r/a%20b  ", RunTag("demo", Path("/r/a b"))),
        ("", None),
        ("nightly build", None),
        ("tmslurm", None),
        ("tmslurm run=", None),
        ("tmslurm run=a dir=/x extra=1", None),
    ],
)
def test_parse_run_tag(comment, tag):
    assert parse_run_tag(comment) == tag


def _with_comment(text: str, comment: str) -> str:
    """A real multi-line sample with a ``Comment=`` line where Slurm prints it (after WorkDir, before StdErr)."""
    return text.replace("   StdErr=", f"   Comment={comment} \n   StdErr=", 1)


@pytest.mark.parametrize("version", ["22.05", "24.11"])
def test_job_record_of_real_scontrol_output_with_a_tmslurm_comment(version):
    text = sample_body(version, "scontrol-show-job-running.txt").read_text().split("\n", 1)[1]
    job_id = text.split()[0].split("=")[1]
    rec = parse_job_record(_with_comment(text, "tmslurm run=demo dir=/shared/runs/my%20demo"), job_id)
    assert rec is not None and rec.job_id == job_id and rec.state == "RUNNING"
    assert rec.comment == "tmslurm run=demo dir=/shared/runs/my%20demo" and rec.std_out == "/dev/null" and rec.work_dir
    assert run_dir_of(rec) == Path("/shared/runs/my demo")


@pytest.mark.parametrize("version", ["22.05", "24.11"])
def test_job_record_of_a_job_without_comment_is_not_a_tmslurm_job(version):
    text = sample_body(version, "scontrol-show-job-single-node-requeued.txt").read_text().split("\n", 1)[1]
    rec = parse_job_record(text, text.split()[0].split("=")[1])
    assert rec is not None and rec.comment == ""
    with pytest.raises(TmslurmError, match="is not a tmslurm job .*has no comment"):
        run_dir_of(rec)


@pytest.mark.parametrize(
    "text, job_id, expect",
    [
        ("", "5", None),
        ("No jobs in the system\n", "5", None),
        ("JobId=5 JobName=x\n   Comment=tmslurm run=a \n", "5", SlurmParseError),  # no JobState: truncated
        ("garbage\n", "5", SlurmParseError),
    ],
)
def test_job_record_edge_cases(text, job_id, expect):
    if expect is SlurmParseError:
        with pytest.raises(SlurmParseError):
            parse_job_record(text, job_id)
    else:
        assert parse_job_record(text, job_id) == expect


HEADER = "JobID|State|WorkDir|Comment"


@pytest.mark.parametrize(
    "text, expect",
    [
        (f"{HEADER}\n", None),
        ("", None),
        (
            f"{HEADER}\n7|COMPLETED|/home/u|tmslurm run=r dir=/s/r\n",
            JobRecord("7", "COMPLETED", "tmslurm run=r dir=/s/r", "/home/u", ""),
        ),
        (
            f"{HEADER}\n7|REQUEUED|/home/u|tmslurm run=r dir=/s/r\n7|RUNNING|/home/u|tmslurm run=r dir=/s/r\n",
            JobRecord("7", "RUNNING", "tmslurm run=r dir=/s/r", "/home/u", ""),
        ),  # a requeued job: the last row is current
        (f"{HEADER}\n7|COMPLETED|/home/u|a|b comment\n", JobRecord("7", "COMPLETED", "a|b comment", "/home/u", "")),
        (f"{HEADER}\n7|COMPLETED|/home/u|\n", JobRecord("7", "COMPLETED", "", "/home/u", "")),
    ],
)
def test_parse_sacct_record(text, expect):
    assert parse_sacct_record(text, "7") == expect


@pytest.mark.parametrize("text", ["JobID|JobName|State\n7|x|RUNNING\n", f"{HEADER}\n7|RUNNING\n"])
def test_parse_sacct_record_rejects_other_output(text):
    with pytest.raises(SlurmParseError):
        parse_sacct_record(text, "7")


@pytest.mark.parametrize(
    "comment, std_out, expect",
    [
        ("tmslurm run=demo dir=/s/runs/demo", "/dev/null", Path("/s/runs/demo")),
        (
            "tmslurm run=demo",
            "/s/runs/demo/submitit/42_0_log.out",
            Path("/s/runs/demo"),
        ),  # older tmslurm: submitit's output
        ("tmslurm run=demo", "/s/runs/other/submitit/42_0_log.out", "does not say where"),
        ("tmslurm run=demo", "", "does not say where"),
        ("nightly build", "/s/runs/demo/submitit/42_0_log.out", "not a tmslurm job .*'nightly build'"),
    ],
)
def test_run_dir_of(comment, std_out, expect):
    rec = JobRecord("42", "RUNNING", comment, "/home/u", std_out)
    if isinstance(expect, Path):
        assert run_dir_of(rec) == expect
    else:
        with pytest.raises(TmslurmError, match=expect):
            run_dir_of(rec)


class FakeClient:
    """``job_record``/``accounted_job`` answers by job id; an exception instance is raised."""

    def __init__(self, live: dict, accounted: dict | Exception) -> None:
        self.live, self.accounted = live, accounted

    def job_record(self, job_id):
        return self.live.get(job_id)

    def accounted_job(self, job_id):
        if isinstance(self.accounted, Exception):
            raise self.accounted
        return self.accounted.get(job_id)


def _rec(job_id: str, comment: str, state: str = "RUNNING") -> JobRecord:
    return JobRecord(job_id, state, comment, "/home/u", "")


def test_resolve_job_main_spare_and_finished_jobs_give_the_same_run(tmp_path):
    run = tmp_path / "runs" / "demo"
    run.mkdir(parents=True)
    comment = run_comment(run)
    client = FakeClient({"10": _rec("10", comment), "11": _rec("11", comment)}, {"9": _rec("9", comment, "COMPLETED")})
    assert resolve_job(client, "10") == resolve_job(client, "11") == resolve_job(client, "9") == run


@pytest.mark.parametrize(
    "job_id, live, accounted, message",
    [
        ("12", {}, {}, "job 12 is unknown to Slurm"),
        (
            "12",
            {},
            SlurmError("`sacct ...` failed with exit code 1: Slurm accounting storage is disabled"),
            "unknown to slurmctld, and accounting could not be asked: .*accounting storage is disabled",
        ),
        (
            "12",
            {},
            {"12": _rec("12", "", "COMPLETED")},
            "accounting keeps no comment .*AccountingStoreFlags=job_comment",
        ),
        ("12", {"12": _rec("12", "")}, {}, "job 12 is not a tmslurm job"),
        (
            "12",
            {"12": _rec("12", "tmslurm run=gone dir=/nonexistent-tmslurm-run/gone")},
            {},
            "does not exist on this machine",
        ),
        ("12x", {}, {}, "'12x' is not a Slurm job id"),
        ("", {}, {}, "'' is not a Slurm job id"),
    ],
)
def test_resolve_job_failures_name_the_job(job_id, live, accounted, message):
    with pytest.raises(TmslurmError, match=message):
        resolve_job(FakeClient(live, accounted), job_id)


def test_cli_client_job_record_and_unknown_job(tmp_path):
    bin_dir = tmp_path / "bin"
    text = _with_comment(
        sample_body("22.05", "scontrol-show-job-running.txt").read_text().split("\n", 1)[1],
        "tmslurm run=demo dir=/s/demo",
    )
    (tmp_path / "job.txt").write_text(text)
    fake(
        bin_dir,
        "scontrol",
        f"""case "$3" in
  10) cat '{tmp_path / "job.txt"}';;
  *) echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1;;
esac""",
    )
    fake(bin_dir, "sacct", 'echo "JobID|State|WorkDir|Comment"')
    client = client_with(bin_dir)
    assert client.job_record("10").comment == "tmslurm run=demo dir=/s/demo"
    assert client.job_record("99") is None and client.accounted_job("99") is None
    with pytest.raises(TmslurmError, match="job 99 is unknown to Slurm"):
        resolve_job(client, "99")


def test_cli_client_without_slurm_names_the_missing_command(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TmslurmError) as info:
        resolve_job(CliSlurmClient(env={"PATH": str(empty)}), "10")
    assert "cannot ask Slurm about job 10" in str(info.value) and "'scontrol' not found" in str(info.value)


def test_cli_client_scontrol_failure_is_a_slurm_error(tmp_path):
    bin_dir = tmp_path / "bin"
    fake(bin_dir, "scontrol", 'echo "slurm_load_jobs error: Unable to contact slurm controller" >&2; exit 1')
    with pytest.raises(SlurmError, match="Unable to contact"):
        client_with(bin_dir).job_record("10")
