"""The gate and a node relay's connection, on a real loopback socket: each agent behind the relay is
authenticated and validated as if it had its own connection; a bad frame gets an error reply and
changes nothing."""

from __future__ import annotations

import json
import queue
import socket

import pytest

from tests.unit.test_gate import unbatched
from tmslurm.controller.gate import Gate, GateLimits
from tmslurm.controller.items import Disconnected, HelloIn, MessageIn, VotesIn
from tmslurm.controller.journal import Journal, read_journal
from tmslurm.wire.messages import Beat
from tmslurm.wire.mux import SubChannel, deliver, parse_down, up_alive, up_gone, up_line, up_votes
from tmslurm.wire.protocol import encode_line

TOKEN = "t" * 32


def hello(ident: int, token: str = TOKEN) -> bytes:
    return encode_line({"type": "hello", "token": token, "kind": "worker", "id": ident, "node": "n1"})


def vote(rank: int, step: int = 0) -> dict:
    return {"type": "vote", "step": step, "epoch": 0, "rank": rank, "loss": 1.0, "dt": 0.1, "peak_rss_mb": 1.0}


@pytest.fixture
def relay(tmp_path):
    server = socket.create_server(("127.0.0.1", 0))
    items: queue.Queue = queue.Queue()
    touched: queue.Queue = queue.Queue()
    journal = Journal(tmp_path / "events.jsonl")
    g = Gate(server, TOKEN, None, journal, unbatched(items), touched.put, GateLimits(max_relay_subs=3))
    g.start()
    sock = socket.create_connection(server.getsockname())
    sock.sendall(encode_line({"type": "relay", "token": TOKEN, "node": "n1"}))
    yield sock, sock.makefile("rb"), items, touched, journal
    sock.close()
    g.stop()


def test_a_wrong_relay_token_is_refused(tmp_path):
    server = socket.create_server(("127.0.0.1", 0))
    items: queue.Queue = queue.Queue()
    g = Gate(server, TOKEN, None, Journal(tmp_path / "e.jsonl"), unbatched(items), lambda c: None, GateLimits())
    g.start()
    sock = socket.create_connection(server.getsockname())
    sock.sendall(encode_line({"type": "relay", "token": "x" * 32, "node": "n1"}))
    assert json.loads(sock.makefile().readline())["type"] == "error"
    assert sock.recv(10) == b""
    g.stop()


def test_agents_behind_a_relay_are_agents_and_hear_through_it(relay):
    sock, rfile, items, touched, _ = relay
    sock.sendall(up_line(1, hello(0)) + up_line(2, hello(1)))
    h1, h2 = items.get(timeout=10), items.get(timeout=10)
    assert isinstance(h1, HelloIn) and isinstance(h2, HelloIn) and (h1.hello.id, h2.hello.id) == (0, 1)
    (c1, ch1), (c2, ch2) = (h1.conn, h1.ch), (h2.conn, h2.ch)
    assert c1 != c2 and isinstance(ch1, SubChannel) and (ch1.sub, ch2.sub) == (1, 2)
    ch2.try_send(Beat())
    assert parse_down(rfile.readline()) == parse_down(deliver([2], b'{"type":"beat"}\n'))
    sock.sendall(
        up_line(
            1,
            encode_line(
                {"type": "groups", "rank": 0, "step": 0, "epoch": 0, "ids": {}, "gens": {}, "peak_rss_mb": 1.0}
            ),
        )
    )
    item = items.get(timeout=10)
    assert isinstance(item, MessageIn) and (item.conn, item.msg.type) == (c1, "groups")
    sock.sendall(up_alive([2]))
    while touched.get(timeout=10) != c2:
        pass
    sock.sendall(up_votes([1, 2], [vote(0), vote(1)]))
    item = items.get(timeout=10)
    assert isinstance(item, VotesIn) and (item.conns, [r.rank for r in item.votes.rows()]) == ([c1, c2], [0, 1])
    ch1.close()
    assert parse_down(rfile.readline()).sub == 1  # "!1": the relay closes that agent
    sock.sendall(up_gone(1))
    assert items.get(timeout=10) == Disconnected(c1)
    sock.shutdown(socket.SHUT_RDWR)  # the relay's connection ends: every agent still behind it is disconnected
    assert items.get(timeout=10) == Disconnected(c2)


@pytest.mark.parametrize(
    "line,what",
    [
        (b"x\n", "malformed relay frame"),
        (up_votes([1], [vote(0)]).replace(b'"dt":[0.1]', b'"dt":[-1]'), "malformed relay frame"),
        (up_votes([1, 2], [vote(0)]), "one sub per rank"),
    ],
)
def test_a_bad_frame_is_answered_and_changes_nothing(relay, line, what):
    sock, rfile, items, _, journal = relay
    sock.sendall(up_line(1, hello(0)) + up_line(2, hello(1)))
    items.get(timeout=10), items.get(timeout=10)
    sock.sendall(line)
    reply = json.loads(rfile.readline())
    assert reply["type"] == "error" and what in reply["error"], reply
    sock.sendall(up_votes([1], [vote(0, step=3)]))  # the relay's connection still works
    assert isinstance(items.get(timeout=10), VotesIn)
    assert items.empty() and any(e["type"] == "bad_message" for e in read_journal(journal.path))


@pytest.mark.parametrize(
    "first,error",
    [
        (hello(0, token="w" * 32), "wrong token"),
        (encode_line({"type": "status", "token": TOKEN}), "only an agent's hello"),
        (encode_line(vote(0)), "wrong token"),
        (
            encode_line(
                {
                    "type": "signed_notice",
                    "signature": "s",
                    "payload": {  # its refusal goes to that agent too
                        "run": "r",
                        "node": "n1",
                        "event": "maintenance",
                        "timestamp": 1.0,
                        "nonce": "n" * 16,
                    },
                }
            ),
            "no signed notices",
        ),
    ],
)
def test_an_agent_refused_behind_a_relay_is_closed_alone(relay, first, error):
    sock, rfile, items, _, _ = relay
    sock.sendall(up_line(1, first) + up_line(1, hello(1)) + up_line(2, hello(2)))
    reply = json.loads(parse_down(rfile.readline()).line)
    assert reply["type"] == "error" and error in reply["error"], reply
    assert parse_down(rfile.readline()).sub == 1  # closed; its later lines are ignored
    item = items.get(timeout=10)
    assert isinstance(item, HelloIn) and item.hello.id == 2 and items.empty()


def test_a_vote_before_its_hello_is_refused_and_the_others_count(relay):
    sock, rfile, items, _, _ = relay
    sock.sendall(up_line(1, hello(0)))
    c1 = items.get(timeout=10).conn
    sock.sendall(up_votes([1, 2], [vote(0), vote(1)]))
    assert "hello" in json.loads(parse_down(rfile.readline()).line)["error"]
    assert parse_down(rfile.readline()).sub == 2
    item = items.get(timeout=10)
    assert isinstance(item, VotesIn) and item.conns == [c1, 0]


def test_a_relay_carries_at_most_max_relay_subs(relay):
    sock, rfile, items, _, _ = relay
    sock.sendall(b"".join(up_line(k, hello(k)) for k in (1, 2, 3, 4)))
    assert [items.get(timeout=10).hello.id for _ in range(3)] == [1, 2, 3]
    assert "at most 3" in json.loads(parse_down(rfile.readline()).line)["error"]
    assert parse_down(rfile.readline()).sub == 4 and items.empty()
