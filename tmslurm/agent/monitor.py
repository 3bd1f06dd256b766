"""The node monitor: one small process per node that trains nothing.

Contract: ``python -m tmslurm.agent.main --run-dir D --monitor [--node NAME]`` says hello as a
``monitor`` of its node, heartbeats every ``detect.monitor_interval_s`` (its own process: no
training thread, compile or GIL of a rank can delay it), and watches the processes the controller
names in ``watch`` messages through a pidfd each (Linux >= 5.3): the moment one exits, it sends
``exited`` (agent id and pid), even when no socket closed (a child holding the socket open, a
process stuck in exit). It watches only a pid whose command line is a tmslurm agent of this run's
directory; any other pid (gone already, another pid namespace, reused) is logged and skipped, never
reported. A watched process that stays stopped (state ``T``/``t``: SIGSTOP, a debugger) for
``stop_after_s`` is reported once as ``stopped``; its heartbeat thread is stopped too, but this is
seen sooner than any heartbeat timeout. It signals nothing. It ends on ``finish`` and, through its
link, when the controller is lost; with ``runtime.relay`` it also runs the node's relay
(:func:`run_monitor`), and with ``metrics.monitor_port`` it serves its node's Prometheus
metrics (:mod:`tmslurm.agent.nodemetrics`); when its link rejoins a restarted controller it forgets every
watch (agent ids belong to one controller incarnation) and the new controller names them again. Its silence together
with the silence of every process on its node is how the controller tells a node that went dark (power, kernel, cut
link) in under a second.
"""

from __future__ import annotations

import logging
import os
import queue
import select
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tmslurm.agent.link import Link
from tmslurm.agent.linkprobe import ProbeJob, Prober, Sink
from tmslurm.agent.relay import start_relay
from tmslurm.core.config import RunConfig
from tmslurm.core.netaddr import local_address_towards
from tmslurm.wire.messages import Exited, Finish, Probed, ProbeLink, SinkAt, Stopped, Watch

if TYPE_CHECKING:
    from tmslurm.agent.nodemetrics import NodeMetrics

log = logging.getLogger(__name__)
RELAY_DRAIN_S = 5.0
"""After ``finish``, how long the relay may still deliver to the node's agents before the monitor ends."""
REJOINED = object()
"""Put in the link's inbox when it rejoined a restarted controller."""


class Monitor:
    def __init__(
        self,
        run_dir: Path,
        link: Link,
        node: str,
        stop_after_s: float,
        poll_s: float = 0.05,
        metrics: NodeMetrics | None = None,
        sink: Sink | None = None,
        prober: Prober | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.sink = sink
        """This node's link-probe sink (``gray.link_probe_s`` > 0), announced at start and on a rejoin."""
        self.prober = prober
        self.metrics = metrics
        self.link = link
        self.node = node
        self.stop_after_s = stop_after_s
        self.poll_s = poll_s
        self.poller = select.poll()
        self.watched: dict[int, tuple[str, int]] = {}  # pidfd -> (agent id, pid)
        self.stopped_since: dict[int, float] = {}  # pidfd -> when it was first seen stopped
        self.reported: set[int] = set()  # pidfds reported stopped (once each)
        # queued by the link's reader after a rejoin, before anything the new controller sends: the
        # watches before it belong to the dead controller's agent ids, the ones after to the new
        link.on_reconnect.append(lambda: link.inbox.put(REJOINED))

    def run(self) -> int:
        log.info("monitoring node %s", self.node)
        self._announce_sink()
        try:
            while True:
                if self._messages():
                    return 0
                for fd, _ in self.poller.poll(int(self.poll_s * 1000)):
                    self._exited(fd)
                self._check_stopped(time.monotonic())
        finally:
            for fd in list(self.watched):
                os.close(fd)

    def _messages(self) -> bool:
        """Handle what the controller sent; True on ``finish``."""
        while True:
            try:
                msg = self.link.get(timeout=0)
            except queue.Empty:
                return False
            if isinstance(msg, Finish):
                return True
            if msg is REJOINED:
                self._forget_all()
                self._announce_sink()
                if self.metrics is not None:
                    self.metrics.rejoins.inc()
            elif isinstance(msg, Watch):
                self.watch(msg.agent, msg.pid)
            elif isinstance(msg, ProbeLink):
                self._probe(msg)

    def _announce_sink(self) -> None:
        if self.sink is not None:
            host, port = self.sink.address
            self.link.send(SinkAt(host=host, port=port))

    def _probe(self, msg: ProbeLink) -> None:
        if self.prober is None:
            self.link.send(Probed(seq=msg.seq, error="this monitor runs no link probes"))
        else:
            self.prober.submit(ProbeJob(msg.seq, msg.host, msg.port, msg.nbytes))

    def watch(self, agent: str, pid: int) -> bool:
        if not is_agent_of(pid, self.run_dir):
            log.warning("not watching %s: pid %d is not a tmslurm agent of this run on node %s", agent, pid, self.node)
            return False
        try:
            fd = os.pidfd_open(pid)
        except OSError as exc:  # exited between the check and here, or no pidfd: the socket still tells
            log.warning("cannot watch %s (pid %d): %s", agent, pid, exc)
            return False
        self.watched[fd] = (agent, pid)
        self.poller.register(fd, select.POLLIN)
        self._count_watched()
        return True

    def _count_watched(self) -> None:
        if self.metrics is not None:
            self.metrics.watched.set(len(self.watched))

    def _forget_all(self) -> None:
        """Drop every watch: agent ids are per controller incarnation, the new one sends ``watch`` again."""
        for fd in list(self.watched):
            self.poller.unregister(fd)
            os.close(fd)
        self.watched.clear()
        self.stopped_since.clear()
        self.reported.clear()
        self._count_watched()

    def _check_stopped(self, now_m: float) -> None:
        for fd, (agent, pid) in self.watched.items():
            if not is_stopped(pid):
                self.stopped_since.pop(fd, None)
                self.reported.discard(fd)
                continue
            since = self.stopped_since.setdefault(fd, now_m)
            if now_m - since >= self.stop_after_s and fd not in self.reported:
                self.reported.add(fd)
                log.warning("%s (pid %d) stopped for %.2fs", agent, pid, now_m - since)
                self.link.send(Stopped(agent=agent, pid=pid, stopped_s=round(now_m - since, 4)))
                if self.metrics is not None:
                    self.metrics.stops.inc()

    def _exited(self, fd: int) -> None:
        self.stopped_since.pop(fd, None)
        self.reported.discard(fd)
        agent, pid = self.watched.pop(fd)
        self.poller.unregister(fd)
        os.close(fd)
        log.info("%s (pid %d) exited", agent, pid)
        self.link.send(Exited(agent=agent, pid=pid))
        self._count_watched()
        if self.metrics is not None:
            self.metrics.exits.inc()


def is_stopped(pid: int) -> bool:
    """``pid`` is in state T (stopped) or t (traced, stopped); False when it cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] in (["T"], ["t"])


def is_agent_of(pid: int, run_dir: Path) -> bool:
    """``pid`` runs ``tmslurm.agent.main --run-dir <run_dir>`` (checked on its command line)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if b"tmslurm.agent.main" not in argv or b"--run-dir" not in argv:
        return False
    given = argv[argv.index(b"--run-dir") + 1 :][:1]
    return bool(given) and Path(os.fsdecode(given[0])).resolve() == Path(run_dir).resolve()


def run_monitor(run_dir: Path, link: Link, node: str, cfg: RunConfig, controller_host: str) -> int:
    """The node's monitor, and its node relay (:mod:`tmslurm.agent.relay`) when ``runtime.relay`` is on,
    and its link-probe sink and prober when ``gray.evict`` and ``gray.link_probe_s`` are on."""
    relay = start_relay(run_dir, node, cfg.detect.heartbeat_interval_s) if cfg.runtime.relay else None
    sink = prober = None
    if cfg.gray.evict and cfg.gray.link_probe_s > 0:
        sink = Sink(local_address_towards(controller_host)).start()
        prober = Prober(
            lambda seq, sec, err, late: link.send(Probed(seq=seq, seconds=sec, error=err, timed_out=late)),
            timeout_s=cfg.gray.link_probe_timeout_s,
        )
    metrics = None
    if cfg.metrics.monitor_port:
        from tmslurm.agent.nodemetrics import NodeMetrics

        metrics = NodeMetrics(run_dir, node)
        metrics.serve(cfg.metrics.addr, cfg.metrics.monitor_port)
    try:
        return Monitor(run_dir, link, node, cfg.detect.node_timeout_s, metrics=metrics, sink=sink, prober=prober).run()
    finally:
        if sink is not None:
            sink.stop()
        if relay is not None:
            relay.drain(RELAY_DRAIN_S)
            relay.stop()
