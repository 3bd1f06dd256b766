"""Prometheus metrics of a run, served by its controller (``metrics.port``; 0 = off).

Contract:
- :class:`RunMetrics` owns its own ``CollectorRegistry`` (never prometheus_client's global one).
  Every series carries the labels ``run`` (the run directory's name) and ``job`` (the Slurm main
  job id, ``local`` otherwise), plus a bounded label where one is named: an event ``kind``, a
  downtime ``part``, a standby's ``shape_class``. Never a step number or a node name.
- It is fed from two places, both cheap: :meth:`observe` is the journal's listener (completed
  events with their downtime and parts, nodes lost, ranks fenced, nodes given back, a controller
  restart, a gray eviction by ``cause``), and :meth:`on_commits` gets the step log entries of new commits and the warm
  pool (steps, step times, commit latencies, checkpoint stalls, warm standbys by shape class). The checkpoint's age is
  read at scrape time from the run directory (:func:`~tmslurm.train.ckpt_index.latest_complete`).
- :meth:`serve` starts prometheus_client's HTTP server on ``metrics.addr`` (default
  127.0.0.1) in a daemon thread. It answers every request with the text exposition format and
  changes nothing. A port that cannot be bound is logged and journalled (``metrics_unavailable``);
  the run goes on without metrics.
- prometheus_client's metrics are thread-safe: the journal may be written from the gate's threads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily

from tmslurm.controller.events import PARTS, RESTART_PARTS
from tmslurm.train.ckpt_index import latest_complete

log = logging.getLogger(__name__)
STEP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
DOWNTIME_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 180.0, 600.0)
EVENT_PARTS = tuple(dict.fromkeys((*PARTS, *RESTART_PARTS, "pause_s", "downtime_s")))
"""The parts of the last event exported as ``tmslurm_last_event_seconds{part}``: a fixed set."""


class _CheckpointAge:
    """Collector: steps since the latest complete checkpoint, read when scraped."""

    def __init__(self, labels: dict[str, str], run_dir: Path, shards: list[str], step: Callable[[], int]) -> None:
        self.labels, self.run_dir, self.shards, self.step = labels, run_dir, shards, step

    def collect(self) -> Iterable[GaugeMetricFamily]:
        latest = latest_complete(self.run_dir, self.shards)
        fam = GaugeMetricFamily(
            "tmslurm_checkpoint_age_steps",
            "Committed steps since the latest complete checkpoint (the step itself when there is none)",
            labels=list(self.labels),
        )
        fam.add_metric(list(self.labels.values()), self.step() - (latest or 0))
        yield fam


class RunMetrics:
    def __init__(self, run: str, job: str, run_dir: Path, shards: list[str], controller_incarnation: int) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.base = {"run": run, "job": job}
        names, reg = list(self.base), self.registry
        self.step = Gauge("tmslurm_step", "Last committed step", names, registry=reg).labels(**self.base)
        self.commits = Counter(
            "tmslurm_commits", "Steps committed (a step redone after a restart counts again)", names, registry=reg
        ).labels(**self.base)
        self.step_seconds = Histogram(
            "tmslurm_step_seconds",
            "Step time: the slowest rank's, per commit",
            names,
            buckets=STEP_BUCKETS,
            registry=reg,
        ).labels(**self.base)
        self.commit_seconds = Histogram(
            "tmslurm_commit_latency_seconds",
            "From a step's first vote reaching the controller to its commit decision",
            names,
            buckets=COMMIT_BUCKETS,
            registry=reg,
        ).labels(**self.base)
        self.stall_seconds = Histogram(
            "tmslurm_checkpoint_stall_seconds",
            "How long a checkpoint held the step loop (the slowest rank's, per checkpointed step)",
            names,
            buckets=STEP_BUCKETS,
            registry=reg,
        ).labels(**self.base)
        self.events = Counter("tmslurm_events", "Completed events", [*names, "kind"], registry=reg)
        self.downtime = Histogram(
            "tmslurm_event_downtime_seconds",
            "Downtime of completed events",
            [*names, "kind"],
            buckets=DOWNTIME_BUCKETS,
            registry=reg,
        )
        self.last_parts = Gauge(
            "tmslurm_last_event_seconds",
            "Downtime and parts of the last completed event",
            [*names, "part"],
            registry=reg,
        )
        self.warm = Gauge(
            "tmslurm_warm_standbys", "Idle standbys warm for a shape class", [*names, "shape_class"], registry=reg
        )
        self.nodes_lost = Counter(
            "tmslurm_nodes_lost", "Nodes found dead by their monitors", names, registry=reg
        ).labels(**self.base)
        self.fenced = Counter(
            "tmslurm_ranks_fenced", "Rank processes fenced (hung, silent, or their node lost)", names, registry=reg
        ).labels(**self.base)
        self.given_back = Counter(
            "tmslurm_nodes_given_back", "Nodes given back to Slurm after a switch emptied them", names, registry=reg
        ).labels(**self.base)
        self.gray_evictions = Counter(
            "tmslurm_gray_evictions",
            "Nodes moved off because they were slow: their ranks' compute (cause=compute) or their link (cause=link)",
            [*names, "cause"],
            registry=reg,
        )
        self.controller_restarts = Gauge(
            "tmslurm_controller_restarts", "Times this run's controller was restarted", names, registry=reg
        ).labels(**self.base)
        self.controller_restarts.set(controller_incarnation)
        self.last_step = 0
        """The step the next commit decides (read by the checkpoint-age collector at scrape time)."""
        reg.register(_CheckpointAge(self.base, run_dir, shards, lambda: self.last_step))
        self.handlers: dict[str, Callable[[dict[str, Any]], None]] = {
            "event": self._on_event,
            "node_lost": lambda e: self.nodes_lost.inc(),
            "fenced": lambda e: self.fenced.inc(),
            "node_released": lambda e: self.given_back.inc(),
            "gray_evict": self._on_gray_evict,
        }
        """Journal entry type -> what it counts."""

    def observe(self, entry: dict[str, Any]) -> None:
        """The journal's listener: called with every entry written."""
        handler = self.handlers.get(entry["type"])
        if handler is not None:
            handler(entry)

    def _on_event(self, rec: dict[str, Any]) -> None:
        kind = str(rec.get("kind"))
        self.events.labels(**self.base, kind=kind).inc()
        down = rec.get("downtime_s")
        if isinstance(down, (int, float)):
            self.downtime.labels(**self.base, kind=kind).observe(down)
        for part in EVENT_PARTS:
            value = rec.get(part)
            self.last_parts.labels(**self.base, part=part).set(
                value if isinstance(value, (int, float)) else float("nan")
            )

    def _on_gray_evict(self, rec: dict[str, Any]) -> None:
        cause = rec.get("cause")
        self.gray_evictions.labels(**self.base, cause=cause if cause in ("compute", "link") else "other").inc()

    def on_commits(self, entries: list[dict[str, Any]], warm: dict[str, int]) -> None:
        """New step log entries (one per commit) and the idle warm standbys per shape class."""
        for e in entries:
            self.commits.inc()
            self.step_seconds.observe(e["dt"])
            if "commit_s" in e:
                self.commit_seconds.observe(e["commit_s"])
            if "ckpt_s" in e:
                self.stall_seconds.observe(e["ckpt_s"])
            self.last_step = e["step"] + 1
            self.step.set(self.last_step)
        for shape_class, count in warm.items():
            self.warm.labels(**self.base, shape_class=shape_class).set(count)

    def serve(self, addr: str, port: int) -> int | None:
        """Serve the registry on ``addr:port``; the bound port, or None when it cannot be bound."""
        try:
            server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            log.error("metrics: cannot serve on %s:%d (%s); the run goes on without them", addr, port, exc)
            return None
        bound = int(server.server_port)
        log.info("metrics: http://%s:%d/metrics", addr, bound)
        return bound
