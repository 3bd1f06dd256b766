"""Smoke tests of the local Slurm cluster (scripts/local-slurm), on a real cluster.

They check the Slurm behaviour the project relies on (docs/local-cluster.md and
DESIGN.md section 5): idle nodes, a ``--no-kill`` job surviving the loss of a
non-batch node, failure injection with ``kill-node``/``revive-node``, accounting
through slurmdbd, and submitit seeing final job states.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

# One sleeping step per node, the way tmslurm launches its ranks.
STEP_PER_NODE_SCRIPT = """#!/bin/bash
for n in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do
    srun -N1 -n1 -w "$n" --no-kill --kill-on-bad-exit=0 sleep 300 &
done
wait
"""


def _expand(slurm, nodelist: str) -> list[str]:
    if not nodelist or nodelist.startswith("("):
        return []
    return slurm.run("scontrol", "show", "hostnames", nodelist).stdout.split()


def _job(slurm, job_id: str) -> tuple[str, list[str]]:
    """(state, nodes) of a job from squeue; ('', []) once it left the queue."""
    out = slurm.run("squeue", "-h", "-j", job_id, "-o", "%T %N", check=False).stdout.split()
    if not out:
        return "", []
    return out[0], _expand(slurm, out[1] if len(out) > 1 else "")


def _batch_host(slurm, job_id: str) -> str:
    out = slurm.run("scontrol", "show", "job", job_id).stdout
    for tok in out.split():
        if tok.startswith("BatchHost="):
            return tok.split("=", 1)[1]
    return ""


def _running_steps(slurm, job_id: str) -> list[str]:
    out = slurm.run("squeue", "-h", "-s", "-j", job_id, "-o", "%i %N", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _submit_steps_job(slurm, tmp_path: Path, nodes: list[str]) -> str:
    script = tmp_path / "steps.sh"
    script.write_text(STEP_PER_NODE_SCRIPT)
    job_id = (
        slurm.run(
            "sbatch",
            "--parsable",
            "--no-kill",
            f"-N{len(nodes)}",
            "-w",
            ",".join(nodes),
            "-J",
            "smoke-steps",
            "-o",
            str(tmp_path / "slurm-%j.out"),
            str(script),
        )
        .stdout.strip()
        .split(";")[0]
    )
    # running, with one step per node (batch step excluded)
    slurm.wait_for(
        lambda: (
            _job(slurm, job_id)[0] == "RUNNING"
            and len([s for s in _running_steps(slurm, job_id) if not s.endswith(".batch")]) >= len(nodes)
        ),
        timeout=30,
        what=f"job {job_id} running with {len(nodes)} steps",
    )
    return job_id


def test_all_nodes_idle(slurm):
    states = slurm.node_states()
    assert len(slurm.nodes) >= 4, f"need at least 4 nodes, have {slurm.nodes}"
    assert set(states) == set(slurm.nodes)
    assert all(s == "idle" for s in states.values()), states
    assert slurm.version.split(".")[0].isdigit(), slurm.version


def test_no_kill_job_survives_admin_down_of_non_batch_node(slurm, tmp_path):
    nodes = slurm.nodes[:3]
    job_id = _submit_steps_job(slurm, tmp_path, nodes)
    batch = _batch_host(slurm, job_id)
    assert batch in nodes
    victim = next(n for n in reversed(nodes) if n != batch)

    slurm.run("scontrol", "update", f"nodename={victim}", "state=down", "reason=test")

    def shrunk():
        state, job_nodes = _job(slurm, job_id)
        return state == "RUNNING" and job_nodes and victim not in job_nodes

    slurm.wait_for(shrunk, timeout=20, what=f"job {job_id} to drop {victim}")
    time.sleep(2)  # and it stays running
    state, job_nodes = _job(slurm, job_id)
    assert state == "RUNNING", state
    assert sorted(job_nodes) == sorted(n for n in nodes if n != victim)
    assert "down" in slurm.node_states()[victim]

    slurm.run("scontrol", "update", f"nodename={victim}", "state=resume")
    slurm.run("scancel", job_id)
    slurm.wait_for(lambda: slurm.node_states()[victim] == "idle", timeout=20, what=f"{victim} idle after resume")


def test_kill_node_is_seen_as_node_failure_and_revive_restores_it(slurm, tmp_path):
    nodes = slurm.nodes[-2:]
    job_id = _submit_steps_job(slurm, tmp_path, nodes)
    batch = _batch_host(slurm, job_id)
    victim = next(n for n in nodes if n != batch)

    t0 = time.monotonic()
    slurm.local_slurm("kill-node", victim)
    # The node's slurmd is gone at once (status reads the pid file + /proc).
    assert slurm.slurmd_running()[victim] is False

    def failed():
        s = slurm.node_states()[victim]
        return "*" in s or "down" in s or "not_responding" in s

    # Measured on 22.05 with SlurmdTimeout=5: NOT_RESPONDING after ~8 s, DOWN ~16 s.
    limit = 3 * slurm.slurmd_timeout + 20
    slurm.wait_for(failed, timeout=limit, what=f"{victim} NOT_RESPONDING/DOWN")
    detected = time.monotonic() - t0
    assert detected < limit

    slurm.run("scancel", job_id)
    slurm.local_slurm("revive-node", victim)
    slurm.wait_for(lambda: slurm.node_states()[victim] == "idle", timeout=30, what=f"{victim} idle after revive-node")
    assert slurm.slurmd_running()[victim] is True


def test_sacct_reports_completed_job(slurm, tmp_path):
    job_id = (
        slurm.run("sbatch", "--parsable", "-N1", "-J", "smoke-true", "-o", str(tmp_path / "out"), "--wrap", "true")
        .stdout.strip()
        .split(";")[0]
    )

    def sacct_state():
        out = slurm.run("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State", check=False).stdout.split()
        return out[0] if out and out[0] == "COMPLETED" else None

    assert slurm.wait_for(sacct_state, timeout=30, what=f"sacct COMPLETED for {job_id}")


def test_submitit_job_completes(slurm, tmp_path):
    submitit = pytest.importorskip("submitit")
    executor = submitit.AutoExecutor(folder=tmp_path / "submitit")
    assert executor.cluster == "slurm"
    executor.update_parameters(
        slurm_partition="debug", timeout_min=5, nodes=1, tasks_per_node=1, cpus_per_task=1, name="smoke-submitit"
    )

    def add(a: int, b: int) -> tuple[int, str]:
        # defined here so that cloudpickle ships it by value (the job cannot import
        # this test module)
        import os

        return a + b, os.environ.get("SLURMD_NODENAME", "")

    job = executor.submit(add, 2, 3)
    value, node = job.result()
    assert value == 5
    assert node in slurm.nodes

    slurm.wait_for(
        lambda: job.state == "COMPLETED",
        timeout=60,
        interval=1,
        what=f"submitit job {job.job_id} state COMPLETED (is {job.state})",
    )
