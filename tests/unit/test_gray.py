"""Gray failures (tmslurm.controller.gray): who is judged slow, from busy times alone, and what the
controller does about it (fake channels, no process)."""

from __future__ import annotations

import queue

import pytest

from tests.unit.controller_harness import Harness
from tmslurm.controller.gray import GraySettings, GrayWatch, dp_peers
from tmslurm.controller.items import NoticeIn

S = GraySettings(factor=1.5, window=5, min_excess_s=0.05, budget_per_hour=2)
PEERS = {0: [1], 1: [0], 2: [3], 3: [2]}  # DP2 x PP2: ranks 0,1 one stage, 2,3 the other


def _run(steps: list[dict[int, float | None]], settings: GraySettings = S) -> list[list[int]]:
    watch = GrayWatch(settings, PEERS)
    return [[s.rank for s in watch.observe(busy)] for busy in steps]


def _steady(n: int, slow: dict[int, float] | None = None) -> list[dict[int, float | None]]:
    base = {0: 0.20, 1: 0.20, 2: 0.30, 3: 0.30}
    return [{**base, **(slow or {})} for _ in range(n)]


@pytest.mark.parametrize(
    "steps, found_at",
    [
        pytest.param(_steady(20), {}, id="healthy: nobody"),
        pytest.param(
            _steady(3) + _steady(10, {1: 0.6}), {5: [1]}, id="rank 1 at 3x: found once 3 of its 5 steps were slow"
        ),
        pytest.param(_steady(10, {0: 0.6, 1: 0.6, 2: 0.9, 3: 0.9}), {}, id="every rank slow together: nobody"),
        pytest.param(_steady(5) + _steady(1, {1: 2.2}) + _steady(10), {}, id="one 2 s hiccup: nobody"),
        pytest.param(_steady(5) + _steady(2, {1: 2.2}) + _steady(10), {}, id="two slow steps of five: nobody"),
        pytest.param(_steady(10, {2: 0.40}), {}, id="1.33x: under the factor"),
        pytest.param([{0: 0.02, 1: 0.01, 2: 0.01, 3: 0.01}] * 10, {}, id="2x but 10 ms: under the excess floor"),
        pytest.param(_steady(10, {3: 0.9, 1: None}), {4: [3]}, id="a missing busy time skips only that pair"),
    ],
)
def test_who_is_found_slow_and_when(steps, found_at):
    got = {i: found for i, found in enumerate(_run(steps)) if found}
    assert got == found_at


def test_a_suspect_is_reported_once_until_the_epoch_changes():
    watch = GrayWatch(S, PEERS)
    found = [watch.observe({0: 0.2, 1: 0.8, 2: 0.3, 3: 0.3}) for _ in range(12)]
    assert [i for i, f in enumerate(found) if f] == [4]
    watch.reset()
    found = [watch.observe({0: 0.2, 1: 0.8, 2: 0.3, 3: 0.3}) for _ in range(5)]
    assert [i for i, f in enumerate(found) if f] == [4]


def test_the_hourly_budget():
    watch = GrayWatch(S, PEERS)
    assert [watch.allow_eviction(t) for t in (0.0, 10.0, 20.0, 3599.0, 3600.0, 3611.0)] == [
        True,
        True,
        False,
        False,
        True,
        True,
    ]


def test_peers_are_the_other_ranks_of_a_shard():
    assert dp_peers(4, lambda r: r % 2) == {0: [2], 1: [3], 2: [0], 3: [1]}
    assert dp_peers(2, lambda r: r) == {0: [], 1: []}  # dp=1: nobody to compare with
    assert GrayWatch(S, dp_peers(2, lambda r: r)).observe({0: 5.0, 1: 0.1}) == []


def _votes(h: Harness, busy: dict[int, float]) -> None:
    for r in range(h.world):
        h.send(
            r,
            {
                "type": "vote",
                "step": h.state.step,
                "epoch": h.state.epoch,
                "rank": r,
                "loss": 1.0,
                "dt": 0.5,
                "peak_rss_mb": 1.0,
                "busy": busy[r],
            },
        )


def _notices(h: Harness) -> list:
    out = []
    while True:
        try:
            item = h.ctl.ctx.queue.get_nowait()
        except queue.Empty:
            return out
        if isinstance(item, NoticeIn):
            out.append(item.notice)


def test_a_slow_rank_has_its_node_noticed_for_maintenance(tmp_path):
    h = Harness(tmp_path, 2, 2, 1, "gray.evict=true", "gray.window=4")
    for _ in range(6):
        _votes(h, {0: 0.1, 1: 0.1, 2: 0.1, 3: 0.4})
    (ev,) = h.journal("gray_evict")
    assert ev["rank"] == 3 and ev["node"] == "n3" and ev["ratio"] == 4.0 and ev["step"] == 3
    (n,) = _notices(h)
    assert (n.kind, n.rank, n.source) == ("maintenance", 3, "controller") and n.reason.startswith(
        "gray: rank 3 busy 4.00x"
    )
    assert h.cluster.lost == ["n3"]  # no new spare or restarted rank lands on the slow node


def test_without_an_idle_standby_a_slow_rank_is_kept_and_said_once(tmp_path):
    h = Harness(tmp_path, 2, 2, 0, "gray.evict=true", "gray.window=4")
    for _ in range(8):
        _votes(h, {0: 0.1, 1: 0.5, 2: 0.1, 3: 0.1})
    assert h.journal("gray_evict") == [] and _notices(h) == []
    (kept,) = h.journal("gray_suspect")
    assert kept["rank"] == 1 and kept["kept"] == "no idle standby"


def test_gray_evictions_need_data_parallel_peers():
    from tmslurm.core.config import compose_config
    from tmslurm.core.errors import ConfigError

    with pytest.raises(ConfigError, match="parallel.dp >= 2 or gray.evict=false"):
        compose_config(["parallel.dp=1", "parallel.pp=2", "gray.evict=true"])
    with pytest.raises(ConfigError, match="gray.factor"):
        compose_config(["gray.factor=1.0"])


def test_an_even_window_needs_more_than_half_of_it_slow():
    six = GraySettings(factor=1.5, window=6, min_excess_s=0.05, budget_per_hour=2)
    found = _run(_steady(6) + _steady(6, {1: 0.6}), six)
    assert [i for i, f in enumerate(found) if f] == [9]  # the 4th slow step of 6, not the 3rd
