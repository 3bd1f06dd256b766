"""Helpers for tests that run real jobs: ranks and standbys are real processes on real gloo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

TIMEOUT = 240


class Run:
    """A ``tmslurm-launch cluster=local`` run in a subprocess."""

    def __init__(self, run_dir: Path, overrides: list[str]) -> None:
        self.run_dir = run_dir
        self.cmd = [sys.executable, "-m", "tmslurm.cli.launch", f"run_dir={run_dir}", *overrides]
        self.log = open(run_dir.parent / f"{run_dir.name}.launch.log", "wb")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT)

    def wait(self, timeout: float = TIMEOUT) -> dict[str, Any]:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired as e:
            self.proc.kill()
            raise AssertionError(f"run {self.run_dir} did not finish in {timeout}s:\n{self.output()[-3000:]}") from e
        assert rc == 0, f"launch exited {rc}:\n{self.output()[-4000:]}"
        return json.loads((self.run_dir / "summary.json").read_text())

    def output(self) -> str:
        return (self.run_dir.parent / f"{self.run_dir.name}.launch.log").read_text(errors="replace")

    def journal(self) -> list[dict[str, Any]]:
        path = self.run_dir / "events.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def wait_for(self, predicate, timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for entry in self.journal():
                if predicate(entry):
                    return entry
            assert self.proc.poll() is None, f"run ended early:\n{self.output()[-3000:]}"
            time.sleep(0.05)
        raise AssertionError(f"journal condition not met in {timeout}s")


@pytest.fixture
def launch(tmp_path):
    runs: list[Run] = []
    counter = iter(range(1000))

    def start(*overrides: str, name: str | None = None) -> Run:
        run = Run(tmp_path / (name or f"run{next(counter)}"), list(overrides))
        runs.append(run)
        return run

    yield start
    for run in runs:
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()


_BASELINES: dict[tuple[str, ...], dict[str, Any]] = {}
NOT_IN_THE_MATH = (
    "standby.",
    "runtime.",
    "detect.",
    "shadow.",
    "gray.",
    "metrics.",
    "security.",
    "bench.",
    "faults",
    "train.checkpoint_",
)
"""Overrides that must not change the trained state (that is the claim under test): the uninterrupted
run leaves them out, so it has no standby to warm and layouts that differ only in them share one run."""


def reference_overrides(overrides: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(sorted(o for o in overrides if not o.startswith(NOT_IN_THE_MATH)))


@pytest.fixture
def baseline(tmp_path_factory):
    """Uninterrupted run for a layout (cached per session): the hash every interrupted run must match.
    It runs with no standby, no fault, no checkpoint and no pacing (:data:`NOT_IN_THE_MATH`)."""

    def get(*overrides: str) -> dict[str, Any]:
        key = reference_overrides(overrides)
        if key not in _BASELINES:
            d = tmp_path_factory.mktemp("baseline")
            _BASELINES[key] = Run(d / "run", list(key)).wait()
        return _BASELINES[key]

    return get


os.environ.setdefault("TMSLURM_TEST", "1")
