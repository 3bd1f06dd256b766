"""Link probes: how fast a node's link moves bytes, measured between two node monitors.

Contract:
- :class:`Sink` listens on one TCP address of its node (the address its link to the controller
  leaves from, so a probe crosses the node's own link) and serves each probe on a thread of its own,
  at most ``MAX_CONNECTIONS`` at once (more are closed at once), so a sender that died mid-probe
  delays no other. A probe is a 16-byte header (``MAGIC`` and the byte count, big-endian) followed by that
  many bytes; the sink reads them all, answers ``ACK`` and the count, and discards them. It keeps
  nothing and acts on nothing, so it needs no credential: a header that is not ``MAGIC``, a count
  over ``MAX_PROBE_BYTES`` or a peer silent for ``timeout_s`` closes the connection, and the sink
  goes on serving.
- :func:`probe` sends ``nbytes`` to a sink and returns the seconds from the first byte sent to the
  acknowledgement (connecting is not counted); it raises :class:`ProbeTimeout` when the bytes or
  the acknowledgement take over ``timeout_s`` (a slow link), another ``OSError`` when the sink
  cannot be reached or answers wrong (no connection within ``timeout_s`` included: a cut link is
  not a slow one), and never hangs.
- :class:`Prober` runs the probes a monitor is asked for on one thread, one at a time, and hands
  each result to a callback; a request while one runs is answered at once as busy.

Bytes are what is timed, not messages: a token bucket (a degraded link, the lab's ``slowlink``)
passes its burst at full speed, so a probe must be several times the burst to show the rate.
"""

from __future__ import annotations

import logging
import queue
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)
MAGIC = b"TMSLPRB1"
ACK = b"TMSLACK1"
MAX_PROBE_BYTES = 64 << 20
CHUNK = 1 << 16
MAX_CONNECTIONS = 8


class ProbeTimeout(TimeoutError):
    """The probe's bytes or its acknowledgement took longer than its timeout: the link is slow."""


class Sink:
    """A probe sink on ``host`` (an ephemeral port); :meth:`start` serves on a daemon thread."""

    def __init__(self, host: str, timeout_s: float = 30.0) -> None:
        self.sock = socket.create_server((host, 0))
        self.sock.settimeout(0.5)
        self.timeout_s = timeout_s
        self.stopped = threading.Event()
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.count_lock = threading.Lock()
        self.served = 0
        """Probes read whole and acknowledged (for tests and logs)."""

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.sock.getsockname()[:2]
        return host, port

    def start(self) -> Sink:
        threading.Thread(target=self._serve, name="probe-sink", daemon=True).start()
        return self

    def stop(self) -> None:
        self.stopped.set()
        self.sock.close()

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed by stop()
            if not self.slots.acquire(blocking=False):
                conn.close()
                continue
            threading.Thread(target=self._serve_one, args=(conn,), name="probe-sink-conn", daemon=True).start()

    def _serve_one(self, conn: socket.socket) -> None:
        try:
            with conn:
                self._one(conn)
        except (OSError, ValueError) as exc:
            log.info("probe sink: dropped a connection: %s", exc)
        finally:
            self.slots.release()

    def _one(self, conn: socket.socket) -> None:
        conn.settimeout(self.timeout_s)
        head = _read_exactly(conn, 16)
        if head[:8] != MAGIC:
            raise ValueError("not a probe header")
        (n,) = struct.unpack(">Q", head[8:])
        if n > MAX_PROBE_BYTES:
            raise ValueError(f"probe of {n} bytes is over the limit of {MAX_PROBE_BYTES}")
        buf = memoryview(bytearray(min(n, CHUNK * 16) or 1))
        left = n
        while left:
            got = conn.recv_into(buf, min(len(buf), left))
            if not got:
                raise ConnectionError(f"probe ended {left} bytes short")
            left -= got
        with self.count_lock:
            self.served += 1  # before the answer: whoever got the answer sees it counted
        conn.sendall(ACK + struct.pack(">Q", n))


def _read_exactly(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        got = conn.recv(n - len(buf))
        if not got:
            raise ConnectionError("closed before the header was read")
        buf += got
    return buf


def probe(host: str, port: int, nbytes: int, timeout_s: float) -> float:
    """Send ``nbytes`` to the sink at host:port; the seconds until it acknowledged them all."""
    if not 0 < nbytes <= MAX_PROBE_BYTES:
        raise ValueError(f"a probe moves 1..{MAX_PROBE_BYTES} bytes, not {nbytes}")
    try:
        conn = socket.create_connection((host, port), timeout=timeout_s)
    except TimeoutError as exc:
        raise ConnectionError(f"no connection to the sink within {timeout_s:g} s") from exc
    payload = memoryview(bytearray(nbytes))
    with conn:
        t0 = time.monotonic()
        try:
            conn.settimeout(timeout_s)  # for the whole sendall (Python >= 3.5), not per chunk
            conn.sendall(MAGIC + struct.pack(">Q", nbytes))
            conn.sendall(payload)
            conn.settimeout(max(0.01, t0 + timeout_s - time.monotonic()))
            ack = _read_exactly(conn, 16)
        except TimeoutError as exc:
            raise ProbeTimeout(f"{nbytes} bytes not acknowledged within {timeout_s:g} s") from exc
        elapsed = time.monotonic() - t0
    if ack != ACK + struct.pack(">Q", nbytes):
        raise ConnectionError("the sink did not acknowledge the probe")
    return elapsed


@dataclass(frozen=True)
class ProbeJob:
    seq: int
    host: str
    port: int
    nbytes: int


class Prober:
    """Runs probes one at a time on its own thread; ``report(seq, seconds or None, error, timed_out)``."""

    def __init__(self, report: Callable[[int, float | None, str, bool], None], timeout_s: float) -> None:
        self.report = report
        self.timeout_s = timeout_s
        self.jobs: queue.Queue[ProbeJob] = queue.Queue(maxsize=1)
        threading.Thread(target=self._run, name="link-prober", daemon=True).start()

    def submit(self, job: ProbeJob) -> None:
        try:
            self.jobs.put_nowait(job)
        except queue.Full:
            self.report(job.seq, None, "busy: the previous probe is still running", False)

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            try:
                seconds = probe(job.host, job.port, job.nbytes, self.timeout_s)
            except (OSError, ValueError) as exc:
                self.report(job.seq, None, f"{type(exc).__name__}: {exc}"[:400], isinstance(exc, ProbeTimeout))
            else:
                self.report(job.seq, seconds, "", False)
