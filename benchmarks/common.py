"""Shared helpers of the benchmarks: run jobs, poll their status, summarise figures.

Contract: :class:`SlurmJob` launches ``tmslurm-launch cluster=slurm`` and polls ``tmslurm status``;
:func:`run_local` runs a ``cluster=local`` job to completion and returns its summary; :func:`progress`
reports a driver's units (cells, events) done with an estimate of the time left. Timeouts raise
:class:`~tmslurm.core.errors.TmslurmError` with the tail of the run's logs.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from tmslurm.core.errors import TmslurmError
from tmslurm.core.progress import Progress
from tmslurm.tools.slurm_job import SlurmJob, local_slurm, resume_node, sh  # noqa: F401 (the benchmarks' names)
from tmslurm.wire.protocol import request

REPO = Path(__file__).resolve().parents[1]
"""The repository root: benchmarks/ is not installed, so its own processes start from there."""


def recorded_command(sub: str, argv: list[str] | None = None) -> str:
    """``python -m benchmarks <sub> ARGS`` as a result file records it: an absolute path (a
    scratch directory or file of this machine) becomes ``<scratch dir>`` after ``--out`` and
    ``<scratch file>`` elsewhere, so the record names no machine path."""
    args = sys.argv[2:] if argv is None else argv
    kept = [
        ("<scratch dir>" if i and args[i - 1] == "--out" else "<scratch file>") if a.startswith("/") else a
        for i, a in enumerate(args)
    ]
    return " ".join([f"python -m benchmarks {sub}", *kept])


def say(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def progress(sub: str, total: int | None, label: str) -> Progress:
    """A benchmark's progress (:mod:`tmslurm.core.progress`): plain lines, each flushed, on stdout with
    :func:`say`'s, which come between its updates (so never redrawn in place, even on a terminal)."""
    return Progress(total, label, sys.stdout, title=f"[bench] {sub} progress", inplace=False)


def median(xs: Iterable[object]) -> float | None:
    """The median of the numbers among ``xs`` (other items, ``None`` say, are left out); ``None`` if none."""
    nums = [x for x in xs if isinstance(x, (int, float))]
    return statistics.median(nums) if nums else None


def median_of(xs: Iterable[object], what: str) -> float:
    """:func:`median` where a figure must come out: raises :class:`TmslurmError` naming ``what`` if
    ``xs`` holds no number."""
    m = median(xs)
    if m is None:
        raise TmslurmError(f"no samples of {what}: the runs recorded none (see their logs)")
    return m


def run_local(run_dir: Path, overrides: list[str], timeout: float = 900) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "tmslurm.cli.launch", "cluster=local", f"run_dir={run_dir}", *overrides]
    log = run_dir.parent / f"{run_dir.name}.log"
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
    if r.returncode != 0:
        raise TmslurmError(f"run {run_dir} failed (rc {r.returncode}); see {log}:\n{log.read_text()[-2000:]}")
    return json.loads((run_dir / "summary.json").read_text())


class LocalJob:
    """A ``cluster=local`` run in the background, driven through its control port."""

    def __init__(self, run_dir: Path, overrides: list[str]) -> None:
        self.run_dir = run_dir
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(run_dir.parent / f"{run_dir.name}.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tmslurm.cli.launch", "cluster=local", f"run_dir={run_dir}", *overrides],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def journal(self) -> list[dict[str, Any]]:
        p = self.run_dir / "events.jsonl"
        return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []

    def wait_journal(self, pred: Callable[[dict[str, Any]], bool], timeout: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in self.journal():
                if pred(e):
                    return e
            if self.proc.poll() is not None:
                raise TmslurmError(f"run {self.run_dir} ended while waiting for {what}")
            time.sleep(0.2)
        raise TmslurmError(f"timed out after {timeout:.0f}s waiting for {what} ({self.run_dir})")

    def request(self, msg: dict[str, Any]) -> dict[str, Any]:
        return request(self.run_dir, msg, timeout_s=10)

    def finish(self, timeout: float = 600) -> dict[str, Any]:
        self.request({"type": "stop"})
        self.proc.wait(timeout)
        return json.loads((self.run_dir / "summary.json").read_text())


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str))
    say(f"wrote {path}")


def is_root() -> bool:
    return os.geteuid() == 0


def commit() -> str:
    """The measured commit (short hash, ``-dirty`` with uncommitted changes to tracked files), or ``unknown``."""
    try:
        r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return r.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "") if r.returncode == 0 else "unknown"
