"""The controller's Prometheus metrics, driven through the controller with fake channels and
scraped over HTTP on loopback: what the journal and the commits say is what a scrape reads."""

from __future__ import annotations

import math
import re
import urllib.request

import pytest

from tests.unit.controller_harness import Harness
from tmslurm.core.config import compose_config
from tmslurm.core.errors import ConfigError

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402


def _scrape(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def _get(samples, name, **labels):
    base = {"run": labels.pop("run"), "job": "local", **labels}
    return samples[(name, tuple(sorted(base.items())))]


def test_a_scrape_reads_commits_events_nodes_and_standbys(tmp_path):
    h = Harness(tmp_path, 2, 1, 1, "metrics.port=1")  # on; served below on a free port instead
    port = h.ctl.metrics.serve("127.0.0.1", 0)
    assert port
    for _ in range(2):
        h.commit_all()
    for r in range(h.world):  # the step after a checkpoint: rank 1's step loop was held longest
        h.send(
            r,
            {
                "type": "vote",
                "step": 2,
                "epoch": 0,
                "rank": r,
                "loss": 1.0,
                "dt": 0.01,
                "peak_rss_mb": 1.0,
                "ckpt": 0.5 * r,
            },
        )
    h.ctl._offer_snapshot()
    journal = h.ctl.ctx.journal
    journal.write("event", kind="planned", downtime_s=0.12, pause_s=0.05, transfer_s=0.0, detect_s=0.0)
    journal.write("event", kind="unexpected", downtime_s=1.5, detect_s=0.8, transfer_s=0.1)
    journal.write("node_lost", node="n1")
    journal.write("fenced", agent="a", rank=1, node="n1", cause="node lost")
    journal.write("node_released", node="n1")
    journal.write("gray_evict", cause="link", node="n1", best_mbps=2.9, median_mbps=400.0, step=3)
    journal.write("gray_evict", cause="compute", rank=1, node="n1", ratio=1.8, step=3)
    journal.write("gray_evict", cause="compute", rank=0, node="n0", ratio=1.9, step=3)
    journal.write("abort", epoch=1, step=3)  # counts nothing
    run = tmp_path.name
    s = _scrape(port)
    assert _get(s, "tmslurm_step", run=run) == 3 and _get(s, "tmslurm_commits_total", run=run) == 3
    assert _get(s, "tmslurm_step_seconds_count", run=run) == 3
    latencies = [e["commit_s"] for e in h.state.step_log]
    assert _get(s, "tmslurm_commit_latency_seconds_count", run=run) == 3
    assert (
        _get(s, "tmslurm_commit_latency_seconds_sum", run=run) == pytest.approx(sum(latencies)) and min(latencies) >= 0
    )
    assert _get(s, "tmslurm_checkpoint_stall_seconds_count", run=run) == 1  # only the step that reported one
    assert _get(s, "tmslurm_checkpoint_stall_seconds_sum", run=run) == pytest.approx(0.5 * (h.world - 1))
    assert _get(s, "tmslurm_events_total", run=run, kind="planned") == 1
    assert _get(s, "tmslurm_events_total", run=run, kind="unexpected") == 1
    assert _get(s, "tmslurm_event_downtime_seconds_sum", run=run, kind="unexpected") == pytest.approx(1.5)
    assert _get(s, "tmslurm_last_event_seconds", run=run, part="detect_s") == pytest.approx(0.8)
    assert math.isnan(_get(s, "tmslurm_last_event_seconds", run=run, part="pause_s"))  # the last event had none
    assert _get(s, "tmslurm_nodes_lost_total", run=run) == 1 and _get(s, "tmslurm_ranks_fenced_total", run=run) == 1
    assert _get(s, "tmslurm_nodes_given_back_total", run=run) == 1
    assert _get(s, "tmslurm_gray_evictions_total", run=run, cause="compute") == 2
    assert _get(s, "tmslurm_gray_evictions_total", run=run, cause="link") == 1
    assert _get(s, "tmslurm_warm_standbys", run=run, shape_class="only") == 1
    assert _get(s, "tmslurm_controller_restarts", run=run) == 0
    assert _get(s, "tmslurm_checkpoint_age_steps", run=run) == 3  # no checkpoint yet
    assert not any("step" in dict(k[1]) for k in s), "no label may carry an unbounded value"


@pytest.mark.parametrize(
    "overrides,named",
    [
        (["metrics.port=70000"], "metrics.port=70000"),
        (["metrics.monitor_port=-1"], "metrics.monitor_port=-1"),
        (["metrics.port=9400", "metrics.monitor_port=9400"], "Fix: pass another metrics.monitor_port"),
        (["metrics.monitor_port=9401", "detect.monitors=false", "bench.heartbeats=false"], "needs the node monitors"),
    ],
)
def test_off_by_default_and_bad_ports_are_refused(overrides, named):
    m = compose_config([]).metrics
    assert m.port == 0 and m.monitor_port == 0
    with pytest.raises(ConfigError, match=re.escape(named)):
        compose_config(overrides)


def test_a_port_in_use_leaves_the_run_without_metrics(tmp_path):
    h = Harness(tmp_path, 1, 1, 0, "metrics.port=1")
    port = h.ctl.metrics.serve("127.0.0.1", 0)
    other = Harness(tmp_path / "b", 1, 1, 0, "metrics.port=1")
    assert other.ctl.metrics.serve("127.0.0.1", port) is None


def test_the_grafana_board_asks_only_for_series_the_controller_exports(tmp_path):
    import json
    import re
    from pathlib import Path

    h = Harness(tmp_path, 2, 1, 0, "metrics.port=1")
    h.ctl.metrics.observe({"type": "event", "kind": "planned", "downtime_s": 0.1})  # series with a kind/part/class
    h.ctl.metrics.on_commits([{"step": 0, "dt": 0.1}], {"first": 1})  # exist from the first one
    exported = {s.name for fam in h.ctl.metrics.registry.collect() for s in fam.samples}
    board = json.loads((Path(__file__).resolve().parents[2] / "docs" / "grafana-tmslurm.json").read_text())
    asked = {name for p in board["panels"] for t in p["targets"] for name in re.findall(r"tmslurm_[a-z_]+", t["expr"])}
    assert len(asked) >= 10 and asked <= exported, asked - exported
