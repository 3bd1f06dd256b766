"""The chaos soak's driver without a lab: which faults may strike whom, the bag of kinds, the repairs due."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks.__main__ import parser
from benchmarks.chaos import Chaos, overrides, settled
from benchmarks.chaosfaults import KINDS, NODE_FAULTS, Injected, rank_pid, repair_due
from tmslurm.core.errors import TmslurmError

RANKS = [
    {"rank": r, "node": f"node{r + 1}", "role": f"stage{r // 2}", "agent": f"rank{r}.{1000 + r}#1", "alive": True}
    for r in range(4)
]


def status(ranks=RANKS, events=(), standbys=(), mode="running") -> dict:
    return {
        "mode": mode,
        "step": 10,
        "ranks": [dict(r) for r in ranks],
        "events": list(events),
        "standbys": list(standbys),
    }


def chaos(tmp_path: Path, kinds: str = ",".join(KINDS), alive: bool = True, seed: int = 0) -> Chaos:
    args = parser().parse_args(["chaos", "--kinds", kinds, "--seed", str(seed), "--max-controller-kills", "2"])
    return Chaos(SimpleNamespace(run_dir=tmp_path, job_id="7"), args, "node1", lambda: alive)


def fault(kind: str, nodes: list[str], repaired: bool = False, undo_in: float | None = None) -> Injected:
    return Injected(
        t=time.time(),
        kind=kind,
        ranks=[],
        nodes=nodes,
        step=1,
        repaired=repaired,
        undo_at=None if undo_in is None else time.monotonic() + undo_in,
    )


@pytest.mark.parametrize("kind", NODE_FAULTS)
def test_node_faults_never_hit_the_batch_host_nor_a_node_already_faulty(tmp_path, kind):
    c = chaos(tmp_path)
    c.faults.append(fault("partition", ["node3"]))
    for _ in range(30):
        v = c.victims(kind, status())
        nodes = {x["node"] for x in v}
        assert "node1" not in nodes and "node3" not in nodes and nodes


def test_process_faults_may_hit_the_batch_host_but_not_a_dead_rank(tmp_path):
    c = chaos(tmp_path)
    ranks = [dict(r, alive=r["rank"] == 0) for r in RANKS]
    assert [x["rank"] for x in c.victims("sigkill", status(ranks))] == [0]


def test_two_node_power_off_takes_two_stages(tmp_path):
    c = chaos(tmp_path)
    for _ in range(30):
        a, b = c.victims("power_off2", status())
        assert a["role"] != b["role"] and a["node"] != b["node"]
    one_stage = [r for r in RANKS if r["role"] == "stage1"]
    assert c.victims("power_off2", status(one_stage)) is None


REFUSED = {
    "kind": "restart",
    "status": "done",
    "cause": "the controller restarted and could not adopt the live agents: a rank "
    "started by the dead controller had not joined yet (a restart was in flight)",
}


@pytest.mark.parametrize(
    "kills,adopted,alive,ok,extra",
    [
        (0, 0, True, True, []),
        (1, 0, True, False, []),
        (1, 1, True, True, []),
        (0, 0, False, False, []),
        (2, 2, True, False, []),
        # a refused adoption restarts from a checkpoint: that kill is dealt with too (the recorded hour drew
        # no kill for its last 43 minutes without this)
        (1, 0, True, True, [REFUSED]),
        (1, 0, True, False, [{**REFUSED, "status": "running"}]),
        (1, 0, True, False, [{"kind": "restart", "status": "done", "cause": "node node2 lost"}]),
    ],
)
def test_a_controller_kill_waits_for_the_last_one_to_be_dealt_with(tmp_path, kills, adopted, alive, ok, extra):
    c = chaos(tmp_path, alive=alive)
    c.faults += [fault("controller_kill", ["controller"], repaired=True) for _ in range(kills)]
    events = [{"kind": "controller_restart", "status": "done"}] * adopted + extra
    assert (c.victims("controller_kill", status(events=events)) == []) is ok


def test_a_slurmctld_outage_allows_no_second_outage_no_drain_and_no_controller_kill(tmp_path):
    c = chaos(tmp_path)
    c.faults.append(fault("slurmctld_stop", ["slurmctld"], undo_in=30))
    assert c.outage()
    for kind in ("slurmctld_stop", "drain", "controller_kill"):
        assert c.victims(kind, status()) is None
    assert c.victims("sigkill", status())
    c.faults[-1].repaired = True
    assert not c.outage() and c.victims("slurmctld_stop", status()) == []


def test_the_bag_draws_every_kind_once_before_any_twice(tmp_path):
    c = chaos(tmp_path, seed=3)
    drawn = [c.draw(status())[0] for _ in range(2 * len(KINDS))]
    c.faults.clear()
    assert sorted(drawn[: len(KINDS)]) == sorted(KINDS) and sorted(drawn[len(KINDS) :]) == sorted(KINDS)


def test_a_kind_that_cannot_strike_stays_in_the_bag(tmp_path):
    c = chaos(tmp_path, kinds="controller_kill,sigkill", alive=False)
    assert c.draw(status())[0] == "sigkill"
    assert c.bag == ["controller_kill"]
    assert c.draw(status())[0] == "sigkill"  # none of the bag can strike: a new round joins it
    assert c.bag == ["controller_kill", "controller_kill"]
    assert c.draw(status())[0] == "sigkill"


def test_unknown_kinds_are_refused_by_name(tmp_path):
    with pytest.raises(TmslurmError, match="unknown.*'reboot'"):
        chaos(tmp_path, kinds="sigkill,reboot")


@pytest.mark.parametrize("kind", ["throttle", "slowlink", "slurmctld_stop"])
def test_timed_faults_are_undone_after_their_hold_or_when_forced(tmp_path, kind):
    f = fault(kind, ["node2"], undo_in=60)
    assert not repair_due(f, tmp_path, status())
    assert repair_due(f, tmp_path, status(), force=True)
    f.undo_at = time.monotonic() - 1
    assert repair_due(f, tmp_path, status())
    f.repaired = True
    assert not repair_due(f, tmp_path, status(), force=True)


def test_a_drained_node_is_resumed_once_the_run_saw_it_and_moved_off():
    f = fault("drain", ["node2"], undo_in=240)
    moved = [dict(r, node="node9") if r["node"] == "node2" else r for r in RANKS]
    event = {"kind": "planned", "node": "node2", "notice_t": f.t + 0.5}
    assert not repair_due(f, Path("."), status())  # not seen, still serving
    assert not repair_due(f, Path("."), status(events=[event]))  # seen, still serving
    assert not repair_due(f, Path("."), status(moved))  # moved, but by no event of this fault
    assert not repair_due(f, Path("."), status(moved, events=[dict(event, notice_t=f.t - 30)]))  # an older event
    assert not repair_due(f, Path("."), {})  # the controller does not answer
    assert repair_due(f, Path("."), status(moved, events=[event]))
    assert repair_due(f, Path("."), {}, force=True)
    f.undo_at = time.monotonic() - 1
    assert repair_due(f, Path("."), {})  # maintenance over: resumed whatever the run did


def test_checker_kinds_and_pids():
    f = Injected(t=1.0, kind="power_off2", ranks=[1, 2], nodes=["node2", "node3"], step=5)
    assert f.for_checker() == {"t": 1.0, "kind": "power_off", "ranks": [1, 2], "nodes": ["node2", "node3"]}
    assert Injected(t=1.0, kind="sigstop", ranks=[1], nodes=["n"], step=1).for_checker()["kind"] == "stop"
    assert rank_pid("standby6.5672#3") == 5672


def test_settled_needs_no_event_in_flight_and_the_whole_pool_warm():
    warm = [{"roles": ["stage0", "stage1"], "busy": False}] * 2
    assert settled(status(standbys=warm), 2)
    assert not settled(status(standbys=warm[:1]), 2)
    assert not settled(status(standbys=[{"roles": ["stage0"], "busy": False}] * 2), 2)
    assert not settled(status(standbys=warm, events=[{"status": "switching"}]), 2)
    assert not settled(status(standbys=warm, mode="recovering"), 2)
    assert settled(status(standbys=warm[:1]), 0)  # the end's fallback: no event in flight, whatever the pool
    assert not settled(status(standbys=warm[:1], events=[{"status": "switching"}]), 0)


def test_the_run_has_two_replenished_standbys_and_a_restart_budget():
    args = argparse.Namespace(
        model="small", max_controller_kills=50, checkpoint_every=50, step_delay=0.5, slurm_time="04:00:00"
    )
    o = overrides(args)
    assert "standby.count=2" in o and "standby.replenish=true" in o and "runtime.controller_restarts=51" in o
    assert "gray.evict=true" in o


def _result(passed: bool, alarms: int) -> dict:
    return {
        "setup": {
            "layout": "DP2 x PP2",
            "model": "tiny",
            "standbys": "2, replenished",
            "gap_s": [20.0, 60.0],
            "seed": 1,
        },
        "soak_minutes": 60.02,
        "steps": 5000,
        "faults": 3,
        "faults_by_kind": {"sigkill": 2, "drain": 1},
        "events_by_kind": {"unexpected": 2, "planned": 1},
        "switches": 3,
        "checkpoint_fallbacks": 0,
        "downtime_s": {"n": 3, "p50": 1.5, "p90": 2.25, "max": 2.5},
        "downtime_total_s": 5.25,
        "false_alarms": [{"kind": "unexpected"}] * alarms,
        "leftover_processes": [],
        "pids_checked": 40,
        "checks": {"commits": {"status": "PASS"}, "faults": {"status": "PASS" if passed else "FAIL"}},
        "passed": passed,
        "commit": "abc1234",
        "date": "2026-12-05",
    }


@pytest.mark.parametrize(
    "passed, alarms, verdict", [(True, 0, "| passed | **yes** |"), (False, 2, "| passed | **no** |")]
)
def test_the_chaos_table_shows_the_recorded_figures(passed, alarms, verdict):
    from benchmarks.tables import chaos as table

    t = table(_result(passed, alarms)).splitlines()
    assert verdict in t and f"| false alarms | {alarms} |" in t
    assert "| faults | 3: drain 1, sigkill 2 |" in t and "| switches / checkpoint fallbacks | 3 / 0 |" in t
    assert "| downtime per event | n=3, p50 1.500s, p90 2.250s, max 2.500s |" in t
    assert any(line.startswith("| checks | commits PASS, faults ") for line in t)
