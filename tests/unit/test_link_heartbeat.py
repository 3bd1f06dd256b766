"""An agent's heartbeat is only sent when it has sent nothing else for ``heartbeat_s``: any line
proves it alive to the controller, so a rank voting faster than that sends no heartbeat at all.
Real socket; only the link's heartbeat thread runs (its watchdog would end the test process)."""

from __future__ import annotations

import socket
import threading
import time

from tmslurm.agent.link import Link
from tmslurm.wire.messages import Progress
from tmslurm.wire.protocol import Channel, connect

BEAT_S = 0.5


def progress(step: int) -> Progress:
    return Progress(step=step, epoch=0, rank=0, dt=0.01, peak_rss_mb=1.0)


def test_a_busy_agent_sends_no_heartbeat_and_an_idle_one_does():
    server = socket.create_server(("127.0.0.1", 0))
    link = Link(connect("127.0.0.1", server.getsockname()[1]), BEAT_S, 0.0)
    conn, _ = server.accept()
    peer = Channel(conn)
    threading.Thread(target=link._beat, daemon=True).start()
    busy_until = time.monotonic() + 4 * BEAT_S
    step = 0
    while time.monotonic() < busy_until:  # a line every 20 ms: 25x more often than a heartbeat is due
        link.send(progress(step))
        step += 1
        time.sleep(0.02)
    last_sent = time.monotonic()
    got = [peer.recv()["type"] for _ in range(step)]
    assert got == ["progress"] * step  # no heartbeat in between
    conn.settimeout(5 * BEAT_S)
    first = peer.recv()  # idle now: the heartbeat comes once heartbeat_s passed since the last line
    quiet = time.monotonic() - last_sent
    assert first["type"] == "hb" and quiet >= BEAT_S * 0.9, (first, quiet)
    second = peer.recv()
    assert second["type"] == "hb" and time.monotonic() - last_sent >= 2 * BEAT_S * 0.9
    link.lost.set()
    conn.close()
