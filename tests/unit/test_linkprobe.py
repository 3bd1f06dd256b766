"""Link probes (tmslurm.agent.linkprobe) over real loopback sockets: a probe is timed to its
acknowledgement, a sink survives whatever else connects to it, and nothing hangs."""

from __future__ import annotations

import errno
import socket
import struct
import threading
import time

import pytest

from tmslurm.agent.linkprobe import MAGIC, MAX_PROBE_BYTES, ProbeJob, Prober, ProbeTimeout, Sink, probe


@pytest.fixture
def sink():
    s = Sink("127.0.0.1", timeout_s=2.0).start()
    yield s
    s.stop()


def test_a_probe_is_read_whole_and_acknowledged(sink):
    host, port = sink.address
    seconds = probe(host, port, 4 << 20, timeout_s=10.0)
    assert 0 < seconds < 10.0
    assert sink.served == 1


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(b"GET / HTTP/1.0\r\n\r\n", id="not a probe header"),
        pytest.param(MAGIC + struct.pack(">Q", MAX_PROBE_BYTES + 1), id="over the size limit"),
        pytest.param(MAGIC + struct.pack(">Q", 1000) + b"x" * 10, id="ends short"),
    ],
)
def test_a_bad_connection_is_dropped_and_the_sink_serves_on(sink, payload):
    host, port = sink.address
    with socket.create_connection((host, port), timeout=5.0) as c:
        c.sendall(payload)
        try:  # the sink may close before our shutdown, with bytes unread: a reset, also no acknowledgement
            c.shutdown(socket.SHUT_WR)
            answer = c.recv(64)
        except (ConnectionResetError, BrokenPipeError):
            answer = b""
        except OSError as exc:  # shutdown after the reset: not connected any more
            assert exc.errno == errno.ENOTCONN, exc
            answer = b""
        assert answer == b""
    assert sink.served == 0
    probe(host, port, 1 << 20, timeout_s=10.0)
    assert sink.served == 1


def test_a_sender_that_stalls_mid_probe_delays_no_other(sink):
    host, port = sink.address
    stalled = socket.create_connection((host, port), timeout=5.0)
    stalled.sendall(MAGIC + struct.pack(">Q", 1 << 20) + b"\0" * 1000)  # then nothing: a dead sender
    try:
        assert probe(host, port, 1 << 20, timeout_s=1.5) < 1.5
    finally:
        stalled.close()


def test_a_probe_that_is_never_acknowledged_times_out_and_a_refused_one_is_not_a_timeout():
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (the kernel's backlog) and reads nothing
    try:
        with pytest.raises(ProbeTimeout):
            probe("127.0.0.1", silent.getsockname()[1], 32 << 20, timeout_s=0.5)
    finally:
        silent.close()
    free = socket.create_server(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    with pytest.raises(OSError) as exc:
        probe("127.0.0.1", port, 1 << 20, timeout_s=0.5)
    assert not isinstance(exc.value, ProbeTimeout)
    with pytest.raises(ValueError):
        probe("127.0.0.1", port, 0, timeout_s=0.5)


def test_the_prober_reports_each_probe_and_answers_busy_while_one_runs(sink):
    results: list[tuple[int, float | None, str, bool]] = []
    done = threading.Event()

    def report(seq, seconds, error, timed_out):
        results.append((seq, seconds, error, timed_out))
        if seq == 1:
            done.set()

    prober = Prober(report, timeout_s=10.0)
    host, port = sink.address
    prober.submit(ProbeJob(1, host, port, 8 << 20))
    prober.submit(ProbeJob(2, host, port, 8 << 20))  # the queue holds one: this one waits its turn
    prober.submit(ProbeJob(3, host, port, 8 << 20))
    assert done.wait(30.0)
    busy = [r for r in results if r[2].startswith("busy")]
    assert busy and all(r[1] is None and not r[3] for r in busy)
    first = next(r for r in results if r[0] == 1)
    assert first[1] is not None and first[1] > 0 and first[2] == ""


def test_a_monitor_announces_its_sink_and_answers_a_probe_request(tmp_path):
    from tests.unit.test_monitor_pidfd import FakeLink
    from tmslurm.agent.monitor import REJOINED, Monitor
    from tmslurm.wire.messages import Finish, Probed, ProbeLink, SinkAt

    peer = Sink("127.0.0.1", timeout_s=2.0).start()
    own = Sink("127.0.0.1", timeout_s=2.0)
    link = FakeLink()
    prober = Prober(
        lambda seq, sec, err, late: link.send(Probed(seq=seq, seconds=sec, error=err, timed_out=late)), 10.0
    )
    mon = Monitor(tmp_path, link, "n0", stop_after_s=60.0, sink=own, prober=prober)
    try:
        host, port = peer.address
        link.inbox.put(ProbeLink(seq=7, host=host, port=port, nbytes=1 << 20))
        link.inbox.put(REJOINED)  # a restarted controller: the sink is announced again
        t = threading.Thread(target=mon.run, daemon=True)
        t.start()
        deadline = time.monotonic() + 20
        while not any(isinstance(m, Probed) for m in link.sent):
            assert time.monotonic() < deadline, link.sent
            time.sleep(0.01)
        link.inbox.put(Finish())
        t.join(10)
        (answer,) = [m for m in link.sent if isinstance(m, Probed)]
        assert answer.seq == 7 and answer.seconds and answer.seconds > 0 and answer.error == ""
        assert [m for m in link.sent if isinstance(m, SinkAt)] == [SinkAt(host="127.0.0.1", port=own.address[1])] * 2
        assert peer.served == 1
    finally:
        peer.stop()
        own.stop()
