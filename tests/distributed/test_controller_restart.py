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

import pytest

from tests.distributed.test_controller_lost import children, running, wait_gone
from tmslurm.wire.protocol import request

STEPS = 160
LAYOUT = (
    "parallel.dp=2",
    "parallel.pp=2",
    "standby.count=1",
    "model=tiny",
    f"train.steps={STEPS}",
    "bench.step_delay_s=0.05",
    "standby.start_when_warm=true",
)


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


def test_kill_9_in_phase_1_of_a_planned_switch_rolls_it_back_and_moves_again(launch, baseline):
    """The notice's reply comes once the plan is started (prepares and the join sent); the kill that
    follows lands in phase 1 (group builds in the background, the shadow catching up over a 0.2 s
    step). The restarted controller cancels that plan everywhere, notices rank 1 again, and the move
    is done afresh under a new epoch; the run ends bit-identical."""
    layout = (
        "parallel.dp=2",
        "parallel.pp=2",
        "standby.count=1",
        "model=tiny",
        "train.steps=40",
        "standby.start_when_warm=true",
    )
    base = baseline(*layout)
    run = launch(*layout, "bench.step_delay_s=0.2")
    wait_step(run, 8)
    pid = controller_pid(run)
    reply = request(run.run_dir, {"type": "notice", "event": "maintenance", "rank": 1, "reason": "psu"})
    assert reply["type"] == "ok", reply
    os.kill(pid, signal.SIGKILL)
    summary = run.wait()
    journal = run.journal()
    assert not [e for e in journal if e["type"] == "adoption_refused"], journal[-5:]
    (rb,) = [e for e in journal if e["type"] == "plan_rolled_back"]
    assert rb["noticed_again"] == [1] and len(rb["epochs"]) == 1
    planned = [e for e in summary["events"] if e["kind"] == "planned"]
    assert len(planned) == 1 and planned[0]["status"] == "done" and planned[0]["ranks"] == [1], summary["events"]
    assert planned[0]["epoch"] > rb["epochs"][0]  # planned afresh, under a new epoch
    assert summary["steps"] == 40 and [e["step"] for e in summary["step_log"]] == list(range(40))
    assert summary["final_params_sha256"] == base["final_params_sha256"]
    assert summary["final_state_sha256"] == base["final_state_sha256"]


def test_kill_9_in_the_middle_of_a_recovery_redoes_it_and_ends_exact(launch, baseline):
    """Rank 2 is killed at step 10; its state's source (rank 0) stalls 3 s in the middle of the
    transfer (fault hiccup, when: transfer), and the controller is killed then. The restarted
    controller finds a recovery under way, cancels the cut-off join and redoes the recovery under a
    new epoch; the run ends bit-identical."""
    layout = (
        "parallel.dp=2",
        "parallel.pp=2",
        "standby.count=1",
        "model=tiny",
        "train.steps=40",
        "standby.start_when_warm=true",
    )
    base = baseline(*layout)
    run = launch(
        *layout,
        "bench.step_delay_s=0.05",
        "faults=[{step:10,kind:kill,rank:2},{step:10,kind:hiccup,rank:0,when:transfer,amount:'3'}]",
    )
    run.wait_for(lambda e: e["type"] == "fault" and e.get("kind") == "hiccup", timeout=120)
    os.kill(controller_pid(run), signal.SIGKILL)
    summary = run.wait()
    journal = run.journal()
    assert not [e for e in journal if e["type"] == "adoption_refused"], [
        e for e in journal if e["type"] == "adoption_refused"
    ]
    (adopted,) = [e for e in journal if e["type"] == "adopted"]
    assert adopted.get("resumed_recovery") is True, adopted
    assert any(e["kind"] == "unexpected" and e["status"] == "done" for e in summary["events"]), summary["events"]
    assert summary["steps"] == 40 and [e["step"] for e in summary["step_log"]] == list(range(40))
    assert summary["final_params_sha256"] == base["final_params_sha256"]
    assert summary["final_state_sha256"] == base["final_state_sha256"]


@pytest.mark.parametrize("moment", ["phase 2", "first step"])
def test_kill_9_past_phase_1_of_a_planned_switch_completes_it_and_ends_exact(launch, baseline, moment):
    """A drain of rank 1 at step 10, switched without a shadow, so the leaver sends its state in the
    pause; it stalls 3 s in the middle of that send (fault hiccup, when: transfer). ``phase 2``: the
    controller is killed then, when the decision that carried the switch has reached the ranks and
    the joiner is receiving. ``first step``: it is killed once the joiner's ``joined`` is journalled,
    while the first step after the switch runs (or right after it committed). The restarted
    controller completes the switch instead of refusing it; the run ends bit-identical."""
    layout = (
        "parallel.dp=2",
        "parallel.pp=2",
        "standby.count=1",
        "model=tiny",
        "train.steps=40",
        "standby.start_when_warm=true",
        "shadow.enabled=false",
    )
    base = baseline(*layout)
    run = launch(
        *layout,
        "bench.step_delay_s=0.05",
        "faults=[{step:10,kind:drain,rank:1},{step:10,kind:hiccup,rank:1,when:transfer,amount:'3'}]",
    )
    if moment == "phase 2":
        run.wait_for(lambda e: e["type"] == "fault" and e.get("kind") == "hiccup", timeout=120)
    else:
        run.wait_for(lambda e: e["type"] == "joined" and e.get("rank") == 1, timeout=120)
    pid = controller_pid(run)
    agents = children(run.proc.pid) - {pid}
    os.kill(pid, signal.SIGKILL)
    summary = run.wait()
    journal = run.journal()
    assert not [e for e in journal if e["type"] in ("adoption_refused", "abort", "fenced")], journal[-8:]
    (adopted,) = [e for e in journal if e["type"] == "adopted"]
    if moment == "phase 2":
        assert adopted.get("completed_switch") is not None and adopted["activated"] == [], adopted
    planned = [e for e in summary["events"] if e["kind"] == "planned"]
    assert len(planned) == 1 and planned[0]["status"] == "done" and planned[0]["ranks"] == [1], summary["events"]
    assert summary["steps"] == 40 and [e["step"] for e in summary["step_log"]] == list(range(40))
    assert summary["final_params_sha256"] == base["final_params_sha256"]
    assert summary["final_state_sha256"] == base["final_state_sha256"]
    wait_gone(agents, 30)  # no agent outlives the run, the leaver included


def test_kill_9_in_the_middle_of_a_checkpoint_restart_restarts_again_and_ends_exact(launch, baseline):
    """No standby: rank 2 is killed at step 12 and every rank restarts from checkpoint 10. The
    controller is killed as soon as that restart is journalled, while the new rank processes are
    still starting (importing torch, loading the checkpoint): they had not joined, so the rejoins
    cannot settle where the run stands. The restarted controller says so (``adoption_refused`` with
    ``fallback: checkpoint_restart``), stops them and restarts every rank from the latest complete
    checkpoint again, in the same run; it ends bit-identical instead of failed."""
    layout = (
        "parallel.dp=2",
        "parallel.pp=2",
        "standby.count=0",
        "model=tiny",
        "train.steps=30",
        "train.checkpoint_every=10",
    )
    base = baseline(*layout)
    run = launch(*layout, "bench.step_delay_s=0.05", "faults=[{step:12,kind:kill,rank:2}]")
    run.wait_for(lambda e: e["type"] == "restart", timeout=120)
    pid = controller_pid(run)
    agents = children(run.proc.pid) - {pid}
    os.kill(pid, signal.SIGKILL)
    summary = run.wait()
    journal = run.journal()
    (refused,) = [e for e in journal if e["type"] == "adoption_refused"]
    assert refused["fallback"] == "checkpoint_restart" and "had not joined yet" in refused["why"], refused
    restarts = [e for e in journal if e["type"] == "restart"]
    assert [r["from_step"] for r in restarts] == [10, 10], restarts
    redo = [e for e in summary["events"] if "could not adopt" in str(e.get("cause"))]
    assert len(redo) == 1 and redo[0]["ranks"] == [] and redo[0]["status"] == "done", summary["events"]
    assert summary["steps"] == 30 and summary["replicas_equal"] is True
    assert summary["final_params_sha256"] == base["final_params_sha256"]
    assert summary["final_state_sha256"] == base["final_state_sha256"]
    wait_gone(agents, 30)
