"""The node monitor's pidfd watch on real processes: an agent of this run is watched and its exit
reported at once; a pid that is not one of this run's agents is never watched or reported."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tmslurm.agent.monitor import Monitor, is_agent_of
from tmslurm.wire.messages import Exited, Finish, Msg, Stopped, Watch


class FakeLink:
    def __init__(self) -> None:
        self.inbox: queue.Queue = queue.Queue()
        self.sent: list[Msg] = []
        self.on_reconnect: list = []

    def get(self, timeout: float | None = None):
        return self.inbox.get(timeout=timeout) if timeout else self.inbox.get_nowait()

    def send(self, msg: Msg) -> None:
        self.sent.append(msg)


def start(mon: Monitor, watching: int) -> tuple[threading.Thread, float]:
    """Run the monitor in a thread and wait until it watches ``watching`` pids; the thread and a deadline."""
    t = threading.Thread(target=mon.run, daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while len(mon.watched) < watching:
        assert time.monotonic() < deadline, mon.watched
        time.sleep(0.01)
    return t, deadline


def fake_agent(run_dir: Path) -> subprocess.Popen:
    """A process whose command line is an agent's of ``run_dir`` (it only sleeps)."""
    code = "import time; time.sleep(60)"
    return subprocess.Popen([sys.executable, "-c", code, "tmslurm.agent.main", "--run-dir", str(run_dir)])


def test_a_watched_agent_exit_is_reported_and_a_stranger_is_not_watched(tmp_path):
    agent, stranger = fake_agent(tmp_path), subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    other_run = fake_agent(tmp_path / "other")
    try:
        assert is_agent_of(agent.pid, tmp_path) and not is_agent_of(stranger.pid, tmp_path)
        assert not is_agent_of(other_run.pid, tmp_path)
        link = FakeLink()
        mon = Monitor(tmp_path, link, "n0", stop_after_s=60.0)
        for aid, pid in (("worker0.1#1", agent.pid), ("x", stranger.pid), ("y", other_run.pid)):
            link.inbox.put(Watch(agent=aid, pid=pid))
        t, deadline = start(mon, watching=1)
        killed_t = time.monotonic()
        agent.kill()
        stranger.kill()
        while not link.sent:
            assert time.monotonic() < deadline, "the exit was not reported"
            time.sleep(0.005)
        reported_s = time.monotonic() - killed_t
        assert link.sent == [Exited(agent="worker0.1#1", pid=agent.pid)]
        assert reported_s < 1.0, reported_s
        link.inbox.put(Finish())
        t.join(5)
        assert not t.is_alive() and link.sent == [Exited(agent="worker0.1#1", pid=agent.pid)]
    finally:
        for p in (agent, stranger, other_run):
            p.kill()
            p.wait()


def test_a_watched_agent_stopped_past_the_limit_is_reported_once_and_a_short_stop_is_not(tmp_path):
    agent, other = fake_agent(tmp_path), fake_agent(tmp_path)
    try:
        link = FakeLink()
        mon = Monitor(tmp_path, link, "n0", stop_after_s=0.5)
        link.inbox.put(Watch(agent="worker1.1#1", pid=agent.pid))
        link.inbox.put(Watch(agent="worker2.2#2", pid=other.pid))
        t, deadline = start(mon, watching=2)
        os.kill(other.pid, signal.SIGSTOP)  # a short stop: resumed before the limit
        time.sleep(0.05)  # far shorter than stop_after_s: what is checked is that this is NOT reported
        os.kill(other.pid, signal.SIGCONT)
        stopped_t = time.monotonic()
        os.kill(agent.pid, signal.SIGSTOP)
        while not link.sent:
            assert time.monotonic() < deadline, "the stop was not reported"
            time.sleep(0.005)
        took = time.monotonic() - stopped_t
        (msg,) = link.sent
        assert isinstance(msg, Stopped) and (msg.agent, msg.pid) == ("worker1.1#1", agent.pid)
        assert msg.stopped_s >= 0.5 and 0.5 <= took < 2.5, (msg, took)
        link.inbox.put(Finish())
        t.join(5)
        assert len(link.sent) == 1  # once, though it stays stopped
    finally:
        for p in (agent, other):
            p.kill()
            p.wait()


def test_after_a_rejoin_only_the_new_controllers_watches_count(tmp_path):
    agent = fake_agent(tmp_path)
    try:
        link = FakeLink()
        mon = Monitor(tmp_path, link, "n0", stop_after_s=60.0)
        link.inbox.put(Watch(agent="worker0.1#1", pid=agent.pid))  # named by the dead controller
        t, deadline = start(mon, watching=1)
        (rejoined,) = link.on_reconnect  # what the link's reader calls after a rejoin, before reading on
        rejoined()
        link.inbox.put(Watch(agent="worker0.1#7", pid=agent.pid))  # the same process, named by the new one
        while [a for a, _ in mon.watched.values()] != ["worker0.1#7"]:
            assert time.monotonic() < deadline, mon.watched
            time.sleep(0.01)
        agent.kill()
        while not link.sent:
            assert time.monotonic() < deadline, "the exit was not reported"
            time.sleep(0.005)
        link.inbox.put(Finish())
        t.join(5)
        assert link.sent == [Exited(agent="worker0.1#7", pid=agent.pid)]
    finally:
        agent.kill()
        agent.wait()
