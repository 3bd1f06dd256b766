"""The main job's end as a planned event, driven through the controller with fake channels: the
time-limit signal makes the next decision carry a checkpoint, no step is committed while it is
written, and once it is complete the run does slurm.on_limit (requeue, resubmit or stop). The next
job's controller completes the event with no step lost and lists the job chain."""

from __future__ import annotations

import json

import pytest

from tests.unit.controller_harness import FakeCluster, FakeSpawner, Harness
from tmslurm.controller.state import JobEnd, Mode
from tmslurm.controller.summary import job_chain
from tmslurm.core.rundir import RunDir


class SlurmLikeCluster(FakeCluster):
    """Can requeue and resubmit; records each call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []

    def can_requeue(self) -> bool:
        return True

    def requeue(self, exclude):
        self.calls.append(("requeue", list(exclude)))
        return True

    def resubmit(self):
        self.calls.append(("resubmit",))
        return True

    def status(self):
        return {"main_job_id": "77", "spare_job_ids": []}


def _complete_checkpoint(h: Harness, step: int) -> None:
    for name in h.ctl.ctx.layout.shard_names:
        d = RunDir(h.ctl.ctx.rundir.path).checkpoints / f"step_{step}" / name
        d.mkdir(parents=True)
        (d / "meta.json").write_text("{}")


def _harness(tmp_path, *overrides, cluster=None):
    return Harness(tmp_path, 2, 1, 0, *overrides, cluster=lambda cfg: (FakeSpawner(), cluster or SlurmLikeCluster()))


def _signal_and_checkpoint(h: Harness, end: JobEnd = JobEnd.TIME_LIMIT) -> int:
    h.commit_all()
    h.commit_all()
    h.ctl.job_ending(end, "the job's time limit is near (SIGUSR1)")
    assert h.state.checkpoint_then is None, "a signal handler only records it; the loop acts"
    h.ctl.take_job_end()
    decision = h.commit_all()
    assert decision["checkpoint"] is True and decision["step"] == 2
    assert h.state.mode is Mode.CHECKPOINTING
    for r in range(h.world):  # votes for step 3 arrive; nothing is committed while the checkpoint is written
        h.vote(r, rank=r)
    assert h.state.step == 3 and h.state.mode is Mode.CHECKPOINTING
    h.ctl.restarts.tick()
    assert h.state.checkpoint_then is not None, "the checkpoint is not complete yet"
    _complete_checkpoint(h, 3)
    h.ctl.restarts.tick()
    return 3


@pytest.mark.parametrize(
    "on_limit,call,kind",
    [("requeue", ("requeue", []), "job_end_requeue"), ("resubmit", ("resubmit",), "job_end_resubmit")],
)
def test_time_limit_checkpoints_then_requeues_or_resubmits_and_the_next_job_loses_no_step(
    tmp_path, on_limit, call, kind
):
    h = _harness(tmp_path, f"slurm.on_limit={on_limit}")
    step = _signal_and_checkpoint(h)
    assert h.cluster.calls == [call]
    assert h.state.requeued and h.state.mode is Mode.FINISHED
    saved = json.loads(RunDir(tmp_path).requeue.read_text())
    assert saved["kind"] == kind and saved["target_step"] == step and saved["job_id"] == "77"
    (ending,) = h.journal("job_ending")
    assert ending["then"] == on_limit and ending["end"] == "time_limit"
    assert not RunDir(tmp_path).job_ending.exists(), "a complete end leaves nothing for the next job to report"
    # the next job: its controller resumes from the checkpoint and completes the event
    nxt = Harness(
        tmp_path,
        2,
        1,
        0,
        "train.resume_from=" + str(tmp_path),
        f"slurm.on_limit={on_limit}",
        cluster=lambda cfg: (FakeSpawner(), SlurmLikeCluster()),
    )
    assert nxt.state.step == step
    (ev,) = [e for e in nxt.ctl.ctx.events.items if e["kind"] == kind]
    assert ev["lost_steps"] == 0 and ev["trigger"] == "planned" and ev["from_job_id"] == "77"
    chain = job_chain(nxt.ctl.ctx.events.items, "78")
    assert [(j["incarnation"], j["job_id"], j["ended_by"]) for j in chain] == [(0, "77", kind), (1, "78", None)]
    assert nxt.ctl.summary.status()["incarnation"] == 1


def test_on_limit_stop_ends_the_run_after_the_checkpoint(tmp_path):
    h = _harness(tmp_path, "slurm.on_limit=stop")
    _signal_and_checkpoint(h)
    assert h.cluster.calls == [] and h.state.stop_requested
    assert h.journal("stopping_at_job_end")[0]["checkpoint_step"] == 3


def test_a_cluster_that_cannot_requeue_stops_instead(tmp_path):
    h = _harness(tmp_path, cluster=FakeCluster())
    _signal_and_checkpoint(h)
    assert h.state.stop_requested and not h.state.requeued


def test_the_job_end_supersedes_a_waiting_checkpoint_then_restart_but_not_a_batch_host_requeue(tmp_path):
    h = _harness(tmp_path)
    h.ctl.restarts.checkpoint_and_restart([1], "no warm standby", 0.0)
    h.ctl.job_ending(JobEnd.TIME_LIMIT, "time limit")
    h.ctl.take_job_end()
    assert h.state.checkpoint_then.action == "end"
    assert h.journal("job_ending")[0]["superseded"] == "restart"
    g = _harness(tmp_path / "other")
    g.ctl.restarts.checkpoint_and_requeue("n0", "drain")
    g.ctl.job_ending(JobEnd.TIME_LIMIT, "time limit")
    g.ctl.take_job_end()
    assert g.state.checkpoint_then.action == "requeue" and g.journal("job_ending") == []


def test_a_second_signal_changes_nothing(tmp_path):
    h = _harness(tmp_path)
    for _ in range(2):
        h.ctl.job_ending(JobEnd.TIME_LIMIT, "time limit")
        h.ctl.take_job_end()
    assert len(h.journal("job_ending")) == 1


def test_sigterm_checkpoints_within_the_grace_time_and_leaves_the_requeue_to_slurm(tmp_path):
    h = _harness(tmp_path)
    step = _signal_and_checkpoint(h, JobEnd.SIGTERM)
    assert h.cluster.calls == [], "Slurm requeues a preempted job itself (or ends a cancelled one)"
    assert h.state.requeued and json.loads(RunDir(tmp_path).requeue.read_text())["kind"] == "job_end_sigterm"
    nxt = Harness(
        tmp_path, 2, 1, 0, "train.resume_from=" + str(tmp_path), cluster=lambda cfg: (FakeSpawner(), SlurmLikeCluster())
    )
    (ev,) = [e for e in nxt.ctl.ctx.events.items if e["kind"] == "job_end_sigterm"]
    assert ev["lost_steps"] == 0 and nxt.state.step == step


def test_a_job_killed_before_its_checkpoint_was_complete_says_what_it_redoes(tmp_path):
    """SIGTERM at step 2, but the grace time ran out before the checkpoint: the next job resumes from
    the periodic checkpoint (step 1 here) and records the steps it redoes, from the last commit."""
    h = _harness(tmp_path)
    for _ in range(3):
        h.commit_all()
    _complete_checkpoint(h, 1)
    RunDir(tmp_path).snapshot.write_text(json.dumps({"step": 3, "last_commit_t": 1.0}))
    h.ctl.job_ending(JobEnd.SIGTERM, "SIGTERM from Slurm")
    h.ctl.take_job_end()
    assert RunDir(tmp_path).job_ending.exists()
    # ... SIGKILL: no requeue.json was written
    nxt = Harness(
        tmp_path, 2, 1, 0, "train.resume_from=" + str(tmp_path), cluster=lambda cfg: (FakeSpawner(), SlurmLikeCluster())
    )
    (ev,) = [e for e in nxt.ctl.ctx.events.items if e["kind"] == "job_end_unfinished"]
    assert ev["lost_steps"] == 2 and ev["from_checkpoint_step"] == 1 and "before its checkpoint" in ev["cause"]
    assert not RunDir(tmp_path).job_ending.exists() and list(tmp_path.glob("job-ending-*.json"))


def test_a_job_killed_before_its_checkpoint_keeps_the_events_of_the_jobs_before(tmp_path):
    """Job 1 ends at its time limit (resubmit); job 2 completes that event, commits on, and is killed
    before the checkpoint its SIGTERM asked for was complete, so it leaves no ``requeue.json``. Job 3
    still lists every event of the run and the whole chain, as after a requeue: the events come back
    from the journal, the step log from ``steps.jsonl`` (a preempted lab job's summary had lost the
    restart of the job before)."""
    _signal_and_checkpoint(_harness(tmp_path, "slurm.on_limit=resubmit"))

    def nxt() -> Harness:
        return Harness(
            tmp_path,
            2,
            1,
            0,
            "train.resume_from=" + str(tmp_path),
            cluster=lambda cfg: (FakeSpawner(), SlurmLikeCluster()),
        )

    job2 = nxt()
    job2.commit_all()
    job2.commit_all()
    assert [e["kind"] for e in job2.journal("event")] == ["job_end_resubmit"]
    rd = RunDir(tmp_path)
    rd.snapshot.write_text(json.dumps({"step": job2.state.step, "last_commit_t": 1.0}))
    rd.steps.write_text("".join(json.dumps(e) + "\n" for e in job2.state.step_log))
    job2.ctl.job_ending(JobEnd.SIGTERM, "SIGTERM from Slurm")
    job2.ctl.take_job_end()
    job3 = nxt()
    events = job3.ctl.ctx.events.items
    assert [e["kind"] for e in events] == ["job_end_resubmit", "job_end_unfinished"], events
    assert [j["ended_by"] for j in job_chain(events, "79")] == ["job_end_resubmit", "job_end_unfinished", None]
    assert [e["step"] for e in job3.state.step_log] == [e["step"] for e in job2.state.step_log]
