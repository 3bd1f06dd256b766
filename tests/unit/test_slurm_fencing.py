"""The Slurm side of fencing and of the cluster hooks, with Slurm's commands captured (no cluster).

A rank is fenced by killing its own step (found by the step name the spawner gave it), a standby by
cancelling its spare job; no command ever carries a pid. The hooks never give back the batch host.
"""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import pytest

from tmslurm.core.config import compose_config
from tmslurm.slurm.lane import Lane
from tmslurm.slurm.proc import spawner as sp
from tmslurm.slurm.proc.hooks import SlurmHooks
from tmslurm.slurm.watcher import NodeWatch
from tmslurm.wire.messages import FaultSpec


class FakeClient:
    def __init__(self) -> None:
        self.cancelled: list[str] = []
        self.nodelists: list[list[str]] = []
        self.updates: list[tuple[str, str]] = []

    def cancel(self, job_id):
        self.cancelled.append(str(job_id))

    def update_job_nodelist(self, job_id, nodes):
        self.nodelists.append(list(nodes))

    def update_node(self, name, state, reason=None):
        self.updates.append((name, state))

    def nodes(self, names=None):
        return []


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    runs: list[list[str]] = []

    def fake_run(cmd, **kwargs):
        runs.append(list(cmd))
        out = "77.3 tmslurm-rank1.0\n77.4 tmslurm-rank2.0\n" if cmd[0] == "squeue" else ""
        return subprocess.CompletedProcess(cmd, 0, out, "")

    monkeypatch.setattr(sp.subprocess, "run", fake_run)
    monkeypatch.setattr(sp.subprocess, "Popen", lambda *a, **k: SimpleNamespace(poll=lambda: 0))
    cfg = compose_config(["cluster=slurm", "parallel.dp=2", "parallel.pp=2"])
    client = FakeClient()
    # fencing runs in the background in production; here at once, so the commands can be checked
    spawner = sp.SlurmSpawner(
        tmp_path,
        cfg,
        client,
        "77",
        ["n1", "n2", "n3", "n4"],
        background=lambda work, name: work(),
        lane=Lane(inline=True),
    )
    return spawner, client, runs


def test_a_rank_is_fenced_by_killing_its_own_step(slurm):
    spawner, _, runs = slurm
    for rank in range(4):
        spawner.spawn_worker(rank, 0)
    runs.clear()
    spawner.fence("worker", 1)
    assert runs == [["squeue", "-h", "-s", "-j", "77", "-o", "%i %j"], ["scancel", "--signal=KILL", "77.3"]]


def test_a_standby_is_fenced_by_cancelling_its_spare_job(slurm):
    spawner, client, runs = slurm
    spawner.spares["90"] = {"job_id": "90", "index": 0, "node": "n9"}
    spawner.fence("standby", 0)
    spawner.fence("standby", 5)  # no spare job of ours: nothing to do
    spawner.fence("worker", 3)  # never spawned: nothing to do
    assert client.cancelled == ["90"] and runs == []
    assert spawner.spare_job_ids() == []  # forgotten: a restart never launches a rank into a cancelled job
    spawner.rank_node[2] = "n9"
    spawner.bad_nodes = {"n9"}
    assert spawner.spawn_worker(2, 1) is False and runs == []


def test_hooks_release_emptied_nodes_but_never_the_batch_host(slurm, tmp_path):
    spawner, client, _ = slurm
    hooks = SlurmHooks(client, spawner, NodeWatch({}), "77", batch_host="n1")
    released: list[str] = []
    hooks.release_nodes(["n1", "n2"], released.append)
    assert released == ["n2"] and client.nodelists == [["n1", "n3", "n4"]]
    assert hooks.is_batch_host("n1") and not hooks.is_batch_host("n4") and spawner.bad_nodes == {"n1", "n4"}
    fired: list[tuple[float, str]] = []
    assert hooks.inject_fault(
        FaultSpec(index=0, kind="drain", rank=2, ranks=[2], amount="", step=3, when="midstep"),
        lambda t, node: fired.append((t, node)),
    )
    assert client.updates == [("n3", "drain")] and fired == []  # Slurm's own faults are timed by the watcher
    # one fault on several ranks: each of their nodes once
    assert hooks.inject_fault(
        FaultSpec(index=1, kind="node_down", rank=1, ranks=[1, 2, 3], amount="", step=3, when="midstep"),
        lambda t, node: fired.append((t, node)),
    )
    assert client.updates[1:] == [(spawner.node_of_rank(r), "down") for r in (1, 2, 3)] and fired == []
    assert hooks.status() == {"main_job_id": "77", "spare_job_ids": []}


class HeldLane:
    """A lane whose queued work has not run yet (Slurm commands queue behind a slow one)."""

    def __init__(self) -> None:
        self.queued: list[str] = []

    def submit(self, work, name):
        self.queued.append(name)


def test_a_fenced_spare_is_forgotten_before_its_cancel_runs(slurm, tmp_path):
    """A checkpoint restart stops a rank served by a standby that joined (its spare job is fenced) and
    places the ranks again at once: the placement must not pick that job while its cancel is still
    queued on the lane (its srun would fail, 'Invalid job id', and the rank would never start)."""
    _, client, runs = slurm
    cfg = compose_config(["cluster=slurm", "parallel.dp=2", "parallel.pp=2"])
    lane = HeldLane()
    spawner = sp.SlurmSpawner(
        tmp_path, cfg, client, "77", ["n1", "n2", "n3", "n4"], background=lambda work, name: work(), lane=lane
    )
    spawner.spares = {
        "90": {"job_id": "90", "index": 0, "node": "n9"},
        "91": {"job_id": "91", "index": 1, "node": "n8"},
    }
    spawner.rank_node[2] = "n9"  # rank 2 is served by standby 0, which joined on n9
    spawner.fence("standby", 0)
    assert spawner.spare_job_ids() == ["91"] and lane.queued == ["fence-standby0"] and client.cancelled == []
    assert spawner.spawn_worker(2, 1) is True and lane.queued[-1] == "place-rank2"
    spawner._place_waiting()  # what the lane does after looking at the spare jobs
    assert spawner.rank_node[2] == "n8" and spawner.spares["91"]["used_for_restart"] is True


class JobClient(FakeClient):
    """Also answers ``job``: spare job 92 has started on n7, 90 has ended, the others are pending."""

    def job(self, job_id):
        if job_id == "92":
            return SimpleNamespace(nodes=["n7"], end_time=None, state="RUNNING")
        return SimpleNamespace(nodes=[], end_time=None, state="COMPLETED" if job_id == "90" else "PENDING")


def recording_spawner(tmp_path, monkeypatch, client) -> tuple[sp.SlurmSpawner, list[list[str]]]:
    """A spawner on ``client`` whose Slurm commands do nothing; the processes it starts are recorded."""
    monkeypatch.setattr(sp.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0, "", ""))
    started: list[list[str]] = []
    monkeypatch.setattr(
        sp.subprocess, "Popen", lambda cmd, **kw: started.append(cmd) or SimpleNamespace(poll=lambda: 0)
    )
    cfg = compose_config(["cluster=slurm", "parallel.dp=2", "parallel.pp=2"])
    spawner = sp.SlurmSpawner(
        tmp_path,
        cfg,
        client,
        "77",
        ["n1", "n2", "n3", "n4"],
        background=lambda work, name: work(),
        lane=Lane(inline=True),
    )
    return spawner, started


def test_a_restarted_rank_waits_for_a_queued_spare_and_starts_there(tmp_path, monkeypatch):
    """Every spare allocation that is up already hosts a restarted rank, one more is queued: the rank
    whose node left the job waits for it (instead of the run ending) and starts there once it runs."""
    spawner, started = recording_spawner(tmp_path, monkeypatch, JobClient())
    spawner.main_nodes = ["n1", "n2"]  # n3 and n4 were given back
    spawner.spares = {
        "90": {"job_id": "90", "index": 0, "node": "n9", "used_for_restart": True},
        "92": {"job_id": "92", "index": 2, "node": None},
        "93": {"job_id": "93", "index": 3, "node": None},
    }
    spawner.rank_node[3] = "n9"  # it restarted into spare job 90 before, and that job has ended since
    assert spawner.pending_standbys() == [0, 2, 3]  # a restarted controller keeps expecting these
    spawner.lane = HeldLane()
    assert spawner.spawn_worker(3, 5) is True and list(spawner.waiting_ranks()) == [3] and not started
    spawner.lane = Lane(inline=True)
    spawner._refresh_and_place()  # 90 ended: forgotten; 93 still pending; 92 runs on n7: rank 3 starts there
    assert spawner.waiting_ranks() == {} and spawner.rank_node[3] == "n7" and spawner.spares["92"]["used_for_restart"]
    assert "90" not in spawner.spares and spawner.spares["93"]["node"] is None
    assert any("--jobid=92" in c and "--rank" in c and c[c.index("--rank") + 1] == "3" for c in started), started
    spawner.spares.clear()
    spawner.rank_node[2] = "n3"
    assert spawner.spawn_worker(2, 6) is False  # no spare job at all: nowhere to run


def test_a_new_restart_takes_a_waiting_rank_over(tmp_path, monkeypatch):
    monkeypatch.setattr(sp.subprocess, "Popen", lambda cmd, **kw: SimpleNamespace(poll=lambda: 0))
    cfg = compose_config(["cluster=slurm", "parallel.dp=2", "parallel.pp=2"])
    spawner = sp.SlurmSpawner(tmp_path, cfg, JobClient(), "77", ["n1", "n2", "n3", "n4"], lane=HeldLane())
    spawner.main_nodes = ["n1", "n2", "n3"]
    spawner.spares = {"92": {"job_id": "92", "index": 2, "node": None}}
    spawner.rank_node[3] = "n4"
    assert spawner.spawn_worker(3, 5) is True and list(spawner.waiting_ranks()) == [3]
    spawner.rank_node[3] = "n3"  # the next restart finds it a home at once: no second start later
    assert spawner.spawn_worker(3, 6) is True and spawner.waiting_ranks() == {}
    spawner._place_waiting()
    assert spawner.rank_node[3] == "n3" and not spawner.spares["92"].get("used_for_restart")


class DroppedClient(JobClient):
    """The main job 77 has lost n3 (Slurm drops a failed node from a --no-kill job); n3 is repaired."""

    def job(self, job_id):
        if job_id == "77":
            return SimpleNamespace(nodes=["n1", "n2", "n4"], end_time=None, state="RUNNING")
        return super().job(job_id)

    def update_job_nodelist(self, job_id, nodes):
        raise sp.SlurmError("Invalid node name specified for job 77")


def test_a_node_slurm_dropped_from_the_main_job_is_forgotten_and_never_restarted_into(tmp_path, monkeypatch):
    """Found by the chaos soak: the spawner still counted n3 as the main job's, so a restart launched
    rank 2 there as a step of the main job (srun failed at once, the run restarted in a loop), and
    giving n3 back failed ('Invalid node name')."""
    spawner, started = recording_spawner(tmp_path, monkeypatch, DroppedClient())
    released: list[str] = []
    spawner.release_node("n3", released.append)
    assert released == ["n3"] and spawner.main_nodes == ["n1", "n2", "n4"]
    spawner.main_nodes.append("n3")  # stale again; the periodic look at the jobs forgets it
    spawner.spares = {"92": {"job_id": "92", "index": 2, "node": None}}
    spawner.note_spare_node("")
    assert spawner.main_nodes == ["n1", "n2", "n4"]
    assert spawner.spawn_worker(2, 4) is True and spawner.rank_node[2] == "n7"  # onto the spare, not into job 77
    assert not any("--jobid=77" in c and "-wn3" in c for c in started), started


def test_standbys_whose_allocation_is_gone_are_handed_to_the_controller_once(tmp_path, monkeypatch):
    """Found by the chaos soak: an sbatch that failed in a slurmctld outage, and a spare job that
    ended before its standby connected, left the controller expecting standbys that never came. A
    failed sbatch is handed over only after RESUBMIT_AFTER_S (an outage is not hammered)."""
    spawner, _ = recording_spawner(tmp_path, monkeypatch, JobClient())

    def failing_submit(*args, **kwargs):
        raise sp.SlurmError("sbatch of spare job 4 failed: Socket timed out on send/recv operation")

    monkeypatch.setattr(sp, "submit_spare", failing_submit)
    clock = [1000.0]
    monkeypatch.setattr(sp.time, "monotonic", lambda: clock[0])
    spawner.spawn_standby(4)  # the lane runs inline: the sbatch fails now
    assert spawner.take_lost_standbys() == [] and spawner.spare_job_ids() == []
    clock[0] += sp.RESUBMIT_AFTER_S
    assert spawner.take_lost_standbys() == [4] and spawner.take_lost_standbys() == []
    spawner.spares = {
        "90": {"job_id": "90", "index": 0, "node": "n9"},
        "93": {"job_id": "93", "index": 3, "node": None},
    }
    spawner._refresh_spares()  # 90 has ended (its standby 0 may never have connected); 93 is pending
    assert spawner.take_lost_standbys() == [0] and spawner.pending_standbys() == [3]


def test_a_failed_sbatch_of_a_spare_is_a_slurm_error(tmp_path, monkeypatch):
    from submitit.core.utils import FailedJobError

    from tmslurm.slurm import submit

    class Broken:
        def submit(self, *args):
            raise FailedJobError("sbatch: error: Batch job submission failed: Socket timed out on send/recv operation")

    monkeypatch.setattr(submit, "spare_executor", lambda *a, **k: Broken())
    cfg = compose_config(["cluster=slurm", "parallel.dp=2", "parallel.pp=2"])
    with pytest.raises(sp.SlurmError, match="sbatch of spare job 1 failed: .*Socket timed out"):
        submit.submit_spare(tmp_path, cfg, 1, first_standby=2, exclude=[])


@pytest.mark.parametrize("spare_up, where", [(True, "spare"), (False, "nowhere yet")])
def test_a_rank_restarted_onto_a_once_bad_node_is_placed_after_slurm_was_read(tmp_path, monkeypatch, spare_up, where):
    """Found by the hour-long soak: n3 was powered off (Slurm dropped it from the --no-kill job 77),
    repaired and healed; no step was committed any more, so the periodic read of the jobs never ran,
    and every restart launched rank 2 into job 77 on n3 ('Requested node configuration is not
    available'): a restart every minute, for ever. A node that was ever bad is now looked up first."""
    spawner, started = recording_spawner(tmp_path, monkeypatch, DroppedClient())
    spawner.add_bad_node("n3")
    spawner.bad_nodes.discard("n3")  # repaired and healed since; still listed (stale) as the main job's
    spawner.spares = (
        {"92": {"job_id": "92", "index": 2, "node": None}}
        if spare_up
        else {"93": {"job_id": "93", "index": 3, "node": None}}
    )
    assert spawner.spawn_worker(2, 4) is True
    assert spawner.main_nodes == ["n1", "n2", "n4"]
    assert not any("--jobid=77" in c and "-wn3" in c for c in started), started
    if where == "spare":
        assert (
            spawner.rank_node[2] == "n7" and any("--jobid=92" in c for c in started) and spawner.waiting_ranks() == {}
        )
    else:  # spare job 93 is still pending: the rank waits for it (bounded by the controller)
        assert list(spawner.waiting_ranks()) == [2]


def test_a_draining_node_still_runs_its_rank_when_no_spare_is_up(tmp_path, monkeypatch):
    """Bad but still the main job's (a drain, Slurm keeps it allocated), and no spare is up: the rank
    restarts at home, after the lane looked at Slurm."""
    spawner, started = recording_spawner(tmp_path, monkeypatch, JobClient())
    spawner.client.job = lambda job_id: (
        SimpleNamespace(nodes=["n1", "n2", "n3", "n4"], end_time=None, state="RUNNING")
        if job_id == "77"
        else SimpleNamespace(nodes=[], end_time=None, state="PENDING")
    )
    spawner.add_bad_node("n2")
    spawner.spares = {"93": {"job_id": "93", "index": 3, "node": None}}
    assert spawner.spawn_worker(1, 4) is True
    assert any("--jobid=77" in c and "-wn2" in c for c in started) and spawner.waiting_ranks() == {}
