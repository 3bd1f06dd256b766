"""Nothing a client can break: hostile hellos, malformed lines, pre-auth abuse, signed notices.

A live local run (real processes, real gloo) gets the messages; every run still ends bit-identical
to the uninterrupted one, and a sentinel process whose pid a client reported survives.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time

import pytest

from tests.distributed.test_recovery import BASE, STEPS, assert_exact
from tmslurm.core.signing import generate_keypair, load_private_key, signed_notice
from tmslurm.wire.protocol import exchange, read_token

pytestmark = pytest.mark.dist
LAYOUT = ("parallel.dp=2", "parallel.pp=2")


@pytest.fixture
def sentinel():
    """A process outside the run; nothing may signal it."""
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def addr_of(run):
    return json.loads((run.run_dir / "controller.json").read_text())


def send_line(addr, data: bytes, timeout: float = 10.0) -> dict | None:
    """Send raw bytes as a first line (closing our side) and return the controller's reply, if any."""
    with socket.create_connection((addr["host"], addr["port"]), timeout=timeout) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        reply = sock.makefile("rb").readline()
    return json.loads(reply) if reply else None


def all_up(run, n=4):
    deadline = time.monotonic() + 120
    while sum(e["type"] == "agent_up" for e in run.journal()) < n:
        assert time.monotonic() < deadline and run.proc.poll() is None, run.output()[-2000:]
        time.sleep(0.05)


def test_hostile_hellos_and_malformed_messages_change_nothing(launch, baseline, sentinel):
    run = launch(*LAYOUT, *BASE)
    all_up(run)
    addr, token = addr_of(run), read_token(run.run_dir)
    hostile = [
        {"type": "hello", "token": token, "kind": "worker", "id": 1, "pid": sentinel.pid, "node": "local0"},
        {"type": "hello", "token": token, "kind": "standby", "id": 0, "pid": sentinel.pid, "node": "x"},
        {"type": "hello", "token": token, "kind": "worker", "id": 3, "pid": -1, "node": "local1"},
    ]
    for msg in hostile:
        reply = exchange(addr, msg)
        assert reply["type"] == "error" and "refused" in reply["error"], reply
    malformed = [
        {"type": "notice", "token": token, "event": "maintenance", "node": ["a"]},  # crashed the old controller
        {"type": "hello", "token": token, "kind": "worker", "id": 1, "pid": "1", "node": "n"},
        {"type": "left", "token": token},
        {"type": "stop", "token": token, "extra": 1},
        {"type": "notice", "token": token, "event": "failure", "rank": 2**40},
    ]
    for msg in malformed:
        reply = exchange(addr, msg)
        assert reply["type"] == "error" and "bad first message" in reply["error"], reply
    s = run.wait()
    assert_exact(s, baseline(*LAYOUT, f"train.steps={STEPS}"))
    assert s["events"] == []
    assert sentinel.poll() is None, "a process outside the run was signalled"
    journal = run.journal()
    assert sum(e["type"] == "hello_refused" for e in journal) == 3
    assert sum(e["type"] == "bad_message" for e in journal) == len(malformed)
    assert not any(e["type"] in ("handler_error", "fenced") for e in journal)


def test_preauth_limits_drop_oversize_slow_and_surplus_clients(launch, baseline):
    # Slow steps: the run must outlive the gate's 5 s auth timeout so the last status request finds it running.
    run = launch(*LAYOUT, *[o for o in BASE if not o.startswith("bench.step_delay_s=")], "bench.step_delay_s=0.5")
    all_up(run)
    addr = addr_of(run)
    assert send_line(addr, b'{"type": "status", "token": "' + b"x" * 100_000 + b'"}\n') is None
    idle = [socket.create_connection((addr["host"], addr["port"])) for _ in range(40)]  # never send anything
    run.wait_for(lambda e: e["type"] == "preauth_dropped" and "too many" in e["why"])

    # Every idle socket is either refused at once ("too many") or dropped after auth_timeout_s ("in time");
    # the gate frees a slot before it journals the drop, so once all 40 are journalled the gate has room.
    def idle_drops() -> int:
        return sum(
            e["type"] == "preauth_dropped" and ("too many" in e["why"] or "in time" in e["why"]) for e in run.journal()
        )

    deadline = time.monotonic() + 60
    while idle_drops() < len(idle):
        assert time.monotonic() < deadline, f"only {idle_drops()} of {len(idle)} idle clients were dropped"
        time.sleep(0.05)
    assert any(e["type"] == "preauth_dropped" and "in time" in e["why"] for e in run.journal())
    for sock in idle:
        sock.close()
    reply = exchange(addr, {"type": "status", "token": read_token(run.run_dir)})
    assert reply["type"] == "status"
    s = run.wait()
    assert_exact(s, baseline(*LAYOUT, f"train.steps={STEPS}"))
    assert any(e["type"] == "preauth_dropped" and "longer than" in e["why"] for e in run.journal())


def test_signed_notices_forged_stale_replayed_refused_valid_one_moves_the_rank(launch, baseline, tmp_path):
    generate_keypair(tmp_path / "admin.key", tmp_path / "admin.pub")
    key = load_private_key(tmp_path / "admin.key")
    generate_keypair(tmp_path / "other.key", tmp_path / "other.pub")
    other = load_private_key(tmp_path / "other.key")
    run = launch(
        *LAYOUT, *BASE, "standby.count=1", f"security.admin_public_key_file={tmp_path / 'admin.pub'}", name="signed"
    )
    all_up(run, n=5)
    run.wait_for(lambda e: e["type"] == "standby_ready")
    addr = addr_of(run)
    forged = signed_notice(other, "signed", "local0", "maintenance")
    stale = signed_notice(key, "signed", "local0", "maintenance", now=time.time() - 3600)
    wrong_run = signed_notice(key, "another-run", "local0", "maintenance")
    token_type = {**signed_notice(key, "signed", "local0", "maintenance").model_dump(), "type": "stop"}
    for msg, why in ((forged, "bad signature"), (stale, "stale"), (wrong_run, "signed for run")):
        reply = exchange(addr, msg)
        assert reply["type"] == "error" and why in reply["error"], reply
    assert exchange(addr, token_type)["type"] == "error"  # a signature is no token: it cannot stop a run
    good = signed_notice(key, "signed", "local1", "maintenance", reason="PSU swap")
    assert exchange(addr, good)["type"] == "ok"
    replay = exchange(addr, good)
    assert replay["type"] == "error" and "replayed" in replay["error"]
    s = run.wait()
    assert_exact(s, baseline(*LAYOUT, f"train.steps={STEPS}"))
    (ev,) = [e for e in s["events"] if e["kind"] == "planned"]
    assert ev["node"] == "local1" and ev["cause"] == "PSU swap"
    refused = [e for e in run.journal() if e["type"] == "notice_refused"]
    assert len(refused) == 4, refused
