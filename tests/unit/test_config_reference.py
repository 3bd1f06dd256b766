"""docs/config-reference.md is what scripts/config-reference writes from the config dataclasses."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

from tmslurm.core.config import RunConfig
from tmslurm.core.config.fielddocs import first_sentence, keys, sections
from tmslurm.core.config.reference import COMMAND, PAGE, render

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_reference_is_what_the_script_writes():
    committed = (ROOT / PAGE).read_text()
    assert committed == render(), f"{PAGE} is stale: run {COMMAND} and commit the result"


def test_every_key_of_every_section_is_in_the_reference():
    page = render()
    for name, cls in sections():
        for f in dataclasses.fields(cls):
            assert f"`{name}.{f.name}`" in page, f"{name}.{f.name} missing from the reference"
    for f in dataclasses.fields(RunConfig):
        if not dataclasses.is_dataclass(f.default_factory) and f.name != "defaults":
            assert f"`{f.name}`" in page


def test_the_keys_the_old_table_missed_are_there_with_their_docstrings():
    by_path = {k.path: k for k in keys()}
    for path in (
        "model.hf_config",
        "model.hf_tokenizer",
        "slurm.spare_time",
        "slurm.spare_renew_s",
        "metrics.monitor_port",
    ):
        k = by_path[path]
        assert k.doc and f"`{path}`" in render()
    assert by_path["parallel.dp"].type == "int" and by_path["parallel.dp"].default == "2"
    assert by_path["slurm.account"].default == "null" and by_path["run_dir"].default == '""'
    assert by_path["faults[i].kind"].default == "(required)"


def test_the_benchmark_only_switches_come_last_under_their_own_heading():
    page = render()
    head = page.index("# Benchmark-only switches")
    for path in (
        "bench.restart_mode",
        "bench.switch_mode",
        "bench.commit_vote",
        "bench.heartbeats",
        "bench.step_delay_s",
    ):
        assert page.index(f"`{path}`") > head, path
    assert page.index("`gray.evict`") < head and page.index("`detect.heartbeat_timeout_s`") < head


def test_first_sentence_is_one_line():
    assert first_sentence("Spare nodes: each holds\nstandbys. More text.") == "Spare nodes: each holds standbys."


def test_the_script_check_mode_agrees(tmp_path):
    p = subprocess.run(
        [sys.executable, str(ROOT / COMMAND), "--check"], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "up to date" in p.stdout
