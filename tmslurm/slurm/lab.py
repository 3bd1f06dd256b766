"""Faults of the failure lab (``scripts/local-slurm``), injected from a run: power-off, partition,
throttle and slowlink.

Contract: :func:`inject_lab_fault` runs ``<lab command> power-off|partition|throttle|slowlink
NODE... [AMOUNT]`` in a daemon thread and returns at once; several nodes are hit by one command,
at the same instant. The command prints ``at=<epoch seconds>``, the moment the nodes froze, lost
their links or slowed down; ``fired(t, nodes)`` is called with it, so that detection is measured
from the fault and not from when the command returned. The batch host may be the victim: the command leaves
the node's cgroup before it freezes the node, and the calling process (the controller) then freezes
with the node, as it would with a real power loss. The lab command is ``slurm.lab_command``, else
this checkout's ``scripts/local-slurm``.

Failure behaviour: a missing lab, a failing command or an output without ``at=`` is logged and
``fired`` is not called (the run then sees whatever did happen to the node); nothing is raised.
"""

from __future__ import annotations

import logging
import re
import shlex
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from tmslurm.core.config import RunConfig
from tmslurm.core.errors import SlurmError

log = logging.getLogger(__name__)

LAB_FAULTS = {"power_off": "power-off", "partition": "partition", "throttle": "throttle", "slowlink": "slowlink"}
_AT = re.compile(r"\bat=([0-9]+(?:\.[0-9]+)?)")


def lab_command(cfg: RunConfig) -> list[str]:
    """The failure lab's command line (``slurm.lab_command``, else scripts/local-slurm here)."""
    if cfg.slurm.lab_command:
        return shlex.split(cfg.slurm.lab_command)
    script = Path(__file__).resolve().parents[2] / "scripts" / "local-slurm"
    if not script.exists():
        raise SlurmError(f"no failure lab here ({script} is missing). Fix: set slurm.lab_command")
    return [str(script)]


def fault_moment(stdout: str) -> float | None:
    """The ``at=<epoch>`` the lab command printed, or None."""
    m = _AT.search(stdout)
    return float(m.group(1)) if m else None


def lab_fault_argv(kind: str, nodes: list[str], amount: str) -> list[str]:
    """The lab command's arguments for one fault on ``nodes`` (throttle and slowlink end with the amount)."""
    return [LAB_FAULTS[kind], *nodes, *([amount] if amount else [])]


def inject_lab_fault(
    cfg: RunConfig, kind: str, nodes: list[str], amount: str, fired: Callable[[float, list[str]], None]
) -> None:
    threading.Thread(target=_run, args=(cfg, kind, nodes, amount, fired), name=f"lab-{kind}", daemon=True).start()


def _run(cfg: RunConfig, kind: str, nodes: list[str], amount: str, fired: Callable[[float, list[str]], None]) -> None:
    node = ",".join(nodes)
    try:
        cmd = [*lab_command(cfg), *lab_fault_argv(kind, nodes, amount)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, start_new_session=True)
    except (SlurmError, OSError, subprocess.TimeoutExpired) as exc:
        log.error("cannot inject %s on %s: %s", kind, node, exc)
        return
    t = fault_moment(r.stdout)
    if r.returncode != 0 or t is None:
        log.error("%s failed (rc %d): %s", " ".join(cmd), r.returncode, (r.stderr or r.stdout).strip()[-500:])
        return
    log.info("lab fault %s on %s at %.3f", kind, node, t)
    fired(t, nodes)
