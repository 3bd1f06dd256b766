"""A run that outlives its Slurm jobs, on the lab. The main job's time limit is a planned event:
Slurm's ``--signal=USR1@30`` before a 2-minute limit makes the run checkpoint at a step boundary
and requeue itself, and the next job resumes with no step lost. A preemption (SIGTERM, the debug
partition's 30 s GraceTime, when a job of the ``urgent`` partition takes a node) is requeued by
Slurm; its cost is reported. Every run ends bit-identical to the uninterrupted one, and its summary
lists the chain of jobs.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.slurm.test_lab_faults import LAYOUT, SLOW, _requeues
from tests.slurm.test_slurm_run import SlurmRun, exact, job_field, reference_hash
from tmslurm.slurm.runtag import RunTag, parse_run_tag
from tmslurm.wire.protocol import request

pytestmark = pytest.mark.slurm


def _steps(n: int) -> list[str]:
    return [o if not o.startswith("train.steps=") else f"train.steps={n}" for o in SLOW]


@pytest.mark.timeout(600)  # up to four 2-minute jobs and Slurm's scheduling between them (300 s: the default)
def test_a_time_limit_then_a_batch_host_drain_three_jobs_no_step_lost(slurm, tmp_path, tmp_path_factory):
    """Job 1 runs into its 2-minute limit: SIGUSR1 (30 s before it, give or take Slurm's resolution),
    a checkpoint at the next boundary, and ``slurm.on_limit=resubmit``: job 2 is a new job that
    waits for job 1 (``afterany``) in the same run directory. Job 2 resumes there; its batch host is
    drained, so it checkpoints and requeues itself (``scontrol requeue``, the same job id) without
    it. Job 3 ends the run (or its own limit does the same again). Spares carry the run's comment
    and the main job's partition."""
    steps = 200  # more than one 2-minute job can do at 0.4 s a step
    ref = reference_hash(tmp_path_factory, *LAYOUT, steps=steps)
    run = SlurmRun(
        slurm,
        tmp_path / "run",
        [
            *LAYOUT,
            "standby.count=1",
            *_steps(steps),
            "slurm.time=00:02:00",
            "slurm.signal_lead_s=30",
            "slurm.on_limit=resubmit",
        ],
    )
    first = run.job_id
    st = run.wait_step(3)
    jobs = slurm.run("squeue", "-h", "-o", "%i|%j|%P|%k").stdout.splitlines()
    ours = [j.split("|", 3) for j in jobs if parse_run_tag(j.split("|", 3)[3]) == RunTag(run.run_dir.name, run.run_dir)]
    names = sorted(j[1] for j in ours)
    assert names[0] == "tmslurm-main" and names[1].startswith("tmslurm-spare") and {j[2] for j in ours} == {"debug"}, (
        jobs
    )
    ending = run.wait_for(lambda e: e["type"] == "job_ending", timeout=150, what="Slurm's SIGUSR1 before the limit")
    assert ending["end"] == "time_limit" and ending["then"] == "resubmit", ending
    resumed = run.wait_for(lambda e: e["type"] == "resumed_after_requeue", timeout=150, what="job 2 to resume")
    chain_ids = json.loads((run.run_dir / "jobs.json").read_text())["chain"]
    assert chain_ids[0] == first and len(chain_ids) == 2 and chain_ids[1] != first, chain_ids
    run.job_id = chain_ids[1]
    st = run.wait_step(resumed["from_step"] + 3)
    batch = next(r["node"] for r in st["ranks"] if r["rank"] == 0)
    assert job_field(run.job(), "BatchHost") == batch and st["incarnation"] == 1, st
    slurm.run("scontrol", "update", f"nodename={batch}", "state=drain", "reason=maint-batch")
    rq = run.wait_for(
        lambda e: e["type"] == "requeue" and e.get("kind") == "batch_host_requeue", what="job 2's requeue"
    )
    assert rq["exclude"] == [batch], rq
    run.wait_for(
        lambda e: e["type"] == "resumed_after_requeue" and e["t"] > rq["t"], timeout=240, what="job 3 to resume"
    )
    # read while job 3 runs: the lab's MinJobAge=10 drops an ended job's record, and under load job 3
    # may end by its own limit too (then a 4th job ends the run)
    assert _requeues(slurm, run.job_id) >= 1
    s = run.summary(timeout=420)
    # (ExcNodeList is set best-effort: Slurm refuses it while the requeued job is still completing;
    # the drained node cannot be allocated anyway)
    assert job_field(run.job(), "BatchHost") != batch
    chain = s["jobs"]
    assert [j["ended_by"] for j in chain[:2]] == ["job_end_resubmit", "batch_host_requeue"], chain
    assert all(j["lost_steps"] == 0 for j in chain[:-1]), chain  # a checkpoint at each boundary
    assert [j["job_id"] for j in chain[:3]] == [first, run.job_id, run.job_id], chain
    assert s["steps"] == steps and exact(s, ref), {k: v for k, v in s.items() if k != "step_log"}


@pytest.mark.timeout(600)  # a restart, Slurm's kill 30+ s after the SIGTERM, the requeue and ~190 steps
def test_a_preempted_job_is_requeued_by_slurm_and_ends_exact_with_its_losses_reported(
    slurm, tmp_path, tmp_path_factory
):
    """A job of the ``urgent`` partition needs rank 1's node: Slurm sends every process of the main
    job SIGTERM, gives it GraceTime (30 s), then kills and requeues it. The ranks ignore the SIGTERM,
    but the srun that launched each rank step answers it by SIGKILLing its step ("forcing job
    termination"), so the ranks die at once: the controller restarts them from the latest complete
    checkpoint within the grace time, checkpoints at the first step boundary, and the requeued job
    resumes there. The steps since the last periodic checkpoint are redone and reported; nothing is
    lost from the result.

    Slurm kills the job no sooner than GraceTime after the SIGTERM, and later when slurmctld's
    periodic check comes late (a CI run: the job still ran 36 s after it). The run must outlast
    that, or it ends in the first job with nothing to requeue, as 60 steps did: 200 steps at
    ~0.45 s leave ~85 s after the SIGTERM at step 8."""
    steps = 200
    ref = reference_hash(tmp_path_factory, *LAYOUT, steps=steps)
    run = SlurmRun(slurm, tmp_path / "run", [*LAYOUT, "standby.count=1", *_steps(steps), "train.checkpoint_every=5"])
    st = run.wait_step(8)
    node = next(r["node"] for r in st["ranks"] if r["rank"] == 1)
    slurm.run(
        "sbatch",
        "--parsable",
        "-p",
        "urgent",
        "-N1",
        f"-w{node}",
        "-t",
        "1",
        f"--output={tmp_path}/urgent-%j.out",
        "--wrap",
        "sleep 2",
    )
    ending = run.wait_for(lambda e: e["type"] == "job_ending", what="the preemption's SIGTERM")
    assert ending["end"] == "sigterm", ending
    s = run.summary(timeout=300)
    restarts = [e for e in s["events"] if e["kind"] == "restart"]
    assert restarts and all(e["cause"].startswith("process exit") for e in restarts), s["events"]
    # redone: the steps since the latest complete checkpoint (written asynchronously every 5 steps)
    assert all(e["lost_steps"] < 2 * 5 for e in restarts), restarts
    (first, *_rest) = s["jobs"]
    # Two ends, by Slurm's timing, each with its own count of redone steps:
    # - job_end_sigterm: the checkpoint after the restart was complete within the grace time; the
    #   next job resumes at it and redoes nothing;
    # - job_end_unfinished: the grace time ran out first; the next job resumes from the latest
    #   complete checkpoint (periodic, written asynchronously every 5 steps, as for the restarts
    #   above) and redoes the steps since, reported as the job's lost_steps.
    ends = [e for e in s["events"] if e["kind"] in ("job_end_sigterm", "job_end_unfinished")]
    assert [e["kind"] for e in ends] == [first["ended_by"]], (s["jobs"], ends)
    if first["ended_by"] == "job_end_sigterm":
        assert first["lost_steps"] == 0, s["jobs"]
    else:
        assert 0 <= first["lost_steps"] < 2 * 5, s["jobs"]
    assert _requeues(slurm, run.job_id) == 1
    assert exact(s, ref), {k: v for k, v in s.items() if k != "step_log"}


def _warm_standbys(run: SlurmRun) -> int:
    st = run.status()
    return sum(1 for s in st.get("standbys", []) if len(s["roles"]) >= 2 and not s.get("busy"))


def test_a_spare_is_renewed_before_its_limit_and_a_cancelled_spare_is_replaced(slurm, tmp_path, tmp_path_factory):
    """The spare's 2-minute limit: 60 s before it (slurm.spare_renew_s) a fresh spare is submitted and
    warmed, and only then is the old one cancelled, so the run never lacks a warm standby (journal). A
    drain right after switches warm, to the fresh standby. Then ``scancel`` of the spare that replaced
    the one consumed: it is replaced too. The run, stopped after all that, ends exact."""
    run = SlurmRun(
        slurm,
        tmp_path / "run",
        [*LAYOUT, "standby.count=1", *_steps(100000), "slurm.spare_time=00:02:00", "slurm.spare_renew_s=60"],
    )
    st = run.wait_step(3)
    first_spare = st["spare_job_ids"][0]
    renewing = run.wait_for(lambda e: e["type"] == "standby_renewing", timeout=150, what="the spare's renewal")
    retired = run.wait_for(lambda e: e["type"] == "standby_retired", timeout=120, what="the old spare let go")
    assert retired["agent"] == renewing["agent"] and retired["warm"] >= 1, retired
    journal = run.journal()
    assert not [e for e in journal if e["type"] == "standby_lost"], "a standby was lost during the renewal"
    slurm.wait_for(
        lambda: (
            job_field(slurm.run("scontrol", "show", "job", first_spare, check=False).stdout, "JobState")
            in ("CANCELLED", "")
        ),
        60,
        what=f"spare {first_spare} cancelled",
    )
    # a drain right after: the fresh standby takes the rank, warm
    spare_ids = lambda: {int(j) for j in run.status().get("spare_job_ids", [])}  # noqa: E731 (Slurm's ids only grow)
    before = spare_ids()
    st = run.wait_step(run.status()["step"] + 2)
    node = next(r["node"] for r in st["ranks"] if r["rank"] == 1)
    slurm.run("scontrol", "update", f"nodename={node}", "state=drain", "reason=maint-after-renewal")
    planned = run.wait_for(lambda e: e["type"] == "event" and e["kind"] == "planned", timeout=120, what="a warm switch")
    assert planned["ranks"] == [1] and planned["node"] == node, planned
    # the consumed standby is replaced; cancel that replacement once it is warm: it is replaced again
    deadline = time.monotonic() + 120
    while not spare_ids() - before or _warm_standbys(run) < 1:
        assert time.monotonic() < deadline, run.status()
        time.sleep(1)
    replacement = min(spare_ids() - before)  # the first submitted since the drain (a later one: a renewal)
    slurm.run("scancel", str(replacement))
    lost = run.wait_for(lambda e: e["type"] == "standby_lost", timeout=60, what="the cancelled spare's standby lost")
    while max(spare_ids()) == replacement or _warm_standbys(run) < 1:
        assert time.monotonic() < deadline + 60, run.status()
        time.sleep(1)
    assert lost["cause"] == "process exit", lost
    assert request(run.run_dir, {"type": "stop"})["type"] == "ok"
    s = run.summary()
    slurm.run("scontrol", "update", f"nodename={node}", "state=resume")
    assert [e["kind"] for e in s["events"]] == ["planned"], s["events"]
    assert exact(s, reference_hash(tmp_path_factory, *LAYOUT, steps=s["steps"])), s["events"]
