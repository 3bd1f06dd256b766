"""The failure lab's fault injector (tmslurm.slurm.lab), with a stand-in lab command (no cluster)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tmslurm.core.config import compose_config
from tmslurm.slurm import lab

ECHO_AT = "sh -c 'echo \"local-slurm: $1: $0 at=1796231954.25 in 0.0 s\"'"


def _cfg(command: str = ""):
    return compose_config(["cluster=slurm", f"slurm.lab_command={command!r}" if command else "slurm.lab_command=''"])


@pytest.mark.parametrize(
    "stdout, moment",
    [
        ("local-slurm: node2: powered off at=1796231954.731 in 0.0 s", 1796231954.731),
        ("local-slurm: node2: partitioned at=17 (link down)", 17.0),
        ("local-slurm: node2: powered off", None),
        ("at=", None),
    ],
)
def test_fault_moment_is_read_from_the_lab_output(stdout, moment):
    assert lab.fault_moment(stdout) == moment


def test_default_command_is_this_checkouts_local_slurm():
    (cmd,) = lab.lab_command(_cfg())
    assert Path(cmd).name == "local-slurm" and Path(cmd).is_file()


def test_fired_gets_the_moment_and_nodes_from_a_background_thread():
    got: list[tuple[float, list[str], str]] = []
    done = threading.Event()

    def fired(t: float, nodes: list[str]) -> None:
        got.append((t, nodes, threading.current_thread().name))
        done.set()

    lab.inject_lab_fault(_cfg(ECHO_AT), "power_off", ["node3", "node5"], "", fired)
    assert done.wait(30)
    assert got == [(1796231954.25, ["node3", "node5"], "lab-power_off")]


@pytest.mark.parametrize(
    "kind, nodes, amount, argv",
    [
        ("power_off", ["node2"], "", ["power-off", "node2"]),
        ("partition", ["node2", "node4"], "", ["partition", "node2", "node4"]),
        ("throttle", ["node3"], "30", ["throttle", "node3", "30"]),
        ("slowlink", ["node1", "node3"], "20mbit", ["slowlink", "node1", "node3", "20mbit"]),
    ],
)
def test_one_command_for_every_node_of_a_fault(kind, nodes, amount, argv):
    assert lab.lab_fault_argv(kind, nodes, amount) == argv


def test_the_lab_command_gets_every_node_and_the_amount(tmp_path):
    out = tmp_path / "argv"
    got: list[tuple[float, list[str]]] = []
    lab._run(
        _cfg(f"sh -c 'echo \"$@\" > {out}; echo at=3.5' lab"),
        "throttle",
        ["node2", "node6"],
        "40",
        lambda t, nodes: got.append((t, nodes)),
    )
    assert out.read_text().split() == ["throttle", "node2", "node6", "40"]
    assert got == [(3.5, ["node2", "node6"])]


@pytest.mark.parametrize(
    "command", ["sh -c 'echo no moment here'", "sh -c 'echo at=5; exit 3'", "/nonexistent/lab-cmd"]
)
def test_a_failing_lab_command_fires_nothing(command):
    got: list[float] = []
    lab._run(_cfg(command), "partition", ["node2"], "", lambda t, nodes: got.append(t))  # the thread's body, run here
    assert got == []
