"""A handle on a run submitted to Slurm, for the demo and the benchmarks: submit, poll, act.

Contract: :class:`SlurmJob` submits ``tmslurm-launch cluster=slurm`` with the given overrides and polls
the run's ``status`` through its control socket; its waits end with :class:`TmslurmError` naming what
was awaited when the time runs out or the run ends first (a summary, or the main job gone from
Slurm's queue while its control socket does not answer). :func:`sh` runs one command and raises
with the tail of its stderr when it fails; :func:`local_slurm` calls the failure lab's script of this
checkout (``scripts/local-slurm``), so it needs a source checkout, not a wheel.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tmslurm.core.errors import TmslurmError
from tmslurm.wire.protocol import request

log = logging.getLogger(__name__)


def sh(*cmd: str, check: bool = True, timeout: float = 120) -> str:
    r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise TmslurmError(f"{' '.join(cmd)} failed: {r.stderr.strip()[-500:]}")
    return r.stdout


class SlurmJob:
    def __init__(self, run_dir: Path, overrides: list[str]) -> None:
        self.run_dir = run_dir
        # the lab's partition (scripts/local-slurm); an override in ``overrides`` wins
        launch = (sys.executable, "-m", "tmslurm.cli.launch", "cluster=slurm", "slurm.partition=debug")
        out = sh(*launch, f"run_dir={run_dir}", *overrides)
        self.job_id = out.split("main job ")[1].split(":")[0]
        log.info("main job %s -> %s", self.job_id, run_dir)

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
            if not st and self.left_the_queue():
                raise TmslurmError(
                    f"the main job {self.job_id} left Slurm's queue (the run ended without a summary: "
                    f"see {self.run_dir}/events.jsonl) while waiting for {what}"
                )
            time.sleep(0.5)
        raise TmslurmError(f"timed out after {timeout:.0f}s waiting for {what} (job {self.job_id}, run {self.run_dir})")

    def left_the_queue(self) -> bool:
        """True when Slurm answers and no longer lists the main job (a requeued one is still listed);
        False while it does or while Slurm does not answer (slurmctld stopped: not known)."""
        try:
            r = subprocess.run(
                ["squeue", "-h", "-j", self.job_id, "-o", "%T"], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        if r.returncode != 0:  # an ended job may also be refused as an invalid id once Slurm forgot it
            return "Invalid job id" in r.stderr
        return not r.stdout.strip()

    def warm_pool(self, n: int, timeout: float = 600) -> dict[str, Any]:
        return self.wait(
            lambda st: (
                sum(1 for s in st.get("standbys", []) if len(s["roles"]) >= len(_roles(st)) and not s["busy"]) >= n
            ),
            timeout,
            f"{n} warm standby(s)",
        )

    def events_done(self, st: dict[str, Any]) -> list[dict[str, Any]]:
        return [e for e in st.get("events", []) if e.get("status") == "done"]

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
