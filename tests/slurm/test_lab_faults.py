"""tmslurm on the failure lab: faults that behave like a data centre's, each run ending exact.

Power-off freezes a node and cuts its link (its peers see silence, not a closed socket), a partition
cuts the link while its processes keep running, and the batch host is a victim too. Every run is
compared with an uninterrupted run of the same layout (``final_params_sha256``, ``final_state_sha256``, ``replicas_equal``); whatever tmslurm
cannot do yet (the batch host's power-off) is stated by its test and checked for silent loss.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.slurm.test_slurm_run import COMMON, SlurmRun, exact, job_field, reference_hash

pytestmark = pytest.mark.slurm
LAYOUT = ["parallel.dp=2", "parallel.pp=2"]
# slower steps where the test must act while the run still goes on (the numerics do not change)
SLOW = [o if not o.startswith("train.step_delay_s=") else "train.step_delay_s=0.4" for o in COMMON]


def _steps_of(slurm, job_id: str) -> dict[str, str]:
    """{step id: node list} of the job's running steps."""
    out = slurm.run("squeue", "-h", "-s", "-j", job_id, "-o", "%i %N", check=False).stdout
    return dict(line.split(None, 1) for line in out.splitlines() if len(line.split()) == 2)


def test_power_off_of_a_training_node_is_detected_and_the_standby_takes_over(slurm, tmp_path, tmp_path_factory):
    ref = reference_hash(tmp_path_factory, *LAYOUT)
    run = SlurmRun(slurm, tmp_path / "run", [*LAYOUT, "standby.count=2", *COMMON,
                                             "faults=[{step:20,kind:power_off,rank:2}]"])
    fault = run.wait_for(lambda e: e["type"] == "fault" and e.get("via") == "lab", what="the lab's power-off")
    node = fault["node"]
    assert fault["ranks"] == [2]
    assert slurm.node_power()[node] == "off"
    run.wait_for(lambda e: e["type"] == "joined" and e["rank"] == 2, what="standby took rank 2")
    s = run.summary()
    job = run.job()
    assert job_field(job, "Restarts") == "0", job
    (ev,) = [e for e in s["events"] if e["kind"] == "unexpected"]
    assert ev["ranks"] == [2] and ev["node"] == node
    # a silent node is found by its silence: its monitor's (runtime.node_timeout_s=0.8), well before
    # the ranks' 3 s heartbeat timeout; never ~0 (nothing on the wire says it died)
    (lost,) = [e for e in run.journal() if e["type"] == "node_lost"]
    assert lost["node"] == node and lost["source"] == "monitor" and lost["silent_s"] >= 0.8, lost
    assert 0.5 <= ev["detect_s"] < 2.0, ev  # from the lab's at= (the freeze), after the last beat
    assert ev["downtime_s"] >= ev["detect_s"] * 0.9, ev
    assert exact(s, ref), {k: v for k, v in s.items() if k != "step_log"}
    assert "REQUEUE" not in slurm.run("sacct", "-j", run.job_id, "-X", "-n", "-P", "-o", "State").stdout


def test_partition_of_a_training_node_then_heal_the_fenced_process_changes_nothing(slurm, tmp_path, tmp_path_factory):
    ref = reference_hash(tmp_path_factory, *LAYOUT)
    run = SlurmRun(slurm, tmp_path / "run", [*LAYOUT, "standby.count=2", *SLOW,
                                             "faults=[{step:10,kind:partition,rank:1}]"])
    fault = run.wait_for(lambda e: e["type"] == "fault" and e.get("via") == "lab", what="the lab's partition")
    node = fault["node"]
    lost = run.wait_for(lambda e: e["type"] == "node_lost" and e["node"] == node, what="rank 1's node declared lost")
    (agent,) = [a for a in lost["agents"] if a.startswith("worker1.")]
    run.wait_for(lambda e: e["type"] == "joined" and e["rank"] == 1, what="standby took rank 1")
    slurm.fault("heal", node)  # the old rank 1 is alive on the healed node while the run goes on
    assert run.status().get("step", 0) < 50, "the run (nearly) ended before the heal: nothing was tested"
    # the fenced process does not linger: its step ends once its node is back
    slurm.wait_for(lambda: node not in " ".join(_steps_of(slurm, run.job_id).values()), timeout=60,
                   what=f"the fenced step on {node} to end")
    s = run.summary()
    assert exact(s, ref), {k: v for k, v in s.items() if k != "step_log"}
    (ev,) = [e for e in s["events"] if e["kind"] == "unexpected"]
    assert ev["ranks"] == [1] and ev["node"] == node
    # nothing from the fenced agent was taken after it was declared lost
    after = [e for e in run.journal() if e["t"] > lost["t"] and e.get("agent") == agent]
    assert after == [], after
    # it stopped by itself, on finding that the run had moved on without it
    assert "lost the controller" in (run.run_dir / "logs" / "rank1.0.log").read_text()


def test_power_off_of_a_spare_is_replaced(slurm, tmp_path, tmp_path_factory):
    ref = reference_hash(tmp_path_factory, *LAYOUT)
    run = SlurmRun(slurm, tmp_path / "run", [*LAYOUT, "standby.count=1", *SLOW])
    st = run.wait_step(8)
    spare_node = st["standbys"][0]["node"]
    assert spare_node not in {r["node"] for r in st["ranks"]}
    slurm.fault("power-off", spare_node)
    lost = run.wait_for(lambda e: e["type"] in ("standby_lost", "agent_lost") and e.get("node") == spare_node,
                        what="the controller to see the spare's standby lost")
    assert lost["t"] > 0
    deadline = time.monotonic() + 60
    while len(run.status().get("spare_job_ids", [])) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert len(run.status().get("spare_job_ids", [])) >= 2, "no replacement spare was submitted"
    s = run.summary()
    assert exact(s, ref) and not [e for e in s["events"] if e["kind"] == "unexpected"]


def _requeues(slurm, job_id: str) -> int:
    out = slurm.run("scontrol", "show", "job", job_id, check=False).stdout
    return int(job_field(out, "Restarts") or 0)


def test_drain_of_the_batch_host_checkpoints_requeues_without_it_and_resumes_exactly(slurm, tmp_path, tmp_path_factory):
    """A switch cannot move the batch host (the job ends with it): tmslurm checkpoints at the next
    step boundary, requeues the job excluding the node, and the new incarnation resumes exactly."""
    ref = reference_hash(tmp_path_factory, *LAYOUT)
    run = SlurmRun(slurm, tmp_path / "run", [*LAYOUT, "standby.count=1", *COMMON])
    st = run.wait_step(8)
    batch = next(r["node"] for r in st["ranks"] if r["rank"] == 0)
    assert job_field(run.job(), "BatchHost") == batch
    slurm.run("scontrol", "update", f"nodename={batch}", "state=drain", "reason=maint-batch")
    rq = run.wait_for(lambda e: e["type"] == "requeue", what="checkpoint + requeue")
    assert rq["exclude"] == [batch]
    s = run.summary(timeout=420)  # Slurm holds a requeued job ~2 min before it may start again
    job = run.job()
    # (ExcNodeList is set best-effort: Slurm refuses it while the requeued job is still completing;
    # the drained node cannot be allocated anyway)
    assert _requeues(slurm, run.job_id) == 1, job
    assert job_field(job, "BatchHost") != batch
    (ev,) = [e for e in s["events"] if e["kind"] == "batch_host_requeue"]
    assert ev["ranks"] == [] and ev.get("redo_steps", 0) == 0, ev  # checkpoint at the boundary: nothing redone
    assert exact(s, ref) and s["steps"] == 60


def test_power_off_of_the_batch_host_stalls_the_run_and_a_resume_loses_nothing(slurm, tmp_path, tmp_path_factory):
    """What tmslurm does today when the batch host dies silently: the controller freezes with it.
    Slurm (22.05) drops the node from the ``--no-kill`` job ("Removing failed node ... from JobId")
    but keeps the job RUNNING without its batch step, so the run stalls until the user (or the time
    limit) ends the job; it is not requeued. Nothing is lost: the latest complete checkpoint is
    intact, and a run resumed from it ends bit-identical to the uninterrupted run."""
    ref = reference_hash(tmp_path_factory, *LAYOUT)
    run = SlurmRun(slurm, tmp_path / "run", [*LAYOUT, "standby.count=1", *SLOW, "train.checkpoint_every=10",
                                             "faults=[{step:25,kind:power_off,rank:0}]"])
    st = run.wait_step(8)
    batch = next(r["node"] for r in st["ranks"] if r["rank"] == 0)
    assert job_field(run.job(), "BatchHost") == batch
    slurm.wait_for(lambda: slurm.node_power()[batch] == "off", timeout=120, what=f"{batch} powered off")
    slurm.wait_for(lambda: batch not in slurm.run("scontrol", "show", "hostnames", job_field(run.job(), "NodeList")).stdout,
                   timeout=4 * slurm.slurmd_timeout + 20, what=f"Slurm to drop {batch} from the job")
    job = run.job()
    assert job_field(job, "JobState") == "RUNNING" and job_field(job, "Restarts") == "0", job
    assert not (run.run_dir / "summary.json").exists()
    from tmslurm.train.checkpoint import latest_complete

    assert latest_complete(run.run_dir, 2) == 20
    slurm.run("scancel", run.job_id)
    resumed = tmp_path / "resumed"
    r = subprocess.run([sys.executable, "-m", "tmslurm.launch", "cluster=local", f"run_dir={resumed}", *LAYOUT,
                        "train.steps=60", f"train.resume_from={run.run_dir}"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((resumed / "summary.json").read_text())
    assert s["resumed_from_step"] == 20 and s["steps"] == 60
    assert exact(s, ref), {k: v for k, v in s.items() if k != "step_log"}
