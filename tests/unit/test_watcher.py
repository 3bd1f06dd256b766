"""Tests of tmslurm.slurm.watcher: NodeWatch transitions over recorded Slurm states, and the poller."""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.unit import slurm_text as T
from tmslurm.core.errors import ConfigError, SlurmError
from tmslurm.slurm import parse as P
from tmslurm.slurm.client import CliSlurmClient
from tmslurm.slurm.watcher import NodeWatch, SlurmWatcher

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
VERSIONS = ("22.05", "24.11")
PREFIX = {"22.05": "tmn", "24.11": "tn"}
T0 = 1_800_000_000.0


def load(version: str, name: str) -> tuple[str, str]:
    first, _, body = (FIXTURES / version / name).read_text().partition("\n")
    return first[2:], body


def sinfo_nodes(version: str, name: str) -> list[P.NodeInfo]:
    cmd, text = load(version, name)
    return [row.to_node_info() for row in T.parse_sinfo_nodes(text, cmd=cmd)]


def scontrol_nodes(version: str, name: str) -> list[P.NodeInfo]:
    cmd, text = load(version, name)
    return P.parse_nodes(text, cmd=cmd)


def reservations(version: str, name: str = "scontrol-show-res-maint.txt") -> list[P.Reservation]:
    cmd, text = load(version, name)
    return P.parse_reservations(text, cmd=cmd)


def summary(notices) -> list[tuple]:
    return [(n.kind, n.node, n.deadline, n.role) for n in notices]


def roles(version: str, spare: tuple[int, ...] = (4,)) -> dict[str, str]:
    return {f"{PREFIX[version]}{i}": "spare" if i in spare else "main" for i in (1, 2, 3, 4)}


# ---------------------------------------------------------------------------------------------
# the recorded sequence, through sinfo: idle -> draining -> reboot asap -> drained -> node loss
# ---------------------------------------------------------------------------------------------

SEQUENCE = {
    "22.05": ["idle", "draining", "reboot-asap", "drained-after-shrink", "down"],
    "24.11": ["idle", "draining", "reboot-asap", "drained-after-shrink", "not-responding", "down"],
}
EXPECTED = {  # step -> [(kind, node number, role)]; every other step emits nothing
    "draining": [("maintenance", 2, "main")],
    "reboot-asap": [("maintenance", 3, "main")],
    "down": [("failure", 4, "spare")],  # 22.05 has no not-responding sinfo sample
    "not-responding": [("failure", 4, "spare")],
}


@pytest.mark.parametrize("version", VERSIONS)
def test_recorded_sequence_emits_each_transition_once(version):
    watch = NodeWatch(roles(version))
    reported_failure_at = None
    for step, name in enumerate(SEQUENCE[version]):
        got = watch.observe(sinfo_nodes(version, f"sinfo-N-O-{name}.txt"), [], T0 + step)
        expected = EXPECTED.get(name, [])
        if name == "down" and reported_failure_at is not None:
            expected = []  # already reported when it stopped responding: no duplicate
        assert summary(got) == [(k, f"{PREFIX[version]}{n}", None, r) for k, n, r in expected], name
        if any(n.kind == "failure" for n in got):
            reported_failure_at = step
        assert all(n.source == "slurm" and n.time == T0 + step for n in got)


@pytest.mark.parametrize("version", VERSIONS)
def test_idle_draining_drained_one_maintenance_notice(version):
    p = PREFIX[version]
    watch = NodeWatch({f"{p}2": "main"})
    assert watch.observe(scontrol_nodes(version, "scontrol-o-show-node-idle.txt"), [], T0) == []
    (n,) = watch.observe(scontrol_nodes(version, "scontrol-show-node-draining.txt"), [], T0 + 1)
    assert (n.kind, n.node, n.deadline, n.role) == ("maintenance", f"{p}2", None, "main")
    assert (n.reason, n.slurm_state) == ("firmware upgrade", "MIXED+DRAIN")
    drained = sinfo_nodes(version, "sinfo-N-O-drained-after-shrink.txt")
    assert drained[1].drain_phase == "drained"
    assert watch.observe(drained, [], T0 + 2) == []


@pytest.mark.parametrize("version", VERSIONS)
def test_idle_not_responding_down_one_failure_then_again_after_recovery(version):
    p = PREFIX[version]
    watch = NodeWatch({f"{p}4": "spare"})
    idle = scontrol_nodes(version, "scontrol-o-show-node-idle.txt")
    assert watch.observe(idle, [], T0) == []
    (n,) = watch.observe(scontrol_nodes(version, "scontrol-show-node-not-responding.txt"), [], T0 + 14)
    assert (n.kind, n.node, n.deadline, n.role) == ("failure", f"{p}4", None, "spare")
    assert "NOT_RESPONDING" in n.slurm_state and n.reason.startswith("Slurm node state")
    assert watch.observe(scontrol_nodes(version, "scontrol-show-node-down.txt"), [], T0 + 20) == []
    assert watch.observe(idle, [], T0 + 30) == []  # back to ok
    (again,) = watch.observe(scontrol_nodes(version, "scontrol-show-node-down.txt"), [], T0 + 40)
    assert (again.kind, again.reason, again.time) == ("failure", "Not responding", T0 + 40)


def test_maintenance_escalates_to_failure_but_not_back():
    watch = NodeWatch({"tmn2": "main"})
    draining = scontrol_nodes("22.05", "scontrol-show-node-draining.txt")
    assert summary(watch.observe(draining, [], T0)) == [("maintenance", "tmn2", None, "main")]
    dead = P.parse_nodes("NodeName=tmn2 State=DOWN+DRAIN Reason=power supply\n")
    (n,) = watch.observe(dead, [], T0 + 1)
    assert (n.kind, n.reason, n.slurm_state) == ("failure", "power supply", "DOWN+DRAIN")
    assert watch.observe(draining, [], T0 + 2) == []  # a failure is never downgraded
    assert watch.observe(dead, [], T0 + 3) == []


def test_unknown_and_absent_nodes():
    watch = NodeWatch({"tmn2": "main", "tmn9": "spare"})
    down = sinfo_nodes("22.05", "sinfo-N-O-down.txt")  # tmn4 is down but not watched
    assert summary(watch.observe(down, [], T0)) == [("maintenance", "tmn2", None, "main")]
    assert watch.observe([], [], T0 + 1) == []  # absence is not recovery...
    assert watch.observe(down, [], T0 + 2) == []  # ...so no second notice


def test_set_nodes_tracks_spares_coming_and_going():
    down = sinfo_nodes("22.05", "sinfo-N-O-down.txt")
    watch = NodeWatch({"tmn1": "main"})
    assert watch.observe(down, [], T0) == []
    watch.set_nodes({"tmn1": "main", "tmn4": "spare"})  # a new spare that is already down
    assert summary(watch.observe(down, [], T0 + 1)) == [("failure", "tmn4", None, "spare")]
    assert watch.observe(down, [], T0 + 2) == []
    watch.set_nodes({"tmn1": "main"})
    assert watch.observe(down, [], T0 + 3) == [] and watch.nodes == {"tmn1": "main"}
    watch.set_nodes({"tmn1": "main", "tmn4": "main"})  # re-added: its history was forgotten
    assert summary(watch.observe(down, [], T0 + 4)) == [("failure", "tmn4", None, "main")]


def test_bad_roles_and_lead_time():
    with pytest.raises(ConfigError, match="main, spare"):
        NodeWatch({"tmn1": "standby"})
    with pytest.raises(ConfigError, match="maint_lead_s"):
        NodeWatch({}, maint_lead_s=-1)


# ---------------------------------------------------------------------------------------------
# maintenance reservations
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_maint_reservation_reported_once_with_its_start_as_deadline(version):
    (resv,) = reservations(version)
    start = resv.start_time.timestamp()
    p = PREFIX[version]
    watch = NodeWatch(roles(version))
    idle = scontrol_nodes(version, "scontrol-o-show-node-idle.txt")
    (n,) = watch.observe(idle, [resv], start - 600)
    assert (n.kind, n.node, n.deadline, n.role) == ("maintenance", f"{p}1", start, "main")
    assert "maint1" in n.reason and n.slurm_state == "IDLE"
    assert watch.observe(idle, [resv], start - 300) == []
    in_maint = P.parse_nodes(f"NodeName={p}1 State=MIXED+MAINT\n")
    assert watch.observe(in_maint, [resv], start + 5) == []  # the window it announced has begun


@pytest.mark.parametrize("version", VERSIONS)
def test_maint_reservation_lead_time_and_started_and_ended(version):
    (resv,) = reservations(version, "scontrol-o-show-res-maint.txt")
    start, end = resv.start_time.timestamp(), resv.end_time.timestamp()
    p = PREFIX[version]
    watch = NodeWatch({f"{p}1": "main"}, maint_lead_s=300)
    assert watch.observe([], [resv], start - 600) == []
    assert summary(watch.observe([], [resv], start - 200)) == [("maintenance", f"{p}1", start, "main")]
    late = NodeWatch({f"{p}1": "spare"})
    assert summary(late.observe([], [resv], start + 60)) == [("maintenance", f"{p}1", start + 60, "spare")]
    assert NodeWatch({f"{p}1": "main"}).observe([], [resv], end + 1) == []


def test_drain_before_announced_maintenance_is_reported_again_as_earlier():
    (resv,) = reservations("22.05")
    start = resv.start_time.timestamp()
    watch = NodeWatch({"tmn1": "main"})
    assert summary(watch.observe([], [resv], start - 600)) == [("maintenance", "tmn1", start, "main")]
    drained_now = P.parse_nodes("NodeName=tmn1 State=MIXED+DRAIN Reason=moved up\n")
    (n,) = watch.observe(drained_now, [resv], start - 500)
    assert (n.kind, n.deadline, n.reason) == ("maintenance", None, "moved up")
    assert watch.observe(drained_now, [resv], start - 400) == []


def test_reservations_that_do_not_concern_us():
    (maint,) = reservations("22.05")
    (no_flags,) = T.parse_sinfo_reservations(load("22.05", "sinfo-T-maint.txt")[1])
    start = maint.start_time.timestamp()
    assert NodeWatch({"tmn2": "main"}).observe([], [maint], start - 60) == []  # other node
    assert NodeWatch({"tmn1": "main"}).observe([], [no_flags], start - 60) == []  # not MAINT


# ---------------------------------------------------------------------------------------------
# the poller
# ---------------------------------------------------------------------------------------------


class FakeClient:
    """Fails ``failures`` times, then answers with the down sample; records the names asked for."""

    def __init__(self, failures: int = 0):
        self.failures = failures
        self.calls = 0
        self.asked: list[list[str]] = []

    def nodes(self, names=None):
        self.calls += 1
        self.asked.append(list(names))
        if self.calls <= self.failures:
            raise SlurmError("`scontrol -o show node` failed with exit code 1: connect failure")
        return sinfo_nodes("22.05", "sinfo-N-O-down.txt")

    def reservations(self):
        return []


def wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return False


def test_watcher_survives_slurm_errors_and_delivers(caplog):
    client, got = FakeClient(failures=5), []
    delivered = threading.Event()

    def on_notice(n):
        got.append(n)
        delivered.set()

    watcher = SlurmWatcher(client, NodeWatch({"tmn4": "spare", "tmn2": "main"}), 0.001, on_notice)
    with caplog.at_level(logging.INFO, logger="tmslurm.slurm.watcher"):
        watcher.start()
        assert delivered.wait(5.0)
        assert wait_for(lambda: client.calls >= 8)
        watcher.stop(timeout=5.0)
    assert not watcher._thread.is_alive()
    assert summary(got) == [("maintenance", "tmn2", None, "main"), ("failure", "tmn4", None, "spare")]
    assert client.asked[0] == ["tmn2", "tmn4"]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "polling continues" in warnings[0].getMessage()
    assert any("recovered after 5 failed poll" in r.getMessage() for r in caplog.records)


def test_watcher_survives_a_failing_callback(caplog):
    client, calls = FakeClient(), []

    def on_notice(n):
        calls.append(n)
        raise RuntimeError("controller bug")

    watcher = SlurmWatcher(client, NodeWatch({"tmn4": "spare", "tmn2": "main"}), 0.001, on_notice)
    with caplog.at_level(logging.ERROR, logger="tmslurm.slurm.watcher"):
        watcher.start()
        assert wait_for(lambda: client.calls >= 3)
        watcher.stop(timeout=5.0)
    assert len(calls) == 2  # both notices were offered despite the first callback failing
    assert any("on_notice failed" in r.getMessage() for r in caplog.records)


def test_poll_once_without_watched_nodes_asks_nothing():
    client = FakeClient()
    assert SlurmWatcher(client, NodeWatch({}), 1.0, lambda n: None).poll_once() == []
    assert client.calls == 0
    with pytest.raises(ConfigError):
        SlurmWatcher(client, NodeWatch({}), 0, lambda n: None)


def test_poll_once_uses_the_clock():
    got = []
    watcher = SlurmWatcher(FakeClient(), NodeWatch({"tmn4": "main"}), 1.0, got.append, clock=lambda: 123.0)
    (n,) = watcher.poll_once()
    assert got == [n] and n.time == 123.0


class RecordingCli(CliSlurmClient):
    """The real CLI client with a fake command runner: records each command, answers from canned text."""

    def __init__(self, node_text: str) -> None:
        super().__init__()
        self.node_text = node_text
        self.commands: list[list[str]] = []

    def _run(self, args, ok_codes=(0,), cwd=None):
        self.commands.append(list(args))
        out = self.node_text if args[:4] == ["scontrol", "-o", "show", "node"] else ""
        return subprocess.CompletedProcess(args, 0, out, "")


def test_one_node_query_per_poll_for_all_watched_nodes():
    """1,024 watched nodes: each poll runs one ``scontrol -o show node`` (every node) and one ``show res``."""
    names = [f"gpu{i:04d}" for i in range(1024)]
    text = "".join(f"NodeName={n} State={'MIXED+DRAIN Reason=fan' if n == 'gpu0513' else 'ALLOCATED'}\n" for n in names)
    client = RecordingCli(text)
    got: list = []
    watcher = SlurmWatcher(client, NodeWatch({n: "main" for n in names}), 1.0, got.append, clock=lambda: 100.0)
    watcher.poll_once()
    watcher.poll_once()
    assert [c[:4] for c in client.commands] == [
        ["scontrol", "-o", "show", "node"],
        ["scontrol", "-o", "show", "res"],
    ] * 2
    assert client.commands[0][4] == "gpu[0000-1023]"  # every watched node, in one compressed hostlist
    assert [(n.node, n.kind) for n in got] == [("gpu0513", "maintenance")]  # reported once over both polls
