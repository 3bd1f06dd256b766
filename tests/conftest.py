"""Shared pytest fixtures.

``slurm_cluster`` (session): a real Slurm cluster on this host, run by
``scripts/local-slurm`` (see docs/local-cluster.md). A running cluster is reused;
otherwise one is started and, at the end of the session, stopped again.
``slurm`` (function): the same cluster, plus a clean-up after the test that cancels
the test's jobs, powers on / heals / revives nodes a fault took out and resumes
DOWN/DRAINED ones, so tests do not depend on each other.

Every test that uses either fixture gets the ``slurm`` marker (``-m "not slurm"``
deselects them). ``TMSLURM_SKIP_SLURM=1`` skips them; by default they run for real.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
LOCAL_SLURM = REPO_ROOT / "scripts" / "local-slurm"

# Node states (sinfo %T, lower case) in which a node is up and schedulable.
USABLE_STATES = {"idle", "mixed", "allocated"}


@dataclass
class SlurmCluster:
    """Handle on the local cluster started by ``scripts/local-slurm``."""

    conf: str
    nodes: list[str]
    state_dir: Path
    version: str
    script: Path = LOCAL_SLURM
    started_here: bool = False
    slurmd_timeout: int = 5
    env: dict[str, str] = field(default_factory=dict)

    def run(self, *cmd: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run a command with SLURM_CONF set; output captured as text."""
        proc = subprocess.run(list(cmd), env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{' '.join(cmd)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
            )
        return proc

    def local_slurm(self, *args: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        """Run ``scripts/local-slurm ARGS``."""
        return self.run(str(self.script), *args, check=check, timeout=timeout)

    def node_states(self) -> dict[str, str]:
        """{node: sinfo long state}, e.g. 'idle', 'mixed', 'down*', 'idle+drain'."""
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T").stdout
        states: dict[str, str] = {}
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2:
                states[parts[0]] = parts[1].lower()
        return states

    def job_ids(self) -> set[str]:
        out = self.run("squeue", "-h", "-o", "%i").stdout
        return {line.strip() for line in out.splitlines() if line.strip()}

    def node_power(self) -> dict[str, str]:
        """{node: on | off | partitioned}, from the lab lines of ``local-slurm status``."""
        out = self.local_slurm("status", check=False).stdout
        return {m.group(1): m.group(2) for m in re.finditer(r"^\s+(node\d+)\s+addr \S+\s+power (\S+)", out, re.M)}

    def node_slowness(self) -> dict[str, tuple[str, str]]:
        """{node: (CPU quota, link rate)}, ``full`` when not throttled / not limited."""
        out = self.local_slurm("status", check=False).stdout
        return {
            m.group(1): (m.group(2), m.group(3))
            for m in re.finditer(r"^\s+(node\d+)\s+addr .* cpu (\S+)\s+rate (\S+)", out, re.M)
        }

    def node_addr(self, node: str) -> str:
        """The node's own address in the lab (its NodeAddr)."""
        out = self.local_slurm("status", check=False).stdout
        m = re.search(rf"^\s+{node}\s+addr (\S+)", out, re.M)
        assert m, f"no lab line for {node} in local-slurm status:\n{out}"
        return m.group(1)

    def fault(self, kind: str, node: str) -> str:
        """Run a lab fault command (power-off, power-on, partition, heal, kill-node)."""
        return self.local_slurm(kind, node).stdout

    def slurmd_running(self) -> dict[str, bool]:
        """{node: whether its slurmd process is alive}, from ``local-slurm status``."""
        out = self.local_slurm("status", check=False).stdout
        running = {}
        for m in re.finditer(r"^\s*slurmd (\S+)\s+(running|stopped)", out, re.M):
            running[m.group(1)] = m.group(2) == "running"
        return running

    def wait_for(
        self, predicate: Callable[[], object], timeout: float, interval: float = 0.25, what: str = "condition"
    ) -> object:
        """Poll ``predicate`` until it returns a truthy value; fail after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(interval)

    def restore(self, keep_jobs: set[str] = frozenset(), timeout: float = 60) -> None:
        """Cancel jobs not in ``keep_jobs``, revive dead slurmd, resume DOWN/DRAIN nodes
        and wait until every node is usable again."""
        new_jobs = sorted(self.job_ids() - set(keep_jobs))
        if new_jobs:
            self.run("scancel", *new_jobs, check=False)
        for node, power in self.node_power().items():
            if power == "off":
                self.local_slurm("power-on", node)
            elif power == "partitioned":
                self.local_slurm("heal", node)
        for node, (cpu, rate) in self.node_slowness().items():
            if cpu != "full":
                self.local_slurm("throttle", node, "off")
            if rate != "full":
                self.local_slurm("slowlink", node, "off")
        for node, alive in self.slurmd_running().items():
            if not alive:
                self.local_slurm("revive-node", node)

        def settled() -> bool:
            states = self.node_states()
            bad = False
            for node, state in states.items():
                if state in USABLE_STATES:
                    continue
                bad = True
                if any(s in state for s in ("down", "drain", "fail")) and "*" not in state:
                    self.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
            return not bad

        self.wait_for(settled, timeout, interval=0.5, what="all nodes idle/usable again")


def _skip_requested() -> bool:
    return os.environ.get("TMSLURM_SKIP_SLURM", "") not in ("", "0")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "slurm_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slurm)


@pytest.fixture(scope="session")
def slurm_cluster():
    """The local Slurm cluster (reused if running, else started and later stopped)."""
    if _skip_requested():
        pytest.skip("TMSLURM_SKIP_SLURM is set: skipping tests that need the local Slurm cluster")

    def sh(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(LOCAL_SLURM), *args], capture_output=True, text=True, timeout=timeout)

    status = sh("status")
    # status: 0 = everything running, 1 = partly running, 3 = nothing running
    started_here = status.returncode == 3
    if status.returncode != 0:
        # started here: requeued jobs wait 21 s, not Slurm's default 121 s (the batch-host tests
        # requeue; a lab that is already configured keeps its own setting)
        up = sh("up", *(["--requeue-delay", "20"] if started_here else []))
        if up.returncode != 0:
            pytest.fail(f"scripts/local-slurm up failed (rc {up.returncode}):\n{up.stdout}\n{up.stderr}", pytrace=False)

    env_line = sh("env").stdout.strip()
    m = re.match(r"export SLURM_CONF=(\S+)", env_line)
    assert m, f"unexpected output of local-slurm env: {env_line!r}"
    conf = m.group(1)
    old_conf = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    env = dict(os.environ)

    version_out = subprocess.run(["scontrol", "--version"], capture_output=True, text=True, env=env).stdout
    version = version_out.split()[-1] if version_out.split() else "unknown"
    nodes_out = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True, env=env
    ).stdout.split()
    nodes = sorted(set(nodes_out), key=lambda n: (len(n), n))
    timeout_m = re.search(r"^SlurmdTimeout=(\d+)", Path(conf).read_text(), re.M)

    cluster = SlurmCluster(
        conf=conf,
        nodes=nodes,
        state_dir=Path(conf).parent.parent,
        version=version,
        started_here=started_here,
        slurmd_timeout=int(timeout_m.group(1)) if timeout_m else 300,
        env=env,
    )
    try:
        yield cluster
    finally:
        if started_here:
            sh("down")
        if old_conf is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old_conf


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster):
    """The cluster for one test; afterwards its jobs are cancelled and every node is
    brought back to a usable state (killed slurmd revived, DOWN/DRAIN resumed)."""
    before = slurm_cluster.job_ids()
    slurm_cluster.restore(keep_jobs=before)
    yield slurm_cluster
    slurm_cluster.restore(keep_jobs=before)
