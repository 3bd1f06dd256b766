"""Shared helpers of the benchmarks: run jobs, poll their status, summarise figures.

Contract: :class:`SlurmJob` launches ``tmslurm-launch cluster=slurm`` and polls ``tmslurm status``;
:func:`run_local` runs a ``cluster=local`` job to completion and returns its summary. Timeouts raise
:class:`~tmslurm.errors.TmslurmError` with the tail of the run's logs.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from tmslurm.errors import TmslurmError
from tmslurm.runtime.protocol import request


def recorded_command(sub: str, argv: list[str] | None = None) -> str:
    """``python -m tmslurm.bench <sub> ARGS`` as a result file records it: an absolute path (a
    scratch directory or file of this machine) becomes ``<scratch dir>`` after ``--out`` and
    ``<scratch file>`` elsewhere, so the record names no machine path."""
    args = sys.argv[2:] if argv is None else argv
    kept = [("<scratch dir>" if i and args[i - 1] == "--out" else "<scratch file>") if a.startswith("/") else a
            for i, a in enumerate(args)]
    return " ".join([f"python -m tmslurm.bench {sub}", *kept])


def say(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def median(xs: list[float]) -> float | None:
    xs = [x for x in xs if isinstance(x, (int, float))]
    return statistics.median(xs) if xs else None


def run_local(run_dir: Path, overrides: list[str], timeout: float = 900) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "tmslurm.launch", "cluster=local", f"run_dir={run_dir}", *overrides]
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
        self.proc = subprocess.Popen([sys.executable, "-m", "tmslurm.launch", "cluster=local", f"run_dir={run_dir}", *overrides],
                                     stdout=self.log, stderr=subprocess.STDOUT)

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


def sh(*cmd: str, check: bool = True, timeout: float = 120) -> str:
    r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise TmslurmError(f"{' '.join(cmd)} failed: {r.stderr.strip()[-500:]}")
    return r.stdout


class SlurmJob:
    def __init__(self, run_dir: Path, overrides: list[str]) -> None:
        self.run_dir = run_dir
        out = sh(sys.executable, "-m", "tmslurm.launch", "cluster=slurm", f"run_dir={run_dir}", *overrides)
        self.job_id = out.split("main job ")[1].split(":")[0]
        say(f"main job {self.job_id} -> {run_dir}")

    def status(self) -> dict[str, Any]:
        try:
            return request(self.run_dir, {"type": "status"}, timeout_s=5)["status"]
        except (TmslurmError, KeyError, OSError):
            return {}

    def wait(self, pred: Callable[[dict[str, Any]], bool], timeout: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.status()
            if st and pred(st):
                return st
            if (self.run_dir / "summary.json").exists():
                raise TmslurmError(f"run ended while waiting for {what}")
            time.sleep(0.5)
        raise TmslurmError(f"timed out after {timeout:.0f}s waiting for {what} (job {self.job_id}, run {self.run_dir})")

    def warm_pool(self, n: int, timeout: float = 600) -> dict[str, Any]:
        roles = None
        return self.wait(lambda st: sum(1 for s in st.get("standbys", []) if len(s["roles"]) >= len(_roles(st)) and not s["busy"]) >= n,
                         timeout, f"{n} warm standby(s)")

    def events_done(self, st: dict[str, Any]) -> list[dict[str, Any]]:
        return [e for e in st.get("events", []) if e.get("status") == "done"]

    def done_count(self) -> int:
        return len(self.events_done(self.status()))

    def wait_event(self, before: int, t_inject: float, timeout: float = 900) -> dict[str, Any]:
        """The first event completed after ``before`` others whose notice came after the injection."""
        def new(st: dict[str, Any]) -> list[dict[str, Any]]:
            return [e for e in self.events_done(st)[before:] if (e.get("notice_t") or 0) >= t_inject - 0.5]
        st = self.wait(lambda s: bool(new(s)), timeout, "the injected event to complete")
        return new(st)[0]

    def node_of_rank(self, rank: int) -> tuple[str, int]:
        st = self.status()
        r = next(x for x in st["ranks"] if x["rank"] == rank)
        return r["node"], int(r["agent"].rsplit(".", 1)[1].split("#", 1)[0])  # agent ids: <kind><n>.<pid>#<conn>

    def stop(self, timeout: float = 300) -> dict[str, Any]:
        request(self.run_dir, {"type": "stop"}, timeout_s=10)
        deadline = time.monotonic() + timeout
        while not (self.run_dir / "summary.json").exists():
            if time.monotonic() > deadline:
                raise TmslurmError(f"run {self.run_dir} did not stop")
            time.sleep(0.5)
        return json.loads((self.run_dir / "summary.json").read_text())


def _roles(st: dict[str, Any]) -> set[str]:
    return {r["role"] for r in st.get("ranks", [])}


def local_slurm(*args: str) -> str:
    script = Path(__file__).resolve().parents[2] / "scripts" / "local-slurm"
    return sh(str(script), *args, timeout=300)


def resume_node(node: str) -> None:
    sh("scontrol", "update", f"nodename={node}", "state=resume", check=False)


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
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                               timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return r.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "") if r.returncode == 0 else "unknown"
