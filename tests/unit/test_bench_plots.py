"""benchmarks.plots on synthetic downtime.json and scaling.json files: markdown, valid PNGs, errors
naming the file, and the ``python -m benchmarks plots`` entry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from benchmarks.__main__ import main as bench_main  # noqa: E402
from benchmarks.plots import write_bench_plots  # noqa: E402
from tmslurm.core.errors import TmslurmError  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _downtime() -> dict:
    rows = []
    for repeat in range(3):
        for event in ("planned", "unexpected", "hang"):
            rows.append(
                {
                    "event": event,
                    "strategy": "tmslurm",
                    "repeat": repeat,
                    "downtime_s": 1.5 + repeat * 0.1,
                    "parts": {"detect_s": 0.2, "phase2_s": 0.3, "transfer_s": 0.4, "first_step_s": 0.6},
                }
            )
            rows.append(
                {
                    "event": event,
                    "strategy": "injob_restart",
                    "repeat": repeat,
                    "downtime_s": 30.0 + repeat,
                    "parts": {
                        "stop_s": 1,
                        "startup_s": 5,
                        "group_setup_s": 2,
                        "ckpt_load_s": 3,
                        "warmup_s": 15,
                        "redo_s": 4,
                    },
                }
            )
            rows.append(
                {
                    "event": event,
                    "strategy": "requeue_restart",
                    "repeat": repeat,
                    "downtime_s": 150.0 + repeat,
                    "parts": {
                        "stop_s": 1,
                        "reschedule_s": 121,
                        "startup_s": 5,
                        "group_setup_s": 2,
                        "ckpt_load_s": 3,
                        "warmup_s": 15,
                        "redo_s": 4,
                    },
                }
            )
    return {
        "rows": rows,
        "medians": {},
        "ratio_planned": 19.4,
        "ratio_unexpected": 19.4,
        "ratio_planned_requeue": 94.4,
        "ratio_unexpected_requeue": 94.4,
    }


def _scaling() -> dict:
    rows = []
    for ranks in (4, 8, 16, 32):
        rows.append({"ranks": ranks, "mode": "delta", "phase2_s": 0.05, "downtime_s": 1.2})
        rows.append({"ranks": ranks, "mode": "full", "phase2_s": 0.1 * ranks, "downtime_s": 1.2 + 0.1 * ranks})
    return {"rows": rows}


def _write(path: Path, data) -> Path:
    path.write_text(json.dumps(data))
    return path


@pytest.fixture()
def plots(tmp_path: Path) -> Path:
    return write_bench_plots(
        tmp_path / "out",
        downtime_json=_write(tmp_path / "downtime.json", _downtime()),
        scaling_json=_write(tmp_path / "scaling.json", _scaling()),
    )


def test_bench_md_has_both_sections(plots: Path) -> None:
    text = plots.read_text()
    assert plots.name == "bench.md"
    assert "injob_restart" in text and "requeue_restart" in text
    assert "ratio_planned = 19.4" in text
    assert "ranks" in text and "delta" in text and "full" in text


@pytest.mark.parametrize("name", ["downtime_compare.png", "bench_parts.png", "scaling.png"])
def test_pngs_are_valid_and_linked(plots: Path, name: str) -> None:
    data = (plots.parent / name).read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 10_000
    assert f"({name})" in plots.read_text()


def test_scaling_only(tmp_path: Path) -> None:
    out = write_bench_plots(tmp_path, scaling_json=_write(tmp_path / "scaling.json", _scaling()))
    assert (tmp_path / "scaling.png").exists()
    assert not (tmp_path / "downtime_compare.png").exists()
    assert "restart baselines" not in out.read_text()


def test_missing_bench_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(TmslurmError, match="nope.json"):
        write_bench_plots(tmp_path / "out", downtime_json=tmp_path / "nope.json")
    assert not (tmp_path / "out").exists()


def test_rows_not_a_list_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(TmslurmError, match="bad.json.*rows"):
        write_bench_plots(tmp_path / "out", scaling_json=_write(tmp_path / "bad.json", {"rows": 3}))


def test_no_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(TmslurmError, match="--downtime-json"):
        write_bench_plots(tmp_path)


def test_cli_entry(tmp_path: Path, capsys) -> None:
    dt = _write(tmp_path / "downtime.json", _downtime())
    assert bench_main(["plots", "--downtime-json", str(dt), "--out", str(tmp_path / "o")]) == 0
    assert (tmp_path / "o" / "bench.md").exists()
    assert bench_main(["plots", "--scaling-json", str(tmp_path / "nope.json"), "--out", str(tmp_path / "p")]) == 1
    assert "nope.json" in capsys.readouterr().out
