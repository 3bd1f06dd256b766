"""No Slurm command delays a vote: with every Slurm call of the real spawner and hooks hanging, a
planned switch and a recovery still commit step after step on the controller's thread.

Each hanging call records the thread it ran on and waits on an Event the test releases at the end;
a call on the controller's (the test's) thread would be recorded as such and fail the test.
"""

from __future__ import annotations

import subprocess
import threading
import time
from types import SimpleNamespace

import pytest

from tests.unit.controller_harness import Harness
from tmslurm.controller.plan_types import Recovery
from tmslurm.controller.state import Mode
from tmslurm.core.notices import Notice
from tmslurm.slurm.proc import spawner as sp
from tmslurm.slurm.proc.hooks import SlurmHooks
from tmslurm.slurm.watcher import NodeWatch
from tmslurm.wire.messages import FaultSpec


class Hanging:
    """Every Slurm entry point: records (what, on the caller's thread?) and hangs until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls: list[tuple[str, bool]] = []
        self.hanging = threading.Event()
        self.main = threading.get_ident()

    def hang(self, what: str) -> None:
        self.calls.append((what, threading.get_ident() == self.main))
        self.hanging.set()
        assert self.release.wait(60), f"{what} was never released"

    def on_decision_thread(self) -> list[str]:
        return [what for what, main in self.calls if main]

    # the SlurmClient interface
    def cancel(self, job_id):
        self.hang(f"scancel {job_id}")

    def update_job_nodelist(self, job_id, nodes):
        self.hang(f"scontrol update jobid={job_id} nodelist={','.join(nodes)}")

    def update_node(self, name, state, reason=None):
        self.hang(f"scontrol update node {name} {state}")

    def nodes(self, names=None):
        self.hang("scontrol show node")
        return []

    def job(self, job_id):
        self.hang(f"scontrol show job {job_id}")
        return SimpleNamespace(nodes=["s9"], end_time=None)


@pytest.fixture
def slurm(monkeypatch, tmp_path):
    hanging = Hanging()

    def run(cmd, **kwargs):
        hanging.hang(" ".join(cmd))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    def submit(*args, **kwargs):
        hanging.hang("sbatch (submitit)")
        return "900"

    monkeypatch.setattr(sp.subprocess, "run", run)
    monkeypatch.setattr(sp.subprocess, "Popen", lambda *a, **k: SimpleNamespace(poll=lambda: 0))
    monkeypatch.setattr(sp, "submit_spare", submit)
    monkeypatch.setattr("tmslurm.slurm.proc.hooks.subprocess.run", run)
    built: dict[str, object] = {}

    def cluster(cfg):
        spawner = sp.SlurmSpawner(tmp_path / "spawner", cfg, hanging, "77", [f"n{r}" for r in range(4)])
        built["hooks"] = SlurmHooks(hanging, spawner, NodeWatch({}), "77", batch_host="n0")
        return spawner, built["hooks"]

    yield hanging, cluster, built
    hanging.release.set()
    assert built["hooks"].flush(30.0)  # nothing queued may run after the patches are undone


def _notice(**fields) -> Notice:
    return Notice(kind="maintenance", source="admin", reason="psu", time=time.time(), **fields)


def test_votes_commit_through_a_planned_switch_while_slurm_hangs(slurm, tmp_path):
    hanging, cluster, built = slurm
    h = Harness(tmp_path, 2, 2, 1, "cluster=slurm", cluster=cluster)
    h.ctl.intake.notice(_notice(rank=1))
    h.prepare_all()
    assert h.commit_all()["switch"]["moves"] == [{"rank": 1, "joiner": h.aid("s0")}]
    h.send(1, {"type": "left", "rank": 1, "step": 1, "transfer_s": 0.01, "phase2_s": 0.01, "bytes": 10})
    h.send(
        "s0",
        {
            "type": "joined",
            "epoch": 1,
            "rank": 1,
            "joiner": 0,
            "step": 1,
            "transfer_s": 0.01,
            "phase1_s": 0.01,
            "bytes": 10,
            "rss_mb": 1.0,
        },
    )
    assert h.state.plan is None and h.state.mode is Mode.RUNNING
    for _ in range(25):  # past step 20: the spare jobs' nodes are looked up too
        assert h.commit_all({1: "s0"})["decision"] == "commit"
    assert h.state.step == 26 and hanging.hanging.wait(30) and not hanging.on_decision_thread()
    hanging.release.set()
    assert built["hooks"].flush(30.0)
    assert "scontrol update jobid=77 nodelist=n0,n2,n3" in [w for w, _ in hanging.calls]
    h.ctl.handle(h.ctl.ctx.queue.get(timeout=5))  # the give-back's result comes back as a queue item
    assert [e["node"] for e in h.journal("node_released")] == ["n1"]


def test_votes_commit_through_a_recovery_while_slurm_hangs(slurm, tmp_path):
    hanging, cluster, built = slurm
    h = Harness(tmp_path, 2, 2, 1, "cluster=slurm", cluster=cluster)
    assert not built["hooks"].is_batch_host("s9")  # a bad node: new spares read its state (on the lane)
    h.disconnect(2)
    assert isinstance(h.state.plan, Recovery)
    h.abort_all([0, 1, 3])
    for r in (0, 1, 3):
        h.send(r, {"type": "recovered", "epoch": h.state.epoch, "rank": r, "build_s": 0.01})
    h.send(
        "s0",
        {
            "type": "joined",
            "epoch": h.state.epoch,
            "rank": 2,
            "joiner": 0,
            "step": 0,
            "transfer_s": 0.01,
            "phase1_s": 0.01,
            "bytes": 10,
            "rss_mb": 1.0,
        },
    )
    assert h.state.plan is None
    for _ in range(5):
        assert h.commit_all({2: "s0"})["decision"] == "commit"
    hooks = built["hooks"]
    assert hooks.requeue(["n3"]) and h.ctl.ctx.spawner.spawn_worker(3, 1)  # both return at once
    assert h.state.step == 5 and hanging.hanging.wait(30) and not hanging.on_decision_thread()
    hanging.release.set()
    assert hooks.flush(30.0)
    whats = [w for w, _ in hanging.calls]
    assert {"sbatch (submitit)", "scontrol show node", "scontrol requeue 77"} <= set(whats)


def test_every_controller_facing_slurm_call_returns_at_once(slurm, tmp_path):
    from tmslurm.core.config import compose_config

    hanging, cluster, built = slurm
    spawner, hooks = cluster(compose_config(["cluster=slurm", "parallel.dp=2", "parallel.pp=2"]))
    hooks.is_batch_host("n3")
    calls = [
        lambda: spawner.spawn_standby(0),
        lambda: spawner.spawn_worker(3, 1),
        lambda: spawner.fence("worker", 3),
        lambda: hooks.on_step(20, lambda: {"n0": "main"}),
        lambda: spawner.fence("standby", 0),
        lambda: hooks.release_nodes(["n1"], lambda node: None),
        lambda: hooks.requeue(["n3"]),
        lambda: hooks.inject_fault(
            FaultSpec(index=0, kind="drain", rank=2, ranks=[2], amount="", step=0, when="midstep"), lambda t, node: None
        ),
    ]
    for call in calls:
        call()
    assert hanging.hanging.wait(30) and not hanging.on_decision_thread()
    hanging.release.set()
    assert hooks.flush(30.0)
    whats = [w for w, _ in hanging.calls]
    assert whats.index("sbatch (submitit)") < whats.index("scancel 900")  # a spare is cancelled after it exists
    assert {"scontrol update node n2 drain", "scontrol requeue 77", "scontrol show job 900"} <= set(whats)


def test_the_watchers_node_set_is_rebuilt_at_most_every_refresh_period(slurm, monkeypatch):
    from tmslurm.core.config import compose_config
    from tmslurm.slurm.proc import hooks as hooks_mod

    hanging, cluster, built = slurm
    hanging.release.set()
    _, hooks = cluster(compose_config(["cluster=slurm", "parallel.dp=2", "parallel.pp=2"]))
    now = [1000.0]
    monkeypatch.setattr(hooks_mod.time, "monotonic", lambda: now[0])
    built_sets: list[dict[str, str]] = []

    def nodes() -> dict[str, str]:  # walks every agent in the controller: must not run at every step
        built_sets.append({"n0": "main", "n1": "main"} if len(built_sets) < 1 else {"n0": "main", "n4": "spare"})
        return built_sets[-1]

    for step in range(1, 101):  # 100 commits within one refresh period
        hooks.on_step(step, nodes)
    assert len(built_sets) == 1 and hooks.watch.nodes == {"n0": "main", "n1": "main"}
    now[0] += hooks_mod.NODES_REFRESH_S
    hooks.on_step(101, nodes)
    assert len(built_sets) == 2 and hooks.watch.nodes == {"n0": "main", "n4": "spare"}
