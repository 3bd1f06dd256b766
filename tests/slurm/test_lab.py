"""The failure lab (scripts/local-slurm): nodes are separate hosts, and faults look like real ones.

A node is its own network namespace, hostname and freezer cgroup. These tests check what a peer
sees of each fault through a real TCP connection to a process on the node (power-off: silence,
no FIN/RST; partition: silence while the process keeps running, traffic again after heal;
kill-node: the connection closes at once), and what Slurm sees (NOT_RESPONDING/DOWN, a
``--no-kill`` job that keeps running on its other nodes).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time

import pytest

from tests.slurm.test_cluster_smoke import _job, _submit_steps_job

pytestmark = pytest.mark.slurm

# A one-connection echo server; prints its pid and host name once it listens.
ECHO = r"""
import os, socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 9100)); s.listen(1)
print(os.getpid(), socket.gethostname(), flush=True)
c, _ = s.accept()
while True:
    d = c.recv(4096)
    if not d:
        break
    c.sendall(d)
"""


class NodeEcho:
    """An echo server running on ``node`` (through ``local-slurm exec``) and a host connection to it."""

    def __init__(self, slurm, node: str) -> None:
        self.proc = subprocess.Popen(
            [str(slurm.script), "exec", node, "python3", "-c", ECHO], stdout=subprocess.PIPE, text=True, env=slurm.env
        )
        line = self.proc.stdout.readline().split()  # waits until it listens
        assert len(line) == 2, f"echo server on {node} did not start (rc {self.proc.poll()})"
        self.pid, self.hostname = int(line[0]), line[1]
        self.conn = socket.create_connection((slurm.node_addr(node), 9100), timeout=5)

    def echo(self, payload: bytes, timeout: float) -> bytes:
        self.conn.settimeout(timeout)
        self.conn.sendall(payload)
        return self.conn.recv(4096)

    def close(self) -> None:
        self.conn.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


def _slurm_lost(slurm, node: str) -> bool:
    s = slurm.node_states()[node]
    return "*" in s or "down" in s


def test_nodes_are_separate_hosts(slurm):
    out = slurm.run("srun", f"-N{len(slurm.nodes)}", "-l", "hostname", timeout=60).stdout
    names = sorted(line.split(":", 1)[1].strip() for line in out.splitlines())
    assert names == sorted(slurm.nodes)
    addrs = set()
    for node in slurm.nodes:
        info = slurm.run("scontrol", "show", "node", node).stdout
        addr = re.search(r"NodeAddr=(\S+)", info).group(1)
        assert addr == slurm.node_addr(node) and addr != "127.0.0.1"
        addrs.add(addr)
    assert len(addrs) == len(slurm.nodes)


def test_exec_runs_in_the_node_and_sees_only_the_lab(slurm):
    node = slurm.nodes[1]
    r = slurm.local_slurm("exec", node, "sh", "-c", "hostname; ip -4 -o addr show eth0; ip route")
    assert r.stdout.splitlines()[0] == node
    assert slurm.node_addr(node) in r.stdout
    assert "default" not in r.stdout  # no route out of the lab


def test_power_off_is_silent_then_slurm_sees_it_and_power_on_reboots(slurm, tmp_path):
    nodes = slurm.nodes[-3:-1]
    job_id = _submit_steps_job(slurm, tmp_path, nodes)
    victim = nodes[1]
    echo = NodeEcho(slurm, victim)
    try:
        assert echo.hostname == victim
        assert echo.echo(b"ping", timeout=5) == b"ping"
        out = slurm.fault("power-off", victim)
        assert re.search(r"at=[0-9.]+", out)
        assert slurm.node_power()[victim] == "off"
        # the process still exists (frozen), the connection stays open, and nothing comes back
        assert os.path.exists(f"/proc/{echo.pid}")
        with pytest.raises(TimeoutError):
            echo.echo(b"anyone?", timeout=2.0)
        echo.conn.sendall(b"more")  # no RST: the send is only queued
        t0 = time.monotonic()
        slurm.wait_for(
            lambda: _slurm_lost(slurm, victim),
            timeout=3 * slurm.slurmd_timeout + 10,
            what=f"Slurm to see {victim} NOT_RESPONDING/DOWN",
        )
        assert time.monotonic() - t0 < 3 * slurm.slurmd_timeout + 10
        slurm.wait_for(
            lambda: "down" in slurm.node_states()[victim], timeout=4 * slurm.slurmd_timeout + 10, what=f"{victim} DOWN"
        )
        state, job_nodes = _job(slurm, job_id)
        assert state == "RUNNING" and victim not in job_nodes and nodes[0] in job_nodes
        slurm.fault("power-on", victim)
        assert slurm.node_power()[victim] == "on"
        assert echo.proc.wait(timeout=10) == -9  # the old boot's processes are gone (our own child)
        # the rebooted node has a fresh kernel: the old connection is reset, not answered
        with pytest.raises((ConnectionResetError, BrokenPipeError)):
            deadline = time.monotonic() + 60  # until TCP's next retransmission reaches the new kernel
            while time.monotonic() < deadline:
                try:
                    echo.echo(b"hello again", timeout=1.0)
                except TimeoutError:
                    continue
        slurm.wait_for(lambda: slurm.node_states()[victim] == "idle", timeout=30, what=f"{victim} idle")
    finally:
        echo.close()
        slurm.run("scancel", job_id, check=False)


def test_partition_keeps_processes_running_and_heal_restores_traffic(slurm):
    victim = slurm.nodes[-1]
    echo = NodeEcho(slurm, victim)
    try:
        assert echo.echo(b"a", timeout=5) == b"a"
        slurm.fault("partition", victim)
        assert slurm.node_power()[victim] == "partitioned"
        with pytest.raises(TimeoutError):
            echo.echo(b"b", timeout=1.5)
        state = open(f"/proc/{echo.pid}/stat").read().split(") ")[1].split()[0]
        assert state in ("S", "R")  # alive and not frozen
        slurm.fault("heal", victim)
        # TCP retransmits what was queued: the echo of b"b" arrives once the link is back
        assert echo.echo(b"c", timeout=30).startswith(b"b")
    finally:
        echo.close()


def test_kill_node_closes_connections_at_once(slurm):
    victim = slurm.nodes[-1]
    echo = NodeEcho(slurm, victim)
    try:
        assert echo.echo(b"x", timeout=5) == b"x"
        slurm.fault("kill-node", victim)
        echo.conn.settimeout(5)
        t0 = time.monotonic()
        try:
            got = echo.conn.recv(10)
        except ConnectionResetError:
            got = b""
        assert got == b"" and time.monotonic() - t0 < 1.0
        assert slurm.slurmd_running()[victim] is False
    finally:
        echo.close()


def test_scontrol_reboot_restarts_slurmd_on_the_node(slurm):
    """RebootProgram (run by slurmd, on the node) leaves the node's cgroup, kills the node's
    processes and starts a new slurmd in the node's namespaces."""
    victim = slurm.nodes[-1]
    pidfile = slurm.state_dir / "run" / f"slurmd-{victim}.pid"
    before = pidfile.read_text().strip()
    slurm.run("scontrol", "reboot", "nextstate=resume", "reason=lab-test", victim)
    slurm.wait_for(
        lambda: pidfile.read_text().strip() != before and slurm.node_states()[victim] == "idle",
        timeout=40,
        what=f"{victim} rebooted and idle",
    )
    out = slurm.run("srun", "-N1", "-w", victim, "sh", "-c", "hostname; ip -4 -o addr show eth0", timeout=60).stdout
    assert out.splitlines()[0] == victim and slurm.node_addr(victim) in out


SINK = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 0)); s.listen(4)
print(s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept()
    while c.recv(1 << 20):
        pass
    c.close()
"""
SEND = r"""
import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2]))); buf = b"x" * (1 << 16); n = 0; t = time.time()
while time.time() - t < 2.0:
    c.sendall(buf); n += len(buf)
c.close(); print(n / (time.time() - t) / 1e6)
"""
BUSY = r"""
import time
t, c = time.time(), time.process_time()
while time.time() - t < 2.0:
    pass
print((time.process_time() - c) / (time.time() - t))
"""


def _on_node(slurm, node: str, code: str, *args: str) -> float:
    return float(slurm.local_slurm("exec", node, "python3", "-c", code, *args).stdout.split()[-1])


def test_correlated_power_off_then_up_and_the_slow_faults(slurm):
    """Several nodes power off at one instant; ``up`` on such a lab powers them on (no half state:
    frozen with the link up); ``throttle`` caps a node's CPU and ``slowlink`` its link, each undone."""
    a, b = slurm.nodes[-2:]
    out = slurm.local_slurm("power-off", a, b).stdout
    moments = set(re.findall(r"at=([0-9.]+)", out))
    assert len(moments) == 1 and f"{a}: powered off" in out and f"{b}: powered off" in out, out
    power = slurm.node_power()
    assert power[a] == power[b] == "off"
    out = slurm.local_slurm("up").stdout + slurm.local_slurm("up").stderr
    assert f"{a}: powered on" in out and f"{b}: powered on" in out, out
    assert slurm.node_power()[a] == slurm.node_power()[b] == "on"
    assert all(slurm.slurmd_running()[n] for n in (a, b))
    assert all(s in ("idle", "mixed") for n, s in slurm.node_states().items() if n in (a, b))

    # throttle: a busy loop on the node gets at most its quota of one CPU
    assert "throttled to 30%" in slurm.local_slurm("throttle", a, "30").stdout
    assert slurm.node_slowness()[a] == ("30", "full")
    assert _on_node(slurm, a, BUSY) < 0.36
    slurm.local_slurm("throttle", a, "off")
    assert slurm.node_slowness()[a] == ("full", "full")
    bad = slurm.local_slurm("throttle", a, "0", check=False)
    assert bad.returncode != 0 and "PCT must be 1..1000" in bad.stderr

    # slowlink: what the node sends passes at the rate (20mbit = 2.5 MB/s), then at full speed again
    host = slurm.node_addr(a).rsplit(".", 1)[0] + ".1"  # the lab bridge: the host's address in the lab
    sink = subprocess.Popen([sys.executable, "-c", SINK, host], stdout=subprocess.PIPE, text=True)
    try:
        port = sink.stdout.readline().strip()
        slurm.local_slurm("slowlink", a, "20mbit")
        assert slurm.node_slowness()[a] == ("full", "20mbit")
        assert _on_node(slurm, a, SEND, host, port) < 4.0
        slurm.local_slurm("slowlink", a, "off")
        assert _on_node(slurm, a, SEND, host, port) > 20.0
    finally:
        sink.kill()
        sink.wait(timeout=10)
