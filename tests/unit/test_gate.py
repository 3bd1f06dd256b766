"""The gate on a real loopback socket: what it queues, what it answers itself, what it drops."""

from __future__ import annotations

import json
import queue
import socket
import threading
import time

import pytest

from tmslurm.controller.gate import Gate, GateLimits
from tmslurm.controller.items import Batch, Disconnected, HelloIn, MessageIn, RequestIn
from tmslurm.controller.journal import Journal, read_journal
from tmslurm.wire.messages import Beat, Finish, StatusReply
from tmslurm.wire.protocol import MAX_LINE, exchange

TOKEN = "t" * 32
ROUNDS: list[int] = []
"""How many items each hand-over of the gates in this module carried."""


def unbatched(items: queue.Queue):
    """The gate's ``submit``: every item of a round's ``Batch`` queued on its own, in order."""

    def submit(item) -> None:
        many = item.items if isinstance(item, Batch) else [item]
        ROUNDS.append(len(many))
        for one in many:
            items.put(one)

    return submit


@pytest.fixture
def gate(tmp_path):
    server = socket.create_server(("127.0.0.1", 0))
    items: queue.Queue = queue.Queue()
    journal = Journal(tmp_path / "events.jsonl")
    g = Gate(
        server,
        TOKEN,
        None,
        journal,
        unbatched(items),
        lambda conn: None,
        GateLimits(auth_timeout_s=0.5, max_unauthenticated=2),
    )
    g.start()
    yield g, items, {"host": "127.0.0.1", "port": server.getsockname()[1]}, journal
    g.stop()


def test_a_valid_request_is_queued_with_its_channel(gate):
    g, items, addr, _ = gate
    sock = socket.create_connection((addr["host"], addr["port"]))
    sock.sendall(b'{"type": "status", "token": "' + TOKEN.encode() + b'"}\n')
    item = items.get(timeout=10)
    assert isinstance(item, RequestIn) and item.request.type == "status"
    item.ch.try_send(StatusReply(status={}))
    assert json.loads(sock.makefile().readline()) == {"type": "status", "ok": True, "status": {}}
    sock.close()


def test_after_close_requests_the_gate_answers_and_queues_nothing(gate):
    g, items, addr, journal = gate
    g.close_requests("the run has finished; it takes no more requests")
    reply = exchange(addr, {"type": "status", "token": TOKEN})
    assert reply == {"type": "error", "error": "the run has finished; it takes no more requests", "ending": True}
    assert items.empty()


def test_a_slow_client_is_journalled_only_after_its_slot_is_free(gate):
    g, items, addr, journal = gate
    idle = [socket.create_connection((addr["host"], addr["port"])) for _ in range(2)]  # fills both slots
    deadline = time.monotonic() + 30
    while len(drops := [e for e in read_journal(journal.path) if e["type"] == "preauth_dropped"]) < 2:
        assert time.monotonic() < deadline, "the idle clients were not dropped after auth_timeout_s"
        time.sleep(0.02)
    assert all("in time" in e["why"] for e in drops)
    # Both drops are journalled, so both slots are free: a request right now must be queued, not refused.
    sock = socket.create_connection((addr["host"], addr["port"]))
    sock.sendall(b'{"type": "status", "token": "' + TOKEN.encode() + b'"}\n')
    assert isinstance(items.get(timeout=10), RequestIn)
    assert not any("too many" in e["why"] for e in read_journal(journal.path) if e["type"] == "preauth_dropped")
    for s in (*idle, sock):
        s.close()


# ---- one reader thread for every connection --------------------------------------------------------


def open_gate(tmp_path, **limits):
    server = socket.create_server(("127.0.0.1", 0), backlog=512)
    items: queue.Queue = queue.Queue()
    touched: list[int] = []
    journal = Journal(tmp_path / "events.jsonl")
    g = Gate(server, TOKEN, None, journal, unbatched(items), touched.append, GateLimits(**limits))
    g.start()
    return g, items, touched, server.getsockname()[1], journal


def hello(ident: int) -> bytes:
    return (
        json.dumps({"type": "hello", "token": TOKEN, "kind": "worker", "id": ident, "node": f"n{ident}"}).encode()
        + b"\n"
    )


def vote(step: int, rank: int = 0) -> bytes:
    return (
        json.dumps({"type": "vote", "step": step, "epoch": 0, "rank": rank, "dt": 0, "peak_rss_mb": 0}).encode() + b"\n"
    )


def client(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def take(items: queue.Queue, n: int, timeout: float = 30.0) -> list:
    deadline = time.monotonic() + timeout
    got = []
    while len(got) < n:
        try:
            got.append(items.get(timeout=max(0.0, deadline - time.monotonic())))
        except queue.Empty:
            raise AssertionError(f"only {len(got)} of {n} items within {timeout} s: {got[-3:]}") from None
    return got


def wait_for(cond, timeout: float = 30.0, what: str = "the condition"):
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.01)
    return value


def drops(journal, why: str) -> list[dict]:
    return [e for e in read_journal(journal.path) if e["type"] == "preauth_dropped" and why in e["why"]]


def test_many_agents_share_one_reader_thread_and_each_keeps_its_order(tmp_path):
    g, items, touched, port, _ = open_gate(tmp_path, max_unauthenticated=256)
    threads = threading.active_count()
    n, steps = 200, 5
    socks = [client(port) for _ in range(n)]
    for i, s in enumerate(socks):
        s.sendall(hello(i) + b'{"type": "hb"}\n' + b"".join(vote(k, rank=i) for k in range(steps)))
    got = take(items, n * (1 + steps))
    assert threading.active_count() == threads  # not one thread per connection
    per_conn: dict[int, list] = {}
    for item in got:
        per_conn.setdefault(item.conn, []).append(
            ("hello", item.hello.id)
            if isinstance(item, HelloIn)
            else ("msg", (item.msg.type, item.msg.rank, item.msg.step))
        )
    assert len(per_conn) == n
    for seq in per_conn.values():
        (kind, ident), *rest = seq
        assert kind == "hello"
        assert rest == [("msg", ("vote", ident, k)) for k in range(steps)]
    assert sorted(touched) == sorted(c for c in per_conn for _ in range(1 + steps))  # hb touched, never queued
    for s in socks:
        s.close()
    gone = take(items, n)
    assert all(isinstance(item, Disconnected) for item in gone) and {item.conn for item in gone} == set(per_conn)
    g.stop()
    assert not g._thread.is_alive()


def test_a_line_split_across_segments_and_two_lines_in_one_segment(tmp_path):
    g, items, _, port, _ = open_gate(tmp_path)
    sock = client(port)
    line = hello(7)
    for piece in (line[:5], line[5:30], line[30:]):  # the stimulus: three segments for one line
        sock.sendall(piece)
        time.sleep(0.05)
    (hello_in,) = take(items, 1)
    assert isinstance(hello_in, HelloIn) and hello_in.hello.id == 7
    conn = hello_in.conn
    ROUNDS.clear()
    sock.sendall(vote(1) + vote(2))
    assert [(type(i), i.conn, i.msg.step) for i in take(items, 2)] == [(MessageIn, conn, 1), (MessageIn, conn, 2)]
    assert ROUNDS == [2]  # one read, one hand-over: a Batch([MessageIn, MessageIn])
    sock.close()
    g.stop()


def test_an_over_long_first_line_is_dropped(tmp_path):
    g, items, _, port, journal = open_gate(tmp_path, preauth_max_line=1024)
    sock = client(port)
    sock.sendall(b"x" * 2000)
    wait_for(lambda: drops(journal, "longer than 1024 bytes"), what="the oversize client's drop")
    assert sock.recv(100) == b""  # what it sent was read before the close: an EOF, not a reset
    assert items.empty()
    g.stop()


def test_an_over_long_agent_line_is_refused_and_the_agent_goes_on(tmp_path):
    g, items, _, port, journal = open_gate(tmp_path)
    sock = client(port)
    sock.sendall(hello(1))
    conn = take(items, 1)[0].conn
    sock.sendall(b"x" * (MAX_LINE + 10) + b"\n" + vote(3))
    assert [(type(i), i.conn, i.msg.step) for i in take(items, 1)] == [(MessageIn, conn, 3)]
    assert "longer than" in json.loads(sock.makefile().readline())["error"]
    assert [e["conn"] for e in read_journal(journal.path) if e["type"] == "bad_message"] == [conn]
    sock.close()
    g.stop()


def test_a_slow_client_is_dropped_at_its_deadline_while_others_are_served(tmp_path):
    g, items, _, port, journal = open_gate(tmp_path, auth_timeout_s=3.0)
    slow = client(port)
    t0 = time.monotonic()
    slow.sendall(b'{"type": "hel')  # half a line, then nothing
    agent = client(port)
    agent.sendall(hello(2))
    for k in range(3):
        agent.sendall(vote(k))
    assert [type(i) for i in take(items, 4)] == [HelloIn, MessageIn, MessageIn, MessageIn]
    assert not drops(journal, "in time")  # served while the slow one waits
    wait_for(lambda: drops(journal, "in time"), what="the slow client's drop")
    assert time.monotonic() - t0 >= 3.0 - 0.05
    assert slow.recv(100) == b""
    agent.sendall(vote(9))
    assert take(items, 1)[0].msg.step == 9
    for s in (slow, agent):
        s.close()
    g.stop()


def test_a_close_by_the_controller_gives_one_disconnect_and_frees_the_socket(tmp_path):
    g, items, _, port, _ = open_gate(tmp_path)
    sock = client(port)
    sock.sendall(hello(3))
    (hello_in,) = take(items, 1)
    conn, ch = hello_in.conn, hello_in.ch
    assert ch.try_send(Beat())
    ch.close()
    assert take(items, 1) == [Disconnected(conn)]
    wait_for(lambda: ch.sock.fileno() == -1, what="freeing the socket")  # the gate let go too
    assert len(g._sel.get_map()) == 2  # the listening socket and the wake-up pair's end
    assert items.empty()
    f = sock.makefile("rb")
    assert json.loads(f.readline()) == {"type": "beat"} and f.readline() == b""
    assert not ch.try_send(Finish())
    sock.close()
    g.stop()


def test_stop_ends_the_reader_and_closes_the_listening_socket(tmp_path):
    g, items, _, port, _ = open_gate(tmp_path)
    sock = client(port)
    sock.sendall(hello(4))
    ch = take(items, 1)[0].ch
    g.stop()
    assert not g._thread.is_alive()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=5)
    assert ch.try_send(Finish())  # an agent's channel is still the controller's to use and close
    assert sock.makefile().readline() == '{"type":"finish"}\n'
    ch.close()
    assert ch.sock.fileno() == -1
    sock.close()
