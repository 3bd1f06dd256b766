"""The controller's node monitors (NodeMonitors), driven through fake channels and a fake clock: a node is lost when
its monitor and its processes are all silent while other nodes are heard, never otherwise; a
monitor's ``exited`` ends only the agent it names on its own node."""

from __future__ import annotations

import time

import pytest

from tests.unit.controller_harness import FakeChannel, Harness
from tmslurm.controller.items import HelloIn, MessageIn
from tmslurm.controller.plan_types import Recovery
from tmslurm.wire.messages import Exited, Hello, Stopped


def add_monitor(h: Harness, node: str, pid: int = 777) -> tuple[int, FakeChannel]:
    conn = 1000 + len(h.ctl.monitors.monitors)
    ch = FakeChannel()
    h.ctl.handle(HelloIn(Hello(type="hello", token="t", kind="monitor", id=0, pid=pid, node=node), conn, ch))
    return conn, ch


def silence(h: Harness, nodes: set[str], age_s: float, now_m: float) -> None:
    """Everything on ``nodes`` was last heard ``age_s`` ago; everything else just now."""
    for a in h.state.agents.values():
        a.last_seen = now_m - (age_s if a.node in nodes else 0.0)
    for m in h.ctl.monitors.monitors.values():
        m.last_seen = now_m - (age_s if m.node in nodes else 0.0)


def test_a_monitor_is_told_to_watch_every_process_on_its_node(tmp_path):
    h = Harness(tmp_path)
    _, ch = add_monitor(h, "n1")
    assert [m for m in ch.sent if m["type"] == "welcome"]
    assert [(m["agent"], m["pid"]) for m in ch.sent if m["type"] == "watch"] == [(h.aid(1), 4242)]
    _, again = add_monitor(h, "n1")
    assert again.sent[-1]["type"] == "error" and "already has a live monitor" in again.sent[-1]["error"]


@pytest.mark.parametrize(
    "dark,age_s,lost",
    [
        ({"n1"}, 0.9, True),  # monitor and rank silent past 0.8 s, others heard: lost
        ({"n1"}, 0.5, False),  # within detect.node_timeout_s
        (set(), 0.9, False),  # nothing silent
        ({"n0", "n1", "n2", "n3", "s0"}, 5.0, False),  # everyone silent: the controller stalled, not a node
    ],
)
def test_a_node_is_lost_only_when_it_alone_went_dark(tmp_path, dark, age_s, lost):
    h = Harness(tmp_path)
    for node in ("n0", "n1", "n2", "n3", "s0"):
        add_monitor(h, node)
    now_m = time.monotonic()
    silence(h, dark, age_s, now_m)
    h.ctl.monitors.tick(now_m)
    entries = h.journal("node_lost")
    if lost:
        (entry,) = entries
        assert entry["node"] == "n1" and entry["source"] == "monitor" and entry["silent_s"] >= 0.8
        assert h.spawner.fenced == [("worker", 1)]
        assert isinstance(h.state.plan, Recovery) and h.state.plan.dead == {1}
        assert "node n1 lost" in h.state.plan.reason
        assert h.cluster.lost == ["n1"]  # remembered as bad before anything is restarted
    else:
        assert entries == [] and h.spawner.fenced == [] and h.state.plan is None and h.cluster.lost == []


def test_a_silent_monitor_whose_processes_talk_is_dropped_not_the_node(tmp_path):
    h = Harness(tmp_path)
    for node in ("n0", "n1"):
        add_monitor(h, node)
    now_m = time.monotonic()
    silence(h, set(), 0.0, now_m)
    mon = h.ctl.monitors.monitor_of("n1")
    mon.last_seen = now_m - 10.0
    h.ctl.monitors.tick(now_m)
    assert h.state.plan is None and h.spawner.fenced == []
    assert [e["why"] for e in h.journal("monitor_gone")] == ["silent while its node's processes talk"]
    assert h.ctl.monitors.monitor_of("n1") is None


@pytest.mark.parametrize(
    "node,agent_of,pid,ends",
    [
        ("n2", 2, 4242, True),  # its own node, the pid it was told: the rank failed
        ("n3", 2, 4242, False),  # another node's agent: ignored
        ("n2", 2, 999, False),  # not the pid the agent reported: ignored
    ],
)
def test_exited_ends_only_the_named_agent_on_the_monitors_node(tmp_path, node, agent_of, pid, ends):
    h = Harness(tmp_path)
    conn, _ = add_monitor(h, node)
    h.ctl.handle(MessageIn(conn, Exited(type="exited", agent=h.aid(agent_of), pid=pid)))
    if ends:
        assert isinstance(h.state.plan, Recovery) and h.state.plan.dead == {2}
        assert h.journal("process_exit")[0]["source"] == "monitor"
    else:
        assert h.state.plan is None and len(h.journal("exited_ignored")) == 1


def test_monitors_get_a_beat_each_fifth_of_controller_lost_s(tmp_path):
    """They get no decisions: without beats they would take a live controller for a lost one."""
    h = Harness(tmp_path, 2, 2, 1, "runtime.controller_lost_s=10")
    _, ch = add_monitor(h, "n1")
    t0 = time.monotonic()
    silence(h, set(), 0.0, t0)
    for dt in (0.0, 1.0, 2.5):
        h.ctl.monitors.tick(t0 + dt)
    assert sum(m["type"] == "beat" for m in ch.sent) == 2


@pytest.mark.parametrize("node,pid,fenced", [("n2", 4242, True), ("n3", 4242, False), ("n2", 1, False)])
def test_stopped_fences_only_the_named_agent_on_the_monitors_node(tmp_path, node, pid, fenced):
    h = Harness(tmp_path)
    conn, _ = add_monitor(h, node)
    h.ctl.handle(MessageIn(conn, Stopped(type="stopped", agent=h.aid(2), pid=pid, stopped_s=0.85)))
    if fenced:
        assert h.spawner.fenced == [("worker", 2)]
        assert isinstance(h.state.plan, Recovery) and h.state.plan.reason == "stopped"
        (entry,) = h.journal("hung")
        assert entry["source"] == "monitor" and entry["stopped_s"] == 0.85
    else:
        assert h.spawner.fenced == [] and h.state.plan is None and len(h.journal("stopped_ignored")) == 1
