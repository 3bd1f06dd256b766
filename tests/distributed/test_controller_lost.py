"""Agents never outlive their controller: a killed launcher (the supervisor: its controller dies with
it, its sockets close, nobody listens any more) and a silent controller (stopped: no FIN, nothing
more on the wire) both leave no rank or standby process behind. A killed controller alone is
restarted by the supervisor (tests/distributed/test_controller_restart.py)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from tests.distributed.test_recovery import BASE

LAYOUT = ("parallel.dp=2", "parallel.pp=1", "standby.count=1", "train.steps=100000", "bench.step_delay_s=0.05")


def children(pid: int) -> set[int]:
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        out |= {int(c) for c in (task / "children").read_text().split()}
    return out


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan that exited may wait for its new parent to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def is_zygote(pid: int) -> bool:
    """The process agents are forked from (runtime.fork_agents): it lives as long as the supervisor."""
    try:
        return b"tmslurm.agent.zygote" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False


def agents_up(run, n: int) -> set[int]:
    """The launcher's children but the zygote: the controller, the agents and the monitors."""
    run.wait_for(lambda e: e["type"] == "standby_ready")
    deadline = time.monotonic() + 60
    while len(pids := {p for p in children(run.proc.pid) if not is_zygote(p)}) < n:
        assert time.monotonic() < deadline, f"only {len(pids)} of {n} agents spawned"
        time.sleep(0.05)
    return pids


def wait_gone(pids: set[int], timeout_s: float) -> float:
    t0 = time.monotonic()
    while left := {p for p in pids if running(p)}:
        assert time.monotonic() - t0 < timeout_s, f"agents {sorted(left)} outlived their controller by {timeout_s}s"
        time.sleep(0.05)
    return time.monotonic() - t0


def test_agents_exit_when_the_supervisor_and_its_controller_are_killed(launch):
    run = launch(*LAYOUT, *[o for o in BASE if not o.startswith("train.")], "runtime.controller_lost_s=120")
    pids = agents_up(run, 4)  # the controller, two ranks, a standby (and the monitors)
    os.kill(run.proc.pid, signal.SIGKILL)
    run.proc.wait()
    took = wait_gone(pids, 30)
    assert took < 20, took  # the connection closed: well before runtime.controller_lost_s=120


def controller_of(run) -> int:
    """The controller process: a child of the launcher (its supervisor), advertised in controller.json."""
    pid = int(json.loads((run.run_dir / "controller.json").read_text())["pid"])
    assert pid in children(run.proc.pid), pid
    return pid


def test_agents_exit_when_the_controller_goes_silent(launch):
    run = launch(*LAYOUT, *[o for o in BASE if not o.startswith("train.")], "runtime.controller_lost_s=3")
    pids = agents_up(run, 4)
    ctl = controller_of(run)
    pids.discard(ctl)
    os.kill(ctl, signal.SIGSTOP)  # alive, sockets open, nothing sent: like a frozen controller host
    try:
        took = wait_gone(pids, 30)
    finally:
        os.kill(run.proc.pid, signal.SIGKILL)  # the supervisor; its stopped controller dies with it
        run.proc.wait()
    assert took >= 2.0, took  # not before runtime.controller_lost_s (less the last beat's age)
