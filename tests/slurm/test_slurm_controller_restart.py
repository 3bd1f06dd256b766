"""The controller survives its own death on Slurm, in the same job: ``kill -9`` of the controller
process (the batch step's supervisor restarts it) at three random steps of one run.

The new controller takes over the rank steps and the spare job its predecessor launched
(``spawner.json``), the live agents rejoin, and the run ends bit-identical to the uninterrupted one
without a requeue (the job's restart count stays 0 and no monitor claims the controller lost). The
controller is found through ``controller.json`` (its ``pid``) and checked to be this run's Slurm
controller process before it is signalled (the lab's nodes share this host's pid namespace).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

import pytest

from tests.slurm.test_slurm_run import COMMON, STEPS, SlurmRun, exact, job_field, reference_hash

pytestmark = pytest.mark.slurm
LAYOUT = ["parallel.dp=2", "parallel.pp=2"]


def committed(run: SlurmRun) -> int:
    try:
        return int(json.loads((run.run_dir / "snapshot.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return 0


def controller_pid(run: SlurmRun, incarnation: int, timeout: float = 60) -> int:
    """The pid advertised for this controller incarnation, once it is this run's live controller."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            info = json.loads((run.run_dir / "controller.json").read_text())
            cmdline = Path(f"/proc/{int(info['pid'])}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, KeyError):
            cmdline = []
        if (
            cmdline
            and info.get("incarnation") == incarnation
            and b"tmslurm.slurm.proc.ctlmain" in cmdline
            and str(run.run_dir).encode() in cmdline
        ):
            return int(info["pid"])
        time.sleep(0.05)
    raise AssertionError(f"no controller of incarnation {incarnation} advertised\n{run.logs()}")


def test_kill_9_of_the_slurm_controller_three_times_is_survived_in_the_same_job(slurm, tmp_path, tmp_path_factory):
    ref = reference_hash(tmp_path_factory, *LAYOUT)
    run = SlurmRun(slurm, tmp_path / "run", [*LAYOUT, "standby.count=1", *COMMON])
    run.wait_step(5)  # the standby is warm: its spare job is taken over too
    rng = random.Random()
    kills = [rng.randrange(lo, lo + 8) for lo in (10, 25, 40)]
    for i, step in enumerate(kills):
        deadline = time.monotonic() + 120
        while committed(run) < step:
            assert time.monotonic() < deadline, f"step {step} not reached (at {committed(run)})\n{run.logs()}"
            time.sleep(0.02)
        os.kill(controller_pid(run, i), signal.SIGKILL)
        run.wait_for(
            lambda e, i=i: e["type"] == "adopted" and e["incarnation"] == i + 1,
            timeout=60,
            what=f"adoption by incarnation {i + 1}",
        )
    s = run.summary()
    journal = run.journal()
    assert [e["returncode"] for e in journal if e["type"] == "controller_died"] == [-9, -9, -9], kills
    assert not [e for e in journal if e["type"] in ("adoption_refused", "fenced", "node_lost", "hung")], kills
    restarts = [e for e in s["events"] if e["kind"] == "controller_restart"]
    assert len(restarts) == 3 and all(e["status"] == "done" for e in restarts), restarts
    for e in restarts:  # the parts add up to the gap between the last commit before and the first after
        assert abs(e["before_death_s"] + e["restart_s"] + e["adopt_s"] + e["first_step_s"] - e["gap_s"]) < 1e-6, e
    # the spare job was taken over, not lost: the standby rejoined and the summary still lists it
    adopting = [e for e in journal if e["type"] == "adopting"]
    assert all("standby0" in e["expected"] for e in adopting), adopting
    assert len(s["spare_job_ids"]) == 1, s["spare_job_ids"]
    assert s["steps"] == STEPS and [e["step"] for e in s["step_log"]] == list(range(STEPS))
    assert exact(s, ref), ({k: v for k, v in s.items() if k != "step_log"}, kills)
    # the same Slurm job all along: no requeue, and no monitor took the controller for lost
    assert job_field(run.job(), "Restarts") == "0"
    assert not (run.run_dir / "controller-lost.json").exists()
    print(
        json.dumps(
            {
                "kills": kills,
                "downtime_s": [e["downtime_s"] for e in restarts],
                "parts": [
                    {k: e[k] for k in ("before_death_s", "restart_s", "adopt_s", "first_step_s")} for e in restarts
                ],
            }
        )
    )
