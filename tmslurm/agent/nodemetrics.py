"""A node monitor's own Prometheus metrics (``metrics.monitor_port``; 0 = off).

Contract: :class:`NodeMetrics` owns its own registry. Every series carries the labels ``run`` (the
run directory's name), ``job`` (``SLURM_JOB_ID`` of the monitor's job, ``local`` otherwise) and
``node`` (the monitor's node: one per process, so bounded). It exports what this node sees:
processes watched now, exits and stops reported, rejoins of a restarted controller, and when the
monitor started. :meth:`serve` starts prometheus_client's HTTP server on ``metrics.addr``
(default 127.0.0.1); every request gets the text exposition format and changes nothing. The bound
port is written to ``<run_dir>/monitors/<node>.metrics`` so an operator (or a test) finds it.

Failure behaviour: a port that cannot be bound (taken, or a second monitor on the same host, as with
``cluster=local``, where every node is this host) is logged and the monitor goes on without metrics.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

log = logging.getLogger(__name__)


class NodeMetrics:
    def __init__(self, run_dir: Path, node: str) -> None:
        self.run_dir = Path(run_dir)
        self.node = node
        self.registry = CollectorRegistry(auto_describe=True)
        labels = {"run": self.run_dir.name, "job": os.environ.get("SLURM_JOB_ID", "local"), "node": node}
        names, reg = list(labels), self.registry
        self.watched = Gauge(
            "tmslurm_node_watched_processes",
            "tmslurm processes of this node the monitor watches now",
            names,
            registry=reg,
        ).labels(**labels)
        self.exits = Counter(
            "tmslurm_node_exits_reported", "Exits of watched processes reported to the controller", names, registry=reg
        ).labels(**labels)
        self.stops = Counter(
            "tmslurm_node_stops_reported",
            "Watched processes reported stopped (SIGSTOP, a debugger)",
            names,
            registry=reg,
        ).labels(**labels)
        self.rejoins = Counter(
            "tmslurm_node_controller_rejoins", "Times the monitor rejoined a restarted controller", names, registry=reg
        ).labels(**labels)
        Gauge(
            "tmslurm_node_monitor_start_time_seconds",
            "When this node's monitor started (Unix time)",
            names,
            registry=reg,
        ).labels(**labels).set(time.time())

    def serve(self, addr: str, port: int) -> int | None:
        """Serve on ``addr:port`` and record the bound port; None when it cannot be bound."""
        try:
            server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            log.error(
                "node %s: cannot serve metrics on %s:%d (%s); the monitor goes on without them",
                self.node,
                addr,
                port,
                exc,
            )
            return None
        bound = int(server.server_port)
        path = self.run_dir / "monitors" / f"{self.node}.metrics"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{addr}:{bound}\n")
        log.info("node %s: metrics on http://%s:%d/metrics", self.node, addr, bound)
        return bound
