"""Node relays end to end (``runtime.relay=true``): every rank and standby talks to the controller
through its node monitor's relay, real processes on real gloo, and the runs end bit-identical to
the uninterrupted run without relays, through a planned migration, a killed rank and a killed
controller (the agents rejoin the restarted controller through their relay).
"""

from __future__ import annotations

import os
import signal

import pytest

from tests.distributed.test_controller_lost import children
from tests.distributed.test_controller_restart import controller_pid, wait_step
from tests.distributed.test_recovery import assert_exact, events_of

pytestmark = pytest.mark.dist

LAYOUT = ("parallel.dp=2", "parallel.pp=2", "parallel.ranks_per_node=2")
STEPS = 24
RELAY = (
    "runtime.relay=true",
    "bench.step_delay_s=0.05",
    "detect.heartbeat_timeout_s=2.0",
    "standby.start_when_warm=true",
)


def relays(journal: list[dict]) -> list[str]:
    return [e["node"] for e in journal if e["type"] == "relay"]


def test_a_migration_and_a_failure_through_relays_are_exact(launch, baseline):
    ref = baseline(*LAYOUT, f"train.steps={STEPS}")
    run = launch(
        *LAYOUT,
        *RELAY,
        f"train.steps={STEPS}",
        "standby.count=2",
        "faults=[{step:8,kind:drain,rank:0},{step:16,kind:kill,rank:3}]",
    )
    s = run.wait()
    assert_exact(s, ref)
    assert len(events_of(s, "planned")) == 1 and len(events_of(s, "unexpected")) == 1, s["events"]
    assert not events_of(s, "restart")
    journal = run.journal()
    nodes = relays(journal)
    assert len(nodes) == len(set(nodes)) >= 4, nodes  # one relay per node: 2 training nodes, 2 spare nodes
    assert not [e for e in journal if e["type"] in ("bad_message", "auth_refused")]


def test_agents_rejoin_a_killed_controller_through_their_relay(launch, baseline):
    steps = 80
    ref = baseline(*LAYOUT, "model=tiny", f"train.steps={steps}")
    run = launch(*LAYOUT, *RELAY, "model=tiny", f"train.steps={steps}", "standby.count=1")
    wait_step(run, 30)
    pid = controller_pid(run)
    assert pid in children(run.proc.pid)
    os.kill(pid, signal.SIGKILL)
    run.wait_for(lambda e: e["type"] == "adopted" and e["incarnation"] == 1, timeout=60)
    s = run.wait()
    assert_exact(s, ref)
    journal = run.journal()
    assert not [e for e in journal if e["type"] in ("adoption_refused", "fenced", "node_lost", "hung")]
    nodes = relays(journal)
    assert len(nodes) == 2 * len(set(nodes)), nodes  # each node's relay connected to both incarnations
    assert [e["step"] for e in s["step_log"]] == list(range(steps))
