"""Faults of the failure lab (``scripts/local-slurm``), injected from a run: power-off and partition.

Contract: :func:`inject_lab_fault` runs ``<lab command> power-off|partition NODE`` in a daemon
thread and returns at once. The command prints ``at=<epoch seconds>``, the moment the node froze
or lost its link; ``fired(t, node)`` is called with it, so that detection is measured from the
fault and not from when the command returned. The batch host may be the victim: the command leaves
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
from pathlib import Path
from typing import Callable

from tmslurm.config import RunConfig
from tmslurm.errors import SlurmError

log = logging.getLogger(__name__)

LAB_FAULTS = {"power_off": "power-off", "partition": "partition"}
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


def inject_lab_fault(cfg: RunConfig, kind: str, node: str, fired: Callable[[float, str], None]) -> None:
    threading.Thread(target=_run, args=(cfg, kind, node, fired), name=f"lab-{kind}", daemon=True).start()


def _run(cfg: RunConfig, kind: str, node: str, fired: Callable[[float, str], None]) -> None:
    try:
        cmd = [*lab_command(cfg), LAB_FAULTS[kind], node]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, start_new_session=True)
    except (SlurmError, OSError, subprocess.TimeoutExpired) as exc:
        log.error("cannot inject %s on %s: %s", kind, node, exc)
        return
    t = fault_moment(r.stdout)
    if r.returncode != 0 or t is None:
        log.error("%s failed (rc %d): %s", " ".join(cmd), r.returncode, (r.stderr or r.stdout).strip()[-500:])
        return
    log.info("lab fault %s on %s at %.3f", kind, node, t)
    fired(t, node)
