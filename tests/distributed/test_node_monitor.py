"""Node monitors on real processes: a node that goes dark (every process on it frozen: no FIN, no
RST, nothing more on the wire) is declared lost in under a second by its monitor's silence, its
rank moves to the warm standby and the run ends bit-identical; a rank's exit is reported by the
monitor's pidfd."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tests.distributed.test_recovery import BASE, assert_exact, events_of

LAYOUT = ("parallel.dp=2", "parallel.pp=2")
STEPS = 60


def node_pids(launcher_pid: int, node: str) -> list[int]:
    """The launcher's children placed on ``node`` (the rank and the node's monitor)."""
    out = []
    for task in Path(f"/proc/{launcher_pid}/task").iterdir():
        for pid in map(int, (task / "children").read_text().split()):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"--node" in argv and argv[argv.index(b"--node") + 1] == node.encode():
                out.append(pid)
    return out


def test_a_frozen_node_is_lost_in_under_a_second_and_its_rank_moves(launch, baseline):
    opts = [o for o in BASE if not o.startswith("train.")]
    run = launch(*LAYOUT, *opts, f"train.steps={STEPS}", "bench.step_delay_s=0.1", "standby.count=1")
    run.wait_for(lambda e: e["type"] == "standby_ready")
    run.wait_for(lambda e: e["type"] == "monitor_up" and e["node"] == "local1")
    pids = node_pids(run.proc.pid, "local1")
    assert len(pids) == 2, pids  # rank 1 and the monitor of local1
    frozen_t = time.time()
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)  # the test's own doing: the controller signals only its own handles
    try:
        lost = run.wait_for(lambda e: e["type"] == "node_lost", timeout=60)
        s = run.wait()
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    assert lost["node"] == "local1" and lost["source"] == "monitor"
    assert 0.8 <= lost["silent_s"] < 1.5, lost  # detect.node_timeout_s=0.8, checked every 0.05 s
    assert lost["t"] - frozen_t < 1.5, lost["t"] - frozen_t  # not the 2 s heartbeat timeout of BASE
    (ev,) = events_of(s, "unexpected")
    assert "node local1 lost" in ev["cause"] and ev["ranks"] == [1]
    assert_exact(s, baseline(*LAYOUT, f"train.steps={STEPS}"))


def test_the_monitor_reports_a_rank_exit(launch, baseline):
    opts = [o for o in BASE if not o.startswith("train.")]
    # controller_lost_s=1: a monitor alive at step 20 (seconds after it started) proves it gets beats
    run = launch(
        *LAYOUT,
        *opts,
        f"train.steps={STEPS}",
        "bench.step_delay_s=0.05",
        "standby.count=1",
        "runtime.controller_lost_s=1",
        "faults=[{step:20,kind:kill,rank:2}]",
    )
    s = run.wait()
    assert_exact(s, baseline(*LAYOUT, f"train.steps={STEPS}"))
    log = (run.run_dir / "logs" / "monitor-local2.log").read_text()
    assert "worker2." in log and "exited" in log, log[-2000:]
    assert not [e for e in run.journal() if e["type"] == "exited_ignored"]
