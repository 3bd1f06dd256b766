"""report.write_report on a synthetic run: markdown, valid PNGs, errors; the benchmark options
that moved to ``python -m benchmarks plots`` give an error naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from tmslurm.cli.commands import main as tmslurm_main  # noqa: E402
from tmslurm.cli.report import write_report  # noqa: E402
from tmslurm.core.errors import TmslurmError  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
T0 = 1_700_000_000.0


def _summary() -> dict:
    steps, t = [], T0
    for step in range(60):
        dt = 0.2 + (2.0 if step in (15, 30, 45) else 0.0)
        t += dt
        steps.append({"step": step, "t_end": t, "dt": dt, "loss": 5.0 - step * 0.05})
    base = {
        "ranks": [1],
        "node": "n2",
        "standby": "s1",
        "detect_s": 0.01,
        "pick_s": 0.02,
        "phase1_s": 1.5,
        "phase2_s": 0.3,
        "transfer_s": 0.4,
        "first_step_s": 0.5,
    }
    events = [
        dict(base, kind="drain", notice_t=T0 + 3.0, downtime_s=1.3),
        dict(base, kind="kill", ranks=[3], node="n4", notice_t=T0 + 8.0, detect_s=0.8, transfer_s=None, downtime_s=2.1),
        {
            "kind": "node_down",
            "ranks": [2],
            "node": "n3",
            "standby": "s2",
            "notice_t": T0 + 13.0,
            "detect_s": 1.2,
            "phase2_s": 0.4,
            "downtime_s": 1.8,
            "extra_key": "kept",
        },
    ]
    return {
        "run_id": "r-test",
        "layout": {"dp": 2, "pp": 2, "tp": 1},
        "steps": 60,
        "final_params_sha256": "ab" * 32,
        "final_state_sha256": "cd" * 32,
        "loss_first": 5.0,
        "loss_last": 2.05,
        "median_step_s": 0.2,
        "step_log": steps,
        "events": events,
    }


def _write(path: Path, data) -> Path:
    path.write_text(json.dumps(data))
    return path


@pytest.fixture()
def report(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    _write(run / "summary.json", _summary())
    return write_report(run)


def test_report_md_mentions_every_event(report: Path) -> None:
    text = report.read_text()
    assert report.parent.name == "report"
    assert "r-test" in text
    for needle in ("drain", "kill", "node_down", "n2", "n4", "n3"):
        assert needle in text
    assert "transfer_s" in text  # the null/missing part is noted
    assert "benchmark" not in text.lower()


@pytest.mark.parametrize("name", ["throughput.png", "downtime_parts.png"])
def test_pngs_are_valid_and_linked(report: Path, name: str) -> None:
    png = report.parent / name
    data = png.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 10_000
    assert f"({name})" in report.read_text()


def test_run_without_events(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    _write(run / "summary.json", dict(_summary(), events=[]))
    out = write_report(run, tmp_path / "out")
    assert out == tmp_path / "out" / "report.md"
    assert "No interruptions" in out.read_text()
    assert (tmp_path / "out" / "throughput.png").exists()
    assert not (tmp_path / "out" / "downtime_parts.png").exists()


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "[1, 2]",
        json.dumps(dict(_summary(), step_log=3)),
        json.dumps(dict(_summary(), events=[1, 2])),
        json.dumps(dict(_summary(), unknown=1)),
        json.dumps({k: v for k, v in _summary().items() if k != "run_id"}),
    ],
)
def test_corrupt_summary_names_file(tmp_path: Path, content: str) -> None:
    (tmp_path / "summary.json").write_text(content)
    with pytest.raises(TmslurmError, match="summary.json"):
        write_report(tmp_path)
    assert not (tmp_path / "report").exists()


def test_missing_summary_names_file(tmp_path: Path) -> None:
    with pytest.raises(TmslurmError, match="summary.json"):
        write_report(tmp_path)


@pytest.mark.parametrize("option", ["--downtime-json", "--scaling-json"])
def test_moved_benchmark_option_names_the_new_command(tmp_path: Path, capsys, option: str) -> None:
    _write(tmp_path / "summary.json", _summary())
    assert tmslurm_main(["report", str(tmp_path), option, "x.json"]) == 2
    err = capsys.readouterr().err
    assert option in err and "python -m benchmarks plots" in err
    assert not (tmp_path / "report").exists()
