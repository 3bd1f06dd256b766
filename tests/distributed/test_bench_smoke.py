"""Smoke tests of the benchmark scripts at their smallest sizes: they run, measure and write JSON.

The figures themselves are not asserted (benchmarks are not timed tests); the structure is.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.dist


def bench(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "benchmarks", *args], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return r


def test_scaling_smallest(tmp_path):
    out = tmp_path / "scaling.json"
    r = bench("scaling", "--sizes", "4", "--out", str(tmp_path / "runs"), "--json", str(out))
    data = json.loads(out.read_text())
    assert {(row["ranks"], row["mode"]) for row in data["rows"]} == {(4, "delta"), (4, "full")}
    assert all(isinstance(row["phase2_s"], float) for row in data["rows"])
    assert "delta phase2" in r.stdout


def test_memory_smallest(tmp_path):
    out = tmp_path / "memory.json"
    bench("memory", "--model", "tiny", "--steps", "30", "--out", str(tmp_path / "runs"), "--json", str(out))
    data = json.loads(out.read_text())
    assert [r["rank"] for r in data["stayers"]] == [0, 3]
    assert {r["role"] for r in data["standby_roles"]} == {"first", "last"}


def test_projection_from_a_downtime_file(tmp_path):
    downtime = tmp_path / "downtime.json"
    downtime.write_text(json.dumps({"tmslurm_planned_median_s": 0.5, "tmslurm_unexpected_median_s": 1.5, "rows": []}))
    out = tmp_path / "projection.json"
    r = bench("project", "--downtime-json", str(downtime), "--out", str(out))
    data = json.loads(out.read_text())
    assert {row["gpus"] for row in data["rows"]} >= {1024, 65536}
    assert data["assumptions"] and data["claims"]
    assert "GPU" in r.stdout


def test_checkpoint_stall_smallest(tmp_path):
    out = tmp_path / "ckpt.json"
    r = bench(
        "ckpt",
        "--model",
        "tiny",
        "--steps",
        "20",
        "--repeats",
        "1",
        "--out",
        str(tmp_path / "runs"),
        "--json",
        str(out),
    )
    data = json.loads(out.read_text())
    assert set(data["modes"]) == {"off", "sync", "async"}
    assert "ckpt_n" not in data["modes"]["off"]
    assert data["modes"]["sync"]["ckpt_n"] == data["modes"]["async"]["ckpt_n"] == 4  # steps 5, 10, 15, 20 (warm-up 3)
    assert all(isinstance(data["modes"][m]["stall_median_s"], float) for m in ("sync", "async"))
    assert (tmp_path / "runs" / "async-0" / "checkpoints" / "step_000020" / "stage0" / "meta.json").is_file()
    assert "| async |" in r.stdout
