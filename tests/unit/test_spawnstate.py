"""What a restarted Slurm controller takes over: the spawner's record, and who still runs.

Slurm's commands are captured (no cluster); the real path runs in
tests/slurm/test_slurm_controller_restart.py.
"""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import pytest

from tmslurm.core.config import compose_config
from tmslurm.core.errors import TmslurmError
from tmslurm.core.rundir import RunDir
from tmslurm.slurm import spawnstate as ss
from tmslurm.slurm.lane import Lane
from tmslurm.slurm.proc import spawner as sp

RUNNING = "77\n90\n"
STEPS = (
    "77.batch batch\n77.extern extern\n77.0 tmslurm-monitor-n1\n77.3 tmslurm-rank0.0\n77.5 tmslurm-rank2.0\n"
    "90.batch batch\n90.2 tmslurm-rank1.1\n"
)


def record(**kw) -> ss.SpawnRecord:
    base = dict(
        main_job_id="77",
        ranks_per_node=1,
        rank_node={0: "n1", 1: "n9", 2: "n3"},
        rank_steps={0: ("77", "tmslurm-rank0.0"), 1: ("90", "tmslurm-rank1.1"), 2: ("77", "tmslurm-rank2.0")},
        spares={
            "90": ss.Spare(job_id="90", index=0, node="n9", used_for_restart=True),
            "91": ss.Spare(job_id="91", index=1),
        },
        main_nodes=["n1", "n3"],
        bad_nodes=["n2"],
        monitored=[("77", "n1")],
    )
    return ss.SpawnRecord(**{**base, **kw})


def test_parse_listing_keeps_jobs_and_named_steps():
    jobs, steps = ss.parse_listing(RUNNING, STEPS)
    assert jobs == {"77", "90"}
    assert ("77", "tmslurm-rank0.0") in steps and ("90", "tmslurm-rank1.1") in steps and ("77", "batch") in steps
    assert ss.parse_listing("", "garbage line with words\n\n") == (set(), set())


@pytest.mark.parametrize(
    "listing, alive",
    [
        # every rank's latest step runs; spare 90 runs (standby 0), spare 91 is still pending (standby 1 not started)
        (ss.parse_listing(RUNNING, STEPS), [("standby", 0), ("worker", 0), ("worker", 1), ("worker", 2)]),
        # rank 2's step ended (its node was lost), spare 90 ended: rank 1's step in it too
        (ss.parse_listing("77\n", "77.3 tmslurm-rank0.0\n"), [("worker", 0)]),
        # an older step of rank 1 on the main job does not count: only its latest
        (ss.parse_listing("77\n", "77.1 tmslurm-rank1.0\n"), []),
        # Slurm could not be asked: everyone the record names, the controller fences who does not come back
        (None, [("standby", 0), ("standby", 1), ("worker", 0), ("worker", 1), ("worker", 2)]),
    ],
)
def test_live_processes(listing, alive):
    assert ss.live_processes(record(), listing) == alive


def test_live_processes_counts_every_standby_of_a_spare_job():
    rec = record(ranks_per_node=2, spares={"90": ss.Spare(job_id="90", index=1)}, rank_steps={})
    assert ss.live_processes(rec, ({"90"}, set())) == [("standby", 2), ("standby", 3)]


def test_read_record_round_trip_and_errors(tmp_path):
    path = tmp_path / "spawner.json"
    assert ss.read_record(path) is None
    writer = ss.RecordWriter(path)
    writer.offer(record())
    assert writer.flush(5.0)
    assert ss.read_record(path) == record()
    path.write_text('{"main_job_id": "77"}')
    with pytest.raises(TmslurmError, match="spawner.json"):
        ss.read_record(path)


@pytest.fixture
def captured(tmp_path, monkeypatch):
    runs: list[list[str]] = []

    def fake_run(cmd, **kwargs):
        runs.append(list(cmd))
        out = STEPS if "-s" in cmd else RUNNING if "-t" in cmd else ""
        return subprocess.CompletedProcess(cmd, 0, out, "")

    monkeypatch.setattr(sp.subprocess, "run", fake_run)
    monkeypatch.setattr(ss.subprocess, "run", fake_run)
    monkeypatch.setattr(
        sp.subprocess, "Popen", lambda cmd, **k: runs.append(list(cmd)) or SimpleNamespace(poll=lambda: 0)
    )
    return runs


def test_a_restarted_spawner_fences_what_its_predecessor_launched(tmp_path, captured):
    cfg = compose_config(["cluster=slurm", "parallel.dp=2", "parallel.pp=2"])
    client = SimpleNamespace(nodes=lambda names: [])
    first = sp.SlurmSpawner(
        tmp_path, cfg, client, "77", ["n1", "n2", "n3", "n4"], background=lambda w, n: w(), lane=Lane(inline=True)
    )
    for rank in range(4):
        first.spawn_worker(rank, 0)
    first.spares["90"] = {"job_id": "90", "index": 0, "node": "n9", "used_for_restart": False}
    first.add_bad_node("n2")
    assert first.writer.flush(5.0)
    rec = ss.read_record(RunDir(tmp_path).spawner)
    assert rec.rank_steps[1] == ("77", "tmslurm-rank1.0") and rec.bad_nodes == ["n2"] and "90" in rec.spares
    second = sp.SlurmSpawner(
        tmp_path,
        cfg,
        client,
        "77",
        ["n1", "n2", "n3", "n4"],
        background=lambda w, n: w(),
        lane=Lane(inline=True),
        record=rec,
    )
    captured.clear()
    second.fence("worker", 0)  # by the step name the first spawner gave it, as Slurm lists it
    assert captured == [["squeue", "-h", "-s", "-j", "77", "-o", "%i %j"], ["scancel", "--signal=KILL", "77.3"]]
    assert second.spare_job_ids() == ["90"] and second.bad_nodes == {"n2"}
    assert second.monitored == first.monitored  # no second monitor step on a node that has one
    captured.clear()
    second.spawn_worker(3, 1)
    (srun,) = [c for c in captured if c[0] == "srun"]  # the rank's step only: n4 already has its monitor
    assert "--job-name=tmslurm-rank3.1" in srun and "-wn4" in srun


def test_the_owner_cancels_only_spare_jobs_that_still_run(tmp_path, captured):
    path = tmp_path / "spawner.json"
    writer = ss.RecordWriter(path)
    writer.offer(record())
    assert writer.flush(5.0)
    owner = ss.SlurmOwner(path)
    assert owner.alive() == [("standby", 0), ("worker", 0), ("worker", 1), ("worker", 2)]
    captured.clear()
    owner.stop_all()
    assert [c for c in captured if c[0] == "scancel"] == [["scancel", "90"]]  # 91 is not running
    assert ss.SlurmOwner(tmp_path / "none.json").alive() == []


def test_a_pending_spare_may_use_a_node_once_it_healed(tmp_path, captured):
    """A spare submitted while n2 drained excludes n2; once Slurm says n2 is fine again (and n5 is
    still down), the pending spare's exclusions drop n2 only; a started spare is left alone."""
    from tmslurm.slurm.parse import NodeInfo

    states = {"n2": "IDLE", "n5": "DOWN"}
    updates: list[tuple[str, list[str]]] = []
    client = SimpleNamespace(
        nodes=lambda names: [NodeInfo(n, states[n], states[n], frozenset()) for n in names],
        job=lambda job_id: SimpleNamespace(
            nodes=["n6"] if job_id == "92" else [], end_time=None, state="RUNNING" if job_id == "92" else "PENDING"
        ),
        update_job_excludes=lambda job_id, nodes: updates.append((job_id, list(nodes))),
    )
    cfg = compose_config(["cluster=slurm", "parallel.dp=2", "parallel.pp=2"])
    spawner = sp.SlurmSpawner(
        tmp_path, cfg, client, "77", ["n1", "n3", "n4", "n7"], background=lambda w, n: w(), lane=Lane(inline=True)
    )
    spawner.add_bad_node("n2")
    spawner.add_bad_node("n5")
    spawner.spares["91"] = {"job_id": "91", "index": 0, "node": None, "exclude": ["n2", "n5"]}
    spawner.spares["92"] = {"job_id": "92", "index": 1, "node": None, "exclude": ["n2"]}
    spawner.note_spare_node("")
    assert updates == [("91", ["n5"])]  # 92 started on n6 meanwhile
    assert spawner.spares["91"]["exclude"] == ["n5"] and spawner.bad_nodes == {"n5"}
    updates.clear()
    spawner.note_spare_node("")
    assert updates == []  # nothing healed since
    assert spawner.writer.flush(5.0)
    assert ss.read_record(RunDir(tmp_path).spawner).spares["91"].exclude == ["n5"]


@pytest.mark.parametrize(
    "rank_node,bad,spares,want",
    [
        ("n2", set(), {}, ("77", "n2")),  # its own node in the main job
        ("n2", {"n2"}, {"90": ("n9", False)}, ("90", "n9")),  # its node is bad: onto a free spare
        (
            "n9",
            set(),
            {"90": ("n9", True), "91": ("n8", False)},
            ("90", "n9"),
        ),  # it restarted on spare 90 before: again there
        (
            "n9",
            {"n9"},
            {"90": ("n9", True), "91": ("n8", False)},
            ("91", "n8"),
        ),  # that spare's node died: the next spare
        ("n9", {"n9"}, {"90": ("n9", True)}, None),  # nowhere left: False, nothing launched
    ],
)
def test_where_a_restarted_rank_runs(tmp_path, captured, rank_node, bad, spares, want):
    cfg = compose_config(["cluster=slurm", "parallel.dp=2", "parallel.pp=2"])
    client = SimpleNamespace(
        nodes=lambda names: [],  # Slurm says nothing: bad nodes stay bad; every spare runs
        job=lambda job_id: SimpleNamespace(
            nodes=["n1", "n2", "n3", "n4"] if job_id == "77" else [spares[job_id][0]], end_time=None, state="RUNNING"
        ),
    )
    spawner = sp.SlurmSpawner(
        tmp_path, cfg, client, "77", ["n1", "n2", "n3", "n4"], background=lambda w, n: w(), lane=Lane(inline=True)
    )
    spawner.rank_node[1] = rank_node
    spawner.bad_nodes = set(bad)
    spawner.spares = {
        j: {"job_id": j, "index": i, "node": n, "used_for_restart": used}
        for i, (j, (n, used)) in enumerate(spares.items())
    }
    spawner.monitored = {(j, n) for j in ("77", "90", "91") for n in ("n2", "n8", "n9")}  # no monitor steps here
    captured.clear()
    ok = spawner.spawn_worker(1, 3)
    sruns = [c for c in captured if c[0] == "srun"]
    if want is None:
        assert ok is False and sruns == []
    else:
        (srun,) = sruns
        assert ok and f"--jobid={want[0]}" in srun and f"-w{want[1]}" in srun and spawner.rank_node[1] == want[1]


def test_a_node_our_liveness_found_dead_heals_only_after_slurm_saw_it_unhealthy(tmp_path, captured):
    """Slurm still calls a powered-off node ALLOCATED for SlurmdTimeout: that must not heal it (a
    restart would launch there and hang); once Slurm said DOWN and then IDLE, it is usable again."""
    from tmslurm.slurm.parse import NodeInfo

    seen = {"n2": "ALLOCATED"}
    client = SimpleNamespace(nodes=lambda names: [NodeInfo(n, seen[n], seen[n], frozenset()) for n in names])
    cfg = compose_config(["cluster=slurm", "parallel.dp=2", "parallel.pp=2"])
    spawner = sp.SlurmSpawner(tmp_path, cfg, client, "77", ["n1", "n2", "n3", "n4"], lane=Lane(inline=True))
    spawner.add_bad_node("n2", confirmed=False)
    assert spawner.still_bad() == ["n2"]
    seen["n2"] = "DOWN"
    assert spawner.still_bad() == ["n2"] and spawner.unconfirmed == set()
    seen["n2"] = "IDLE"
    assert spawner.still_bad() == [] and spawner.bad_nodes == set()
    spawner.add_bad_node("n3")  # a notice Slurm gave us: healed as soon as Slurm calls it fine
    seen["n3"] = "IDLE"
    assert spawner.still_bad() == []


def test_the_state_of_a_node_found_dead_is_read_on_every_spare_check_until_slurm_flags_it(tmp_path, captured):
    from tmslurm.slurm.parse import NodeInfo

    asked: list[list[str]] = []
    seen = {"n2": "ALLOCATED"}

    def nodes(names):
        asked.append(list(names))
        return [NodeInfo(n, seen[n], seen[n].split("+")[0], frozenset(seen[n].split("+")[1:])) for n in names]

    client = SimpleNamespace(nodes=nodes, job=lambda job_id: None)
    cfg = compose_config(["cluster=slurm", "parallel.dp=2", "parallel.pp=2"])
    spawner = sp.SlurmSpawner(tmp_path, cfg, client, "77", ["n1", "n2", "n3", "n4"], lane=Lane(inline=True))
    spawner.note_spare_node("")
    assert asked == []  # nothing bad: no query
    spawner.add_bad_node("n2", confirmed=False)
    spawner.note_spare_node("")
    seen["n2"] = "ALLOCATED+NOT_RESPONDING"
    spawner.note_spare_node("")
    assert asked == [["n2"], ["n2"]] and spawner.unconfirmed == set()
    assert spawner.writer.flush(5.0) and ss.read_record(RunDir(tmp_path).spawner).unconfirmed == []  # recorded
    spawner.note_spare_node("")
    assert len(asked) == 2  # confirmed bad: no more queries from here (no pending spare excludes it)
