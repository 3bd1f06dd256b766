"""Spares renewed before their time limit: the controller's side with fake channels, the spawner's
choice of expiring spares, and the refusal of a renewal lead that leaves no time."""

from __future__ import annotations

import pytest

from tests.unit.controller_harness import FakeCluster, FakeSpawner, Harness
from tmslurm.core.config import compose_config
from tmslurm.core.errors import ConfigError
from tmslurm.slurm.proc.spawner import SlurmSpawner
from tmslurm.slurm.submit import main_sbatch_text, spare_minutes, spare_renew_lead


class Expiring(FakeCluster):
    """Names standbys as expiring when the test says so (each once, as the Slurm hook does)."""

    def __init__(self) -> None:
        super().__init__()
        self.due: list[int] = []

    def expiring_standbys(self, now: float) -> list[int]:
        due, self.due = self.due, []
        return due


def _harness(tmp_path, standbys: int = 1) -> Harness:
    return Harness(tmp_path, 2, 2, standbys, "standby.replenish=true", cluster=lambda cfg: (FakeSpawner(), Expiring()))


def _warm(h: Harness, who: str, ident: int, node: str) -> None:
    h.hello(who, "standby", ident, node)
    for role in h.ctl.ctx.layout.roles:
        h.send(
            who,
            {
                "type": "ready",
                "role": role,
                "warmup_s": 0.1,
                "rss_mb": 1.0,
                "role_rss_mb": 1.0,
                "sandbox_sends_skipped": 0,
            },
        )


def _tick(h: Harness, t: float) -> None:
    h.ctl.renewal.tick(now=1000.0 + t, now_m=t)


def _journal(h: Harness, kind: str) -> list[dict]:
    import json

    return [e for e in map(json.loads, h.ctl.ctx.rundir.events.read_text().splitlines()) if e["type"] == kind]


def test_an_expiring_spare_is_replaced_first_and_let_go_only_once_the_fresh_one_is_warm(tmp_path):
    h = _harness(tmp_path)
    old = h.aid("s0")
    h.cluster.due = [0]
    _tick(h, 1.0)
    assert h.spawner.standbys == [0, 1]  # a fresh spare is asked for at once
    assert old in h.state.retiring and h.ctl.members.warm_pool() == {old: set(h.ctl.ctx.layout.roles)}  # still usable
    h.hello("s1", "standby", 1, "s1")  # connected, not warm yet: the old one stays
    _tick(h, 2.0)
    assert h.state.agents[old].alive and h.spawner.fenced == []
    for role in h.ctl.ctx.layout.roles:
        h.send(
            "s1",
            {
                "type": "ready",
                "role": role,
                "warmup_s": 0.1,
                "rss_mb": 1.0,
                "role_rss_mb": 1.0,
                "sandbox_sends_skipped": 0,
            },
        )
    _tick(h, 2.5)  # at most once a second
    assert h.state.agents[old].alive
    _tick(h, 3.0)
    assert not h.state.agents[old].alive and h.spawner.fenced == [("standby", 0)] and not h.state.retiring
    (renewing,) = _journal(h, "standby_renewing")
    (retired,) = _journal(h, "standby_retired")
    assert renewing["agent"] == retired["agent"] == old and retired["warm"] == 1
    h.disconnect("s0")  # its job is cancelled: an expected exit, not a lost standby, and nothing more is asked for
    assert _journal(h, "standby_lost") == [] and h.spawner.standbys == [0, 1]


def test_a_retiring_standby_that_takes_a_rank_stops_retiring(tmp_path):
    h = _harness(tmp_path)
    old = h.aid("s0")
    h.cluster.due = [0]
    _tick(h, 1.0)
    h.state.agents[old].rank = 1  # a switch gave it rank 1 before the fresh spare was warm
    _tick(h, 2.0)
    assert not h.state.retiring and h.state.agents[old].alive
    (abandoned,) = _journal(h, "standby_renewal_abandoned")
    assert abandoned["agent"] == old and abandoned["rank"] == 1


def test_other_standbys_are_not_renewed_and_an_unknown_id_changes_nothing(tmp_path):
    h = _harness(tmp_path, standbys=2)
    h.cluster.due = [7]
    _tick(h, 1.0)
    assert not h.state.retiring and h.spawner.standbys == [0, 1]
    h.cluster.due = [1]
    _tick(h, 2.0)
    assert h.state.retiring == {h.aid("s1")} and h.spawner.standbys == [0, 1, 2]
    _warm(h, "s2", 2, "s2")
    _tick(h, 3.0)
    assert h.spawner.fenced == [("standby", 1)] and h.state.agents[h.aid("s0")].alive


def _spawner(tmp_path, rpn: int = 2) -> SlurmSpawner:
    cfg = compose_config(
        ["cluster=slurm", "parallel.dp=2", "parallel.pp=2", f"parallel.ranks_per_node={rpn}", "slurm.spare_renew_s=300"]
    )
    return SlurmSpawner(tmp_path, cfg, client=None, job_id="50", nodes=["n1", "n2"])


def test_the_spawner_names_each_spare_once_when_its_end_is_within_the_lead(tmp_path):
    sp = _spawner(tmp_path)
    sp.spares = {
        "61": {"job_id": "61", "index": 0, "node": "s1", "end": 2000.0},
        "62": {"job_id": "62", "index": 1, "node": "s2", "end": 5000.0},
        "63": {"job_id": "63", "index": 2, "node": None, "end": None},
    }  # pending: no end known
    assert sp.expiring(1600.0) == []
    assert sp.expiring(1700.0) == [0, 1]  # spare job 0 holds standbys 0 and 1 (ranks_per_node=2)
    assert sp.expiring(1800.0) == []
    assert sp.expiring(4800.0) == [2, 3]
    assert sp.record().spares["61"].renewing is True  # a restarted controller does not renew it again


@pytest.mark.parametrize(
    "overrides,named",
    [
        (["slurm.spare_renew_s=30"], "slurm.spare_renew_s=30"),
        (["slurm.spare_time=00:10:00", "slurm.spare_renew_s=400"], "slurm.spare_time: 10 min"),
        (["slurm.spare_time=ten"], "slurm.spare_time='ten'"),
    ],
)
def test_a_renewal_lead_that_leaves_no_time_is_refused(overrides, named):
    with pytest.raises(ConfigError, match=named.replace("(", r"\(")):
        spare_minutes(compose_config(["cluster=slurm", *overrides]))
    assert (
        spare_minutes(compose_config(["cluster=slurm", "slurm.spare_time=00:10:00", "slurm.spare_renew_s=300"])) == 10
    )


@pytest.mark.parametrize(
    "overrides,lead",
    [
        ([], 600),  # slurm.time 00:30:00
        (["slurm.time=00:15:00"], None),  # too short for the default: not renewed (and not refused)
        (["slurm.time=00:15:00", "slurm.spare_renew_s=120"], 120),
        (["slurm.time=00:15:00", "slurm.spare_time=1-00:00:00"], 600),
    ],
)
def test_the_default_lead_renews_long_spares_only(tmp_path, overrides, lead):
    cfg = compose_config(["cluster=slurm", *overrides])
    assert spare_renew_lead(cfg) == lead
    assert "#SBATCH" in main_sbatch_text(tmp_path / "run", cfg)  # the main job's submission accepts it


def test_the_standbys_of_one_spare_job_are_let_go_together(tmp_path):
    """ranks_per_node=2: both standbys of the expiring spare job retire at once (its cancellation
    ends both), so neither is left behind to be reported lost."""
    h = Harness(
        tmp_path,
        2,
        2,
        2,
        "standby.replenish=true",
        "parallel.ranks_per_node=2",
        cluster=lambda cfg: (FakeSpawner(), Expiring()),
    )
    h.ctl.members.standby_target = 2  # one spare job of two standbys (the harness counts processes)
    old = {h.aid("s0"), h.aid("s1")}
    h.cluster.due = [0, 1]
    _tick(h, 1.0)
    assert h.state.retiring == old and h.spawner.standbys == [0, 1, 2, 3]
    _warm(h, "s2", 2, "s2")
    _tick(h, 2.0)
    assert h.state.retiring == old  # one fresh standby of two: both old ones stay
    _warm(h, "s3", 3, "s2")
    _tick(h, 3.0)
    assert not h.state.retiring and sorted(h.spawner.fenced) == [("standby", 0), ("standby", 1)]
    assert [e["warm"] for e in _journal(h, "standby_retired")] == [2, 2]
