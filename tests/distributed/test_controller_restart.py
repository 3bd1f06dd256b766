"""The controller survives its own death: ``kill -9`` of the controller process at random steps,
three times in one run, and the run ends bit-identical to the uninterrupted one, with no agent
process left behind. With ``runtime.controller_restarts=0`` the same kill ends the run instead.

The controller is found through ``controller.json`` (its ``pid``) and checked to be a child of the
launcher this test started before it is signalled.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

from tests.distributed.test_controller_lost import children, running, wait_gone

STEPS = 160
LAYOUT = ("parallel.dp=2", "parallel.pp=2", "standby.count=1", "model=tiny", f"train.steps={STEPS}",
          "train.step_delay_s=0.05", "standby.start_when_warm=true")


def controller_pid(run) -> int:
    """The current controller's pid, once the supervisor has advertised a live child of its own."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            pid = int(json.loads((run.run_dir / "controller.json").read_text())["pid"])
        except (OSError, ValueError, KeyError):
            pid = 0
        if pid in children(run.proc.pid) and running(pid):
            return pid
        time.sleep(0.05)
    raise AssertionError("no controller child advertised")


def committed(run) -> int:
    try:
        return int(json.loads((run.run_dir / "snapshot.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return 0


def wait_step(run, step: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while committed(run) < step:
        assert run.proc.poll() is None, f"run ended early:\n{run.output()[-3000:]}"
        assert time.monotonic() < deadline, f"step {step} not reached (at {committed(run)})"
        time.sleep(0.02)


def test_kill_9_of_the_controller_three_times_is_survived_exactly(launch, baseline):
    kills = sorted(random.Random().sample(range(15, STEPS - 25, 10), 3))
    base = baseline(*LAYOUT)
    run = launch(*LAYOUT)
    agents: set[int] = set()
    for i, step in enumerate(kills):
        wait_step(run, step)
        pid = controller_pid(run)
        agents |= children(run.proc.pid) - {pid}
        os.kill(pid, signal.SIGKILL)
        run.wait_for(lambda e, i=i: e["type"] == "adopted" and e["incarnation"] == i + 1, timeout=60)
    summary = run.wait()
    journal = run.journal()
    assert not [e for e in journal if e["type"] in ("adoption_refused", "fenced", "node_lost", "hung")], kills
    assert [e["returncode"] for e in journal if e["type"] == "controller_died"] == [-9, -9, -9]
    restarts = [e for e in summary["events"] if e["kind"] == "controller_restart"]
    assert len(restarts) == 3 and all(e["status"] == "done" for e in restarts), restarts
    for e in restarts:  # the parts add up to the gap between the last commit before and the first after
        parts = e["before_death_s"] + e["restart_s"] + e["adopt_s"] + e["first_step_s"]
        assert abs(parts - e["gap_s"]) < 1e-6, e
    assert summary["steps"] == STEPS and [e["step"] for e in summary["step_log"]] == list(range(STEPS))
    assert summary["replicas_equal"] is True, kills
    assert summary["final_params_sha256"] == base["final_params_sha256"], kills
    assert summary["final_state_sha256"] == base["final_state_sha256"], kills
    wait_gone(agents, 30)  # no agent outlives the run


def test_without_restarts_a_killed_controller_ends_the_run(launch):
    run = launch(*LAYOUT, "runtime.controller_restarts=0", "runtime.controller_lost_s=120")
    wait_step(run, 10)
    pid = controller_pid(run)
    agents = children(run.proc.pid) - {pid}
    os.kill(pid, signal.SIGKILL)
    assert run.proc.wait(60) != 0
    took = wait_gone(agents, 30)
    assert took < 20, took  # the connection closed: they exit long before runtime.controller_lost_s
    journal = run.journal()
    assert [e["returncode"] for e in journal if e["type"] == "controller_died"] == [-9]
    assert not [e for e in journal if e["type"] == "adopting"]
    assert not Path(run.run_dir / "summary.json").exists()
