"""The node monitor's pidfd watch on real processes: an agent of this run is watched and its exit
reported at once; a pid that is not one of this run's agents is never watched or reported."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

from tmslurm.messages import Finish, Watch
from tmslurm.runtime.monitor import Monitor, is_agent_of


class FakeLink:
    def __init__(self) -> None:
        self.inbox: queue.Queue = queue.Queue()
        self.sent: list[dict] = []

    def get(self, timeout: float | None = None):
        return self.inbox.get(timeout=timeout) if timeout else self.inbox.get_nowait()

    def send(self, msg: dict) -> None:
        self.sent.append(msg)


def fake_agent(run_dir: Path) -> subprocess.Popen:
    """A process whose command line is an agent's of ``run_dir`` (it only sleeps)."""
    code = "import time; time.sleep(60)"
    return subprocess.Popen([sys.executable, "-c", code, "tmslurm.runtime.agent", "--run-dir", str(run_dir)])


def test_a_watched_agent_exit_is_reported_and_a_stranger_is_not_watched(tmp_path):
    agent, stranger = fake_agent(tmp_path), subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    other_run = fake_agent(tmp_path / "other")
    try:
        assert is_agent_of(agent.pid, tmp_path) and not is_agent_of(stranger.pid, tmp_path)
        assert not is_agent_of(other_run.pid, tmp_path)
        link = FakeLink()
        mon = Monitor(tmp_path, link, "n0")
        for aid, pid in (("worker0.1#1", agent.pid), ("x", stranger.pid), ("y", other_run.pid)):
            link.inbox.put(Watch(agent=aid, pid=pid))
        t = threading.Thread(target=mon.run, daemon=True)
        t.start()
        deadline = time.monotonic() + 10
        while len(mon.watched) < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        killed_t = time.monotonic()
        agent.kill()
        stranger.kill()
        while not link.sent:
            assert time.monotonic() < deadline, "the exit was not reported"
            time.sleep(0.005)
        reported_s = time.monotonic() - killed_t
        assert link.sent == [{"type": "exited", "agent": "worker0.1#1", "pid": agent.pid}]
        assert reported_s < 1.0, reported_s
        link.inbox.put(Finish())
        t.join(5)
        assert not t.is_alive() and link.sent == [{"type": "exited", "agent": "worker0.1#1", "pid": agent.pid}]
    finally:
        for p in (agent, stranger, other_run):
            p.kill()
            p.wait()
