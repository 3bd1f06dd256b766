"""The controller's Prometheus endpoint during a real run (real processes, real gloo, loopback): a
drain and a SIGKILL, then a scrape; what it reads matches the journal, and the run ends exact."""

from __future__ import annotations

import os
import signal
import socket
import time
import urllib.request

import pytest

from tests.distributed.test_hostile_clients import addr_of
from tests.distributed.test_recovery import assert_exact
from tmslurm.wire.protocol import exchange, read_token

pytestmark = pytest.mark.dist
prometheus = pytest.importorskip("prometheus_client.parser")
LAYOUT = ("parallel.dp=2", "parallel.pp=2")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("run", "job")))): s.value
        for fam in prometheus.text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_a_scrape_after_a_drain_and_a_kill_matches_the_journal(launch, baseline):
    port = _free_port()
    run = launch(
        *LAYOUT,
        "standby.count=2",
        "standby.start_when_warm=true",
        "train.steps=1000000",
        "bench.step_delay_s=0.05",
        "detect.heartbeat_timeout_s=2.0",
        f"metrics.port={port}",
        "train.checkpoint_every=5",
        "faults=[{step:6,kind:drain,rank:1},{step:12,kind:kill,rank:2}]",
    )
    deadline = time.monotonic() + 180
    while len(events := [e for e in run.journal() if e["type"] == "event"]) < 2:
        assert time.monotonic() < deadline and run.proc.poll() is None, run.output()[-3000:]
        time.sleep(0.1)
    s = _scrape(port)
    journal = run.journal()
    assert s[("tmslurm_events_total", (("kind", "planned"),))] == 1
    assert s[("tmslurm_events_total", (("kind", "unexpected"),))] == 1
    for ev in events:
        assert s[("tmslurm_event_downtime_seconds_sum", (("kind", ev["kind"]),))] == pytest.approx(ev["downtime_s"])
    last = events[-1]
    for part in ("downtime_s", "detect_s", "transfer_s"):
        assert s[("tmslurm_last_event_seconds", (("part", part),))] == pytest.approx(last[part]), part
    assert s[("tmslurm_ranks_fenced_total", ())] == sum(e["type"] == "fenced" for e in journal)
    assert s[("tmslurm_step", ())] >= last["target_step"] + 1
    assert s[("tmslurm_commits_total", ())] == s[("tmslurm_step", ())]  # no restart: each step once
    assert s[("tmslurm_commit_latency_seconds_count", ())] == s[("tmslurm_commits_total", ())]
    assert s[("tmslurm_commit_latency_seconds_sum", ())] > 0
    # checkpoints every 5 steps: each reported stall is observed once, at the step after it
    assert 1 <= s[("tmslurm_checkpoint_stall_seconds_count", ())] <= s[("tmslurm_step", ())] // 5
    # both standbys took a rank; the counts are taken at most once a second, at a commit
    deadline = time.monotonic() + 10
    while _scrape(port)[("tmslurm_warm_standbys", (("shape_class", "first"),))] != 0:
        assert time.monotonic() < deadline, "the warm-standby count never fell to 0"
        time.sleep(0.2)
    assert s[("tmslurm_controller_restarts", ())] == 0
    assert exchange(addr_of(run), {"type": "stop", "token": read_token(run.run_dir)})["type"] == "ok"
    summary = run.wait()
    assert_exact(summary, baseline(*LAYOUT, f"train.steps={summary['steps']}"))


def test_a_node_monitor_serves_its_node_and_counts_an_exit(launch):
    """metrics.monitor_port: on cluster=local every node is this host, so the first monitor binds
    and the others go on without metrics; the one that binds tells its port in monitors/<node>.metrics."""
    port = _free_port()
    run = launch(
        *LAYOUT,
        "standby.count=1",
        "standby.start_when_warm=true",
        "train.steps=1000000",
        "bench.step_delay_s=0.05",
        "detect.heartbeat_timeout_s=2.0",
        f"metrics.monitor_port={port}",
    )
    deadline = time.monotonic() + 120
    while not (files := sorted((run.run_dir / "monitors").glob("*.metrics"))):
        assert time.monotonic() < deadline and run.proc.poll() is None, run.output()[-3000:]
        time.sleep(0.1)
    node = files[0].stem
    assert files[0].read_text().strip() == f"127.0.0.1:{port}"
    up = run.wait_for(lambda e: e["type"] == "agent_up" and e["node"] == node and not e["agent"].startswith("mon"))

    def scraped(name: str) -> float:
        return _scrape(port).get((name, (("node", node),)), -1.0)

    while scraped("tmslurm_node_watched_processes") != 1:  # the controller names the node's process to watch
        assert time.monotonic() < deadline, _scrape(port)
        time.sleep(0.1)
    assert scraped("tmslurm_node_exits_reported_total") == 0
    os.kill(up["pid"], signal.SIGKILL)
    while scraped("tmslurm_node_exits_reported_total") != 1:
        assert time.monotonic() < deadline, _scrape(port)
        time.sleep(0.1)
    assert scraped("tmslurm_node_stops_reported_total") == 0
    assert scraped("tmslurm_node_monitor_start_time_seconds") > 0
    run.wait_for(lambda e: e["type"] == "event")  # the run recovered from the exit the monitor reported
    assert exchange(addr_of(run), {"type": "stop", "token": read_token(run.run_dir)})["type"] == "ok"
    run.wait()
