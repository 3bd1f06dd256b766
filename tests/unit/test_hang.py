"""Hang detection by progress: a rank that heartbeats but does not vote while all others did is
fenced and replaced once it lags past max(hang_floor_s, hang_factor x median step), or past
connect_timeout_s while no step time is known (start-up); never before."""

from __future__ import annotations

import pytest

from tests.unit.controller_harness import Harness
from tmslurm.controller.plan_types import Recovery
from tmslurm.core.config import compose_config
from tmslurm.core.errors import ConfigError


@pytest.mark.parametrize(
    "voters,lag_s,median_s,hung",
    [
        ((0, 1, 3), 2.5, 0.0, False),  # no step time known yet: start-up may lag by seconds
        ((0, 1, 3), 119.0, 0.0, False),  # ... up to runtime.connect_timeout_s (120 s)
        ((0, 1, 3), 121.0, 0.0, True),  # past it
        ((0, 1, 3), 1.5, 0.2, False),  # within the 2 s floor (10 x a 0.2 s median is less)
        ((0, 1, 3), 2.5, 0.2, True),  # past the floor
        ((0, 1, 3), 5.0, 1.0, False),  # 10 x a 1 s median step is 10 s: still waiting
        ((0, 1, 3), 10.5, 1.0, True),  # past 10 x the median step
        ((0, 1), 30.0, 0.0, False),  # two ranks missing: a slow step, not one hung rank
    ],
)
def test_a_rank_lagging_behind_every_other_vote_is_hung(tmp_path, voters, lag_s, median_s, hung):
    h = Harness(tmp_path)
    h.state.step_log = [{"step": i, "t_end": i * median_s} for i in range(5)] if median_s else []
    h.state.step = 5 if median_s else 0
    for r in voters:
        h.vote(r)
        h.state.vote_t[r] -= lag_s
    h.ctl.deadlines.tick()
    assert (h.spawner.fenced == [("worker", 2)]) is hung
    if hung:
        assert isinstance(h.state.plan, Recovery) and h.state.plan.reason == "no progress"
        (entry,) = h.journal("hung")
        assert entry["rank"] == 2 and entry["lag_s"] >= lag_s
    else:
        assert h.state.plan is None and not h.journal("hung")


@pytest.mark.parametrize(
    "override,field",
    [("detect.hang_factor=0", "detect.hang_factor"), ("detect.hang_floor_s=-1", "detect.hang_floor_s")],
)
def test_hang_settings_are_validated(override, field):
    with pytest.raises(ConfigError, match=field):
        compose_config([override])


def test_hang_fault_kind_is_accepted():
    assert compose_config(["faults=[{step:3,kind:hang,rank:1}]"]).faults[0].kind == "hang"


def test_a_lone_rank_is_never_hung_by_progress(tmp_path):
    """dp=1 x pp=1: no peer votes to be late against (the deadline tick once crashed on it)."""
    h = Harness(tmp_path, 1, 1, 0)
    h.state.step_log = [{"step": i, "t_end": float(i)} for i in range(5)]
    h.state.step = 5
    h.ctl.deadlines.tick()
    assert h.spawner.fenced == [] and h.state.plan is None and not h.journal("hung")
