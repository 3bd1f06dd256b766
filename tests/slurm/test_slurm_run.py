"""tmslurm on the real local Slurm cluster: drains, node loss, reservations, admin notices.

Each test launches a real run (main job + spare jobs through submitit), injects the event through
Slurm itself (scontrol, scripts/local-slurm kill-node) and checks the outcome in Slurm (job state,
restart count, node states) and in the run (events, final hash equal to an uninterrupted run of the
same layout, run here with cluster=local: the numerics do not depend on where ranks run).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm
STEPS = 60
COMMON = [
    f"train.steps={STEPS}",
    "bench.step_delay_s=0.15",
    "slurm.partition=debug",
    "slurm.time=00:15:00",
    "detect.heartbeat_timeout_s=3.0",
    "slurm.poll_interval_s=0.5",
    # the first step waits for warm standbys: a test's event never races their warm-up
    "standby.start_when_warm=true",
]
_REFS: dict[tuple, dict] = {}


def reference_hash(tmp_path_factory, *layout: str, steps: int = STEPS) -> dict:
    key = (*layout, steps)
    if key not in _REFS:
        d = tmp_path_factory.mktemp("ref") / "run"
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "tmslurm.cli.launch",
                "cluster=local",
                f"run_dir={d}",
                f"train.steps={steps}",
                *layout,
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        s = json.loads((d / "summary.json").read_text())
        _REFS[key] = {k: s[k] for k in ("final_params_sha256", "final_state_sha256")}
    return _REFS[key]


def exact(summary: dict, ref: dict) -> bool:
    """Parameters and optimizer state equal the uninterrupted run's, and every replica agreed."""
    return (
        summary["replicas_equal"] is True
        and summary["final_params_sha256"] == ref["final_params_sha256"]
        and summary["final_state_sha256"] == ref["final_state_sha256"]
    )


class SlurmRun:
    def __init__(self, slurm, run_dir: Path, overrides: list[str], via: str = "launch") -> None:
        self.slurm = slurm
        self.run_dir = run_dir
        if via == "launch":
            r = slurm.run(
                sys.executable,
                "-m",
                "tmslurm.cli.launch",
                "cluster=slurm",
                "slurm.partition=debug",  # the lab's partition (scripts/local-slurm)
                f"run_dir={run_dir}",
                *overrides,
                timeout=120,
            )
            self.job_id = re.search(r"main job (\d+)", r.stdout).group(1)
            self.launch_output = r.stdout
        else:
            script = Path(__file__).resolve().parents[2] / "scripts" / "tmslurm.sbatch"
            r = slurm.run(
                "sbatch",
                "--parsable",
                "-N",
                str(via),
                "-p",
                "debug",
                "-t",
                "00:15:00",
                f"--output={run_dir.parent}/sbatch-%j.out",
                f"--chdir={run_dir.parent}",
                str(script),
                f"run_dir={run_dir}",
                *overrides,
                timeout=60,
            )
            self.job_id = r.stdout.strip().split(";")[0]

    def journal(self) -> list[dict]:
        p = self.run_dir / "events.jsonl"
        return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []

    def wait_for(self, pred, timeout: float = 120, what: str = "condition") -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in self.journal():
                if pred(e):
                    return e
            if (self.run_dir / "summary.json").exists():
                break
            time.sleep(0.2)
        raise AssertionError(f"{what} not seen in {timeout}s; job {self.job_id}: {self.job()}\n{self.logs()}")

    def status(self) -> dict:
        r = self.slurm.run("tmslurm", "status", str(self.run_dir), "--json", check=False)
        return json.loads(r.stdout) if r.returncode == 0 else {}

    def wait_step(self, step: int, timeout: float = 180) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.status()
            if st.get("step", 0) >= step and st.get("standbys"):
                if all(len(s["roles"]) >= 2 for s in st["standbys"]):
                    return st
            time.sleep(0.3)
        raise AssertionError(f"run did not reach step {step} with warm standbys in {timeout}s\n{self.logs()}")

    def job(self) -> str:
        return self.slurm.run("scontrol", "show", "job", self.job_id, check=False).stdout

    def summary(self, timeout: float = 300) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            p = self.run_dir / "summary.json"
            if p.exists():
                return json.loads(p.read_text())
            time.sleep(0.5)
        raise AssertionError(f"no summary after {timeout}s; job: {self.job()}\n{self.logs()}")

    def logs(self) -> str:
        out = []
        for p in sorted((self.run_dir / "submitit").glob("*_0_log.*")) + sorted(self.run_dir.glob("logs/*.log"))[:3]:
            out.append(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}")
        return "\n".join(out)


def job_field(text: str, key: str) -> str:
    m = re.search(rf"\b{key}=(\S+)", text)
    return m.group(1) if m else ""


def node_state(slurm, node: str) -> str:
    return (
        slurm.run("sinfo", "-h", "-n", node, "-o", "%T").stdout.strip().lower().split("\n")[0]
    )  # a line per partition


def _read(p: Path) -> str:
    """A pid file's text ("" while it is being rewritten: a rebooting node's slurmd has none)."""
    try:
        return p.read_text().strip()
    except FileNotFoundError:
        return ""


def _check_same_job_kept_running(run: SlurmRun, node: str) -> None:
    job = run.job()
    assert job_field(job, "JobState") == "RUNNING", job
    assert job_field(job, "Restarts") == "0", job
    assert node not in run.slurm.run("scontrol", "show", "hostnames", job_field(job, "NodeList")).stdout.split()


def test_drain_and_reboot_asap_move_off_give_the_nodes_back_and_refill_the_pool(slurm, tmp_path, tmp_path_factory):
    """Rank 1's node is drained: its rank moves to a warm standby (a live shadow), the node is cut out
    of the job and becomes DRAINED, and the consumed spare's replacement excludes it. Then the admin
    asks for rank 2's node to be rebooted the way Slurm offers, ``scontrol reboot ASAP
    nextstate=RESUME``: REBOOT_REQUESTED is a planned move too, and once the run gives the node back
    Slurm reboots it (the lab's RebootProgram), it returns IDLE and the pool refills onto it. The
    same job runs on throughout, and the result is exact."""
    steps = 400  # >= 60 s: the reboot and a spare warming on the rebooted node took 6 s on the lab
    ref = reference_hash(tmp_path_factory, "parallel.dp=2", "parallel.pp=2", steps=steps)
    run = SlurmRun(
        slurm,
        tmp_path / "run",
        [
            "parallel.dp=2",
            "parallel.pp=2",
            "standby.count=2",
            *[o if not o.startswith("train.steps=") else f"train.steps={steps}" for o in COMMON],
        ],
    )
    st = run.wait_step(8)
    node = next(r["node"] for r in st["ranks"] if r["rank"] == 1)
    slurm.run("scontrol", "update", f"nodename={node}", "state=drain", "reason=maint")
    run.wait_for(lambda e: e["type"] == "node_released" and e["node"] == node, what="node release")
    _check_same_job_kept_running(run, node)
    slurm.wait_for(lambda: node_state(slurm, node) == "drained", 30, what=f"{node} DRAINED")
    # the consumed spare is replaced by a new spare job that excludes the drained node (on this
    # 6-node cluster it stays pending: every other node is busy)
    deadline = time.monotonic() + 60
    while len(run.status().get("spare_job_ids", [])) < 3 and time.monotonic() < deadline:
        time.sleep(0.5)
    spare = run.status()["spare_job_ids"][2]
    assert node in slurm.run("scontrol", "show", "job", spare).stdout.split("ExcNodeList=")[1].split()[0]

    other = next(r["node"] for r in run.status()["ranks"] if r["rank"] == 2)
    pidfile = slurm.state_dir / "run" / f"slurmd-{other}.pid"
    slurmd_before = _read(pidfile)
    slurm.run("scontrol", "reboot", "ASAP", "nextstate=RESUME", "reason=kernel-update", other)
    run.wait_for(lambda e: e["type"] == "node_released" and e["node"] == other, what="release of the node to reboot")
    _check_same_job_kept_running(run, other)
    slurm.wait_for(
        lambda: (
            _read(pidfile) not in ("", slurmd_before)
            and "drain" not in node_state(slurm, other)
            and "reboot" not in node_state(slurm, other)
        ),
        90,
        what=f"{other} rebooted and back in service",
    )
    deadline = time.monotonic() + 180  # a replacement spare starts on the rebooted node and warms there
    while not any(sb["node"] == other and len(sb["roles"]) >= 2 for sb in run.status().get("standbys", [])):
        assert time.monotonic() < deadline and not (run.run_dir / "summary.json").exists(), (
            f"no warm standby on the rebooted {other}: {run.status().get('standbys')}"
        )
        time.sleep(0.5)
    s = run.summary()
    ev = [e for e in s["events"] if e["kind"] == "planned"]
    assert [(e["ranks"], e["node"]) for e in ev] == [([1], node), ([2], other)], ev
    assert ev[0]["shadowed"] is True and ev[0]["shadow_matched"] is True and ev[0]["transfer_s"] == 0.0, (
        ev
    )  # a live shadow
    assert s["main_job_id"] == run.job_id and len(s["spare_job_ids"]) >= 4
    assert exact(s, ref), s
    sacct = slurm.run("sacct", "-j", run.job_id, "-X", "-n", "-P", "-o", "JobID,State").stdout
    assert "REQUEUE" not in sacct


def test_kill_node_standby_takes_over(slurm, tmp_path, tmp_path_factory):
    ref = reference_hash(tmp_path_factory, "parallel.dp=2", "parallel.pp=2")
    run = SlurmRun(slurm, tmp_path / "run", ["parallel.dp=2", "parallel.pp=2", "standby.count=2", *COMMON])
    st = run.wait_step(8)
    # an operator who knows only a job id, in another directory: the spare's id finds the same run
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    one = subprocess.run(
        ["tmslurm", "status", "--job", st["spare_job_ids"][0], "--json"],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert one.returncode == 0 and json.loads(one.stdout)["main_job_id"] == run.job_id, one.stderr
    watch = subprocess.Popen(
        ["tmslurm", "status", "--watch", "--interval", "1", "--job", run.job_id],
        cwd=elsewhere,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    node = next(r["node"] for r in st["ranks"] if r["rank"] == 2)
    slurm.local_slurm("kill-node", node)
    run.wait_for(lambda e: e["type"] == "joined" and e["rank"] == 2, what="standby took rank 2")
    job = run.job()
    assert job_field(job, "JobState") == "RUNNING" and job_field(job, "Restarts") == "0", job
    s = run.summary()
    (ev,) = [e for e in s["events"] if e["kind"] == "unexpected"]
    assert ev["ranks"] == [2] and ev["node"] == node
    assert exact(s, ref), s
    out, _ = watch.communicate(timeout=60)  # the watch ends by itself once the run has finished
    assert watch.returncode == 0, out
    assert "\x1b" not in out and f"jobs: main {run.job_id}" in out and "steps/s" in out, out[-2000:]
    assert f"unexpected ranks=[2] node={node}" in out, out[-2000:]


def test_maintenance_reservation_migrates_before_it_starts(slurm, tmp_path, tmp_path_factory):
    ref = reference_hash(tmp_path_factory, "parallel.dp=2", "parallel.pp=2")
    run = SlurmRun(slurm, tmp_path / "run", ["parallel.dp=2", "parallel.pp=2", "standby.count=1", *COMMON])
    st = run.wait_step(8)
    node = next(r["node"] for r in st["ranks"] if r["rank"] == 0 + 3)
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + 70))
    slurm.run(
        "scontrol",
        "create",
        "reservation",
        "reservationname=tmslurm-maint",
        f"starttime={start}",
        "duration=10",
        f"nodes={node}",
        "flags=maint,ignore_jobs",
        "users=root",
    )
    try:
        joined = run.wait_for(
            lambda e: e["type"] == "joined" and e["rank"] == 3, what="migration off the reserved node"
        )
        assert joined["t"] < time.mktime(time.strptime(start, "%Y-%m-%dT%H:%M:%S"))
        s = run.summary()
        assert [e["ranks"] for e in s["events"] if e["kind"] == "planned"] == [[3]]
        assert exact(s, ref), s
    finally:
        slurm.run("scontrol", "delete", "reservationname=tmslurm-maint", check=False)


def test_notify_wrong_key_refused_right_key_migrates(slurm, tmp_path, tmp_path_factory):
    ref = reference_hash(tmp_path_factory, "parallel.dp=2", "parallel.pp=2")
    key, pub = tmp_path / "admin.key", tmp_path / "admin.pub"
    slurm.run("tmslurm", "keygen", "--private", str(key), "--public", str(pub))
    wrong, wrong_pub = tmp_path / "wrong.key", tmp_path / "wrong.pub"
    slurm.run("tmslurm", "keygen", "--private", str(wrong), "--public", str(wrong_pub))
    run = SlurmRun(
        slurm,
        tmp_path / "run",
        ["parallel.dp=2", "parallel.pp=2", "standby.count=1", *COMMON, f"security.admin_public_key_file={pub}"],
    )
    st = run.wait_step(8)
    node = next(r["node"] for r in st["ranks"] if r["rank"] == 1)
    bad = slurm.run(
        "tmslurm",
        "notify",
        "--node",
        node,
        "--event",
        "maintenance",
        "--run-dir",
        str(run.run_dir),
        "--private-key-file",
        str(wrong),
        check=False,
    )
    assert bad.returncode == 2 and "refused" in bad.stderr
    unknown = slurm.run(
        "tmslurm",
        "notify",
        "--node",
        "node99",
        "--event",
        "maintenance",
        "--run-dir",
        str(run.run_dir),
        "--private-key-file",
        str(key),
        check=False,
    )
    assert unknown.returncode == 2 and "unknown node" in unknown.stderr
    baddl = slurm.run(
        "tmslurm",
        "notify",
        "--node",
        node,
        "--event",
        "maintenance",
        "--deadline",
        "tomorrow-ish",
        "--run-dir",
        str(run.run_dir),
        "--private-key-file",
        str(key),
        check=False,
    )
    assert baddl.returncode == 2 and "deadline" in baddl.stderr
    ok = slurm.run(
        "tmslurm",
        "notify",
        "--node",
        node,
        "--event",
        "maintenance",
        "--deadline",
        "+5m",
        "--reason",
        "bios",
        "--run-dir",
        str(run.run_dir),
        "--private-key-file",
        str(key),
    )
    assert "accepted" in ok.stdout
    run.wait_for(lambda e: e["type"] == "joined" and e["rank"] == 1, what="migration after notify")
    s = run.summary()
    assert [e["ranks"] for e in s["events"] if e["kind"] == "planned"] == [[1]]
    assert any(e["type"] == "notice_refused" for e in run.journal())
    assert exact(s, ref), s


def test_sbatch_wrapper_path_with_overrides(slurm, tmp_path, tmp_path_factory):
    ref = reference_hash(tmp_path_factory, "parallel.dp=1", "parallel.pp=2")
    run = SlurmRun(
        slurm,
        tmp_path / "run",
        [
            "parallel.dp=1",
            "parallel.pp=2",
            "standby.count=0",
            f"train.steps={STEPS}",
            "bench.step_delay_s=0",
            "slurm.partition=debug",
        ],
        via=2,
    )
    s = run.summary()
    assert s["main_job_id"] == run.job_id and s["steps"] == STEPS
    assert exact(s, ref), s


def test_two_ranks_per_node_move_together_through_node_relays(slurm, tmp_path, tmp_path_factory):
    """With ``runtime.relay=true`` each node's two ranks (and its standbys) reach the controller through
    their node monitor's relay, on Slurm's nodes: one relay connection per node, same exact result.
    (Relays at one rank per node: test_lab_faults.)"""
    ref = reference_hash(tmp_path_factory, "parallel.dp=2", "parallel.pp=2")
    run = SlurmRun(
        slurm,
        tmp_path / "run",
        [
            "parallel.dp=2",
            "parallel.pp=2",
            "parallel.ranks_per_node=2",
            "standby.count=1",
            "runtime.relay=true",
            *COMMON,
        ],
    )
    st = run.wait_step(8)
    node = next(r["node"] for r in st["ranks"] if r["rank"] == 2)
    assert sorted(r["rank"] for r in st["ranks"] if r["node"] == node) == [2, 3]
    slurm.run("scontrol", "update", f"nodename={node}", "state=drain", "reason=maint")
    run.wait_for(lambda e: e["type"] == "node_released" and e["node"] == node, what="node release")
    _check_same_job_kept_running(run, node)
    s = run.summary()
    (ev,) = [e for e in s["events"] if e["kind"] == "planned"]
    assert sorted(ev["ranks"]) == [2, 3] and len(set(ev["standby"].split(","))) == 2
    assert exact(s, ref), s
    relays = [e["node"] for e in run.journal() if e["type"] == "relay"]
    # one relay per node: the two training nodes, the spare and (maybe) its refill
    assert len(relays) >= 3 and len(set(relays)) == len(relays) and node in relays, relays
