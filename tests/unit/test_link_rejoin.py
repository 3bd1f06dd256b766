"""An agent's link rejoins a restarted controller on a real socket: the rejoin carries the last
decision received and the vote still waiting; sticky messages are sent again; a decision for the
waiting vote clears it. Only the link's reader thread runs (its watchdog would end the test process)."""

from __future__ import annotations

import json
import socket
import threading
import time

from tmslurm.agent.link import LOST, Link, Rejoiner
from tmslurm.wire.messages import Decision, Hello, Ready, Vote
from tmslurm.wire.protocol import Channel, connect, encode_line

FIRST = Hello(token="", kind="worker", id=1, pid=1, node="n1", host="h")


def vote(step: int) -> Vote:
    return Vote(step=step, epoch=0, rank=1, loss=1.0, dt=0.01, peak_rss_mb=1.0)


def wait_until(cond, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_rejoin_carries_the_last_decision_and_the_waiting_vote(tmp_path):
    server = socket.create_server(("127.0.0.1", 0))
    (tmp_path / "token").write_text("tok")
    (tmp_path / "controller.json").write_text(
        json.dumps({"host": "127.0.0.1", "port": server.getsockname()[1], "store_port": 1})
    )
    link = Link(connect("127.0.0.1", server.getsockname()[1]), 0.0, 10.0, rejoin=Rejoiner(tmp_path, FIRST))
    link.rejoin_state = lambda: {"rank": 1, "epoch": 0, "in_plan": False}
    first, _ = server.accept()
    c1 = Channel(first)
    threading.Thread(target=link._read, daemon=True).start()
    link.send(Ready(role="only", warmup_s=0.1, rss_mb=1.0, role_rss_mb=0.0, sandbox_sends_skipped=0))
    c1.send_line(encode_line(Decision(step=4, epoch=0)))
    wait_until(lambda: link.last_decision is not None, "decision 4 not read")
    link.send(vote(5))
    assert c1.recv()["type"] == "ready" and c1.recv()["step"] == 5
    c1.close()  # the controller died: its connection closes

    second, _ = server.accept()
    c2 = Channel(second)
    hello = c2.recv()
    assert hello["token"] == "tok" and hello["kind"] == "worker" and hello["id"] == 1
    assert hello["rejoin"]["decision"]["step"] == 4 and Vote.model_validate(hello["rejoin"]["vote"]) == vote(5)
    assert hello["rejoin"]["rank"] == 1 and hello["rejoin"]["in_plan"] is False
    c2.send({"type": "welcome"})
    assert c2.recv()["type"] == "ready"  # sticky: sent again to the new controller
    c2.send_line(encode_line(Decision(step=5, epoch=0)))
    wait_until(lambda: link.pending_vote is None, "the decision did not clear the waiting vote")
    msgs = [link.inbox.get(timeout=5) for _ in range(2)]
    assert [m.step for m in msgs] == [4, 5]  # both decisions reached the agent, in order, once each
    link.send(vote(6))
    assert c2.recv()["step"] == 6  # sends go to the new connection
    c2.close()
    server.close()  # nobody listens any more: the link gives up at once
    assert link.inbox.get(timeout=10) is LOST and link.lost.is_set()
