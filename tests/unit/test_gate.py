"""The gate on a real loopback socket: what it queues, what it answers itself, what it drops."""

from __future__ import annotations

import json
import queue
import socket
import time

import pytest

from tmslurm.runtime.gate import Gate, GateLimits
from tmslurm.runtime.journal import Journal, read_journal
from tmslurm.runtime.protocol import exchange

TOKEN = "t" * 32


@pytest.fixture
def gate(tmp_path):
    server = socket.create_server(("127.0.0.1", 0))
    items: queue.Queue = queue.Queue()
    journal = Journal(tmp_path / "events.jsonl")
    g = Gate(server, TOKEN, None, journal, items.put, lambda conn: None,
             GateLimits(auth_timeout_s=0.5, max_unauthenticated=2))
    g.start()
    yield g, items, {"host": "127.0.0.1", "port": server.getsockname()[1]}, journal
    g.stop()


def test_a_valid_request_is_queued_with_its_channel(gate):
    g, items, addr, _ = gate
    sock = socket.create_connection((addr["host"], addr["port"]))
    sock.sendall(b'{"type": "status", "token": "' + TOKEN.encode() + b'"}\n')
    kind, msg, ch = items.get(timeout=10)
    assert (kind, msg.type) == ("request", "status")
    ch.try_send({"type": "status", "status": {}})
    assert json.loads(sock.makefile().readline()) == {"type": "status", "status": {}}
    sock.close()


def test_after_close_requests_the_gate_answers_and_queues_nothing(gate):
    g, items, addr, journal = gate
    g.close_requests("the run has finished; it takes no more requests")
    reply = exchange(addr, {"type": "status", "token": TOKEN})
    assert reply == {"type": "error", "error": "the run has finished; it takes no more requests"}
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
    assert items.get(timeout=10)[0] == "request"
    assert not any("too many" in e["why"] for e in read_journal(journal.path) if e["type"] == "preauth_dropped")
    for s in (*idle, sock):
        s.close()
