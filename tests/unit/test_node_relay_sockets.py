"""The node relay on real sockets, with a stand-in controller (a listening TCP socket this test reads):
what goes up, what comes down, and what its agents see when the controller's connection ends."""

from __future__ import annotations

import json
import socket
import threading

import pytest

from tmslurm.agent.relay import Relay, connect_local
from tmslurm.wire.messages import Heartbeat, Vote
from tmslurm.wire.mux import Alive, Gone, Line, Votes, close_frame, deliver, parse_up
from tmslurm.wire.protocol import encode_line

TOKEN = "r" * 32


def vote(rank: int, step: int) -> bytes:
    return encode_line(Vote(step=step, epoch=0, rank=rank, loss=1.0, dt=0.1, peak_rss_mb=1.0))


@pytest.fixture
def lab(tmp_path):
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(10)
    (tmp_path / "controller.json").write_text(json.dumps({"host": "127.0.0.1", "port": server.getsockname()[1]}))
    (tmp_path / "token").write_text(TOKEN)
    relay = Relay(tmp_path, "n1", hb_s=0.05, hold_s=0.02)
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    yield tmp_path, server
    relay.stop()
    thread.join(10)
    server.close()


def upstream(server: socket.socket):
    """The relay's connection as the controller sees it, after its first line (checked)."""
    conn, _ = server.accept()
    conn.settimeout(10)
    rfile = conn.makefile("rb")
    first = json.loads(rfile.readline())
    assert first == {"type": "relay", "token": TOKEN, "node": "n1"}
    return conn, rfile


def frames(rfile, want: type, n: int = 1) -> list:
    """The next ``n`` frames of type ``want`` (heartbeat frames in between are skipped)."""
    got = []
    while len(got) < n:
        frame = parse_up(rfile.readline())
        if isinstance(frame, want):
            got.append(frame)
    return got


def test_lines_votes_and_heartbeats_go_up_and_deliveries_come_down(lab):
    run_dir, server = lab
    a = connect_local(run_dir, "n1", 5)
    conn, up = upstream(server)  # opened when the first agent arrived
    b = connect_local(run_dir, "n1", 5)
    for agent in (a, b):
        agent.settimeout(10)
    a.sendall(b'{"type":"hello","id":0}\n')
    b.sendall(b'{"type":"hello","id":1}\n')
    assert {f.line for f in frames(up, Line, 2)} == {b'{"type":"hello","id":0}\n', b'{"type":"hello","id":1}\n'}
    a.sendall(encode_line(Heartbeat()))  # what an agent's link sends
    while 1 not in frames(up, Alive)[0].subs:  # a heartbeat stops at the relay and becomes "+1"
        pass
    for step in (0, 1):
        a.sendall(vote(0, step))
        b.sendall(vote(1, step))
        (frame,) = frames(up, Votes)
        assert frame.subs == (1, 2) and json.loads(frame.payload)["step"] == step  # one frame for the node
    conn.sendall(deliver([1, 2], b'{"type":"decision"}\n'))
    assert a.makefile("rb").readline() == b.makefile("rb").readline() == b'{"type":"decision"}\n'
    conn.sendall(close_frame(1))
    assert a.recv(10) == b""
    assert frames(up, Gone) == [Gone(1)]
    b.close()
    assert frames(up, Gone) == [Gone(2)]
    conn.close()


def test_a_bad_vote_goes_up_as_a_line_for_the_controller_to_answer(lab):
    run_dir, server = lab
    a = connect_local(run_dir, "n1", 5)
    _, up = upstream(server)
    bad = vote(0, 0).replace(b'"dt":0.1', b'"dt":"slow"')
    a.sendall(bad)
    assert frames(up, Line) == [Line(1, bad)]


def test_when_the_controller_goes_its_agents_see_eof_and_the_next_one_reconnects(lab):
    run_dir, server = lab
    a = connect_local(run_dir, "n1", 5)
    a.settimeout(10)
    conn, _ = upstream(server)
    conn.shutdown(socket.SHUT_RDWR)
    assert a.recv(10) == b""
    b = connect_local(run_dir, "n1", 5)
    conn2, up2 = upstream(server)  # a new connection, with its relay hello
    b.sendall(b'{"type":"hello","id":3}\n')
    (line,) = frames(up2, Line)
    assert line.line == b'{"type":"hello","id":3}\n'
    conn2.close()


def test_without_a_controller_an_agent_is_closed_at_once(tmp_path):
    (tmp_path / "controller.json").write_text(json.dumps({"host": "127.0.0.1", "port": 1}))
    (tmp_path / "token").write_text(TOKEN)
    relay = Relay(tmp_path, "n2", hb_s=0.05)
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    a = connect_local(tmp_path, "n2", 5)
    a.settimeout(10)
    assert a.recv(10) == b""
    relay.stop()
    thread.join(10)
