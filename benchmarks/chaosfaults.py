"""The faults of ``bench chaos``: how each kind is caused on the failure lab, and how the admin repairs it.

Contract: :func:`inject` causes one fault of a kind in :data:`KINDS` on the victims it is given and
returns an :class:`Injected` (the fault as the chaos checker reads it, plus the repair the admin owes);
:func:`repair_due` says whether that repair may be done now and :func:`repair` does it. Faults:

- ``sigkill`` / ``sigstop``: the signal to a rank's process (its pid from its agent id, checked on
  ``/proc`` to be an agent of this run: the lab's nodes share this host's pid namespace); no repair
  (the run fences a stopped rank through Slurm, which kills it);
- ``drain``: ``scontrol update state=drain`` of the rank's node (maintenance); resumed once the run
  has an event on the node and serves no rank there, or after :data:`MAINTENANCE_S`;
- ``power_off`` / ``power_off2``: ``local-slurm power-off`` of one node, or of two nodes of different
  pipeline stages at the same instant (a rack); ``partition``: its link cut, processes alive. Powered
  back on (healed) once Slurm flags the node and the run has confirmed it, then resumed;
- ``throttle`` (30 % of one CPU) and ``slowlink`` (20 mbit/s): undone after a drawn duration;
- ``controller_kill``: SIGKILL of the run's controller (``tmslurm.slurm.proc.ctlmain``, checked on
  ``/proc``); its supervisor restarts it;
- ``slurmctld_stop``: ``local-slurm ctld-stop`` (every Slurm command hangs), ``ctld-cont`` after a
  drawn duration. While it lasts the driver runs no Slurm command (:func:`needs_slurm`).

Failure behaviour: a lab or Slurm command that fails, or a pid that is not this run's, raises
:class:`~tmslurm.core.errors.TmslurmError` naming it; nothing is signalled on a failed check.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import local_slurm, resume_node, say, sh
from tmslurm.agent.monitor import is_agent_of
from tmslurm.core.errors import TmslurmError
from tmslurm.slurm.lab import fault_moment

KINDS = (
    "sigkill",
    "sigstop",
    "drain",
    "power_off",
    "power_off2",
    "partition",
    "throttle",
    "slowlink",
    "controller_kill",
    "slurmctld_stop",
)
CHECKER_KIND = {"sigkill": "kill", "sigstop": "stop", "power_off2": "power_off"}
"""The chaos checker's kind of a fault (the others keep their name)."""
NODE_FAULTS = ("drain", "power_off", "power_off2", "partition", "throttle", "slowlink")
"""Kinds that hit a node: never the batch host (its loss is a requeue, measured by bench downtime)."""
MAINTENANCE_S = 240.0
"""A drained node is resumed after this even if the run still holds it."""
THROTTLE_PCT = "30"
SLOWLINK_RATE = "20mbit"


@dataclass(kw_only=True)
class Injected:
    """One injected fault: the checker's view (t, kind, ranks, nodes), its step, and the repair owed."""

    t: float
    kind: str
    ranks: list[int]
    nodes: list[str]
    step: int
    undo_at: float | None = None
    """Monotonic time after which a timed fault (throttle, slowlink, slurmctld outage) is undone."""
    repaired: bool = False
    repaired_t: float | None = None
    notes: list[str] = field(default_factory=list)

    def for_checker(self) -> dict[str, Any]:
        return {"t": self.t, "kind": CHECKER_KIND.get(self.kind, self.kind), "ranks": self.ranks, "nodes": self.nodes}

    def record(self) -> dict[str, Any]:
        return {
            "t": round(self.t, 3),
            "kind": self.kind,
            "ranks": self.ranks,
            "nodes": self.nodes,
            "step": self.step,
            "repaired_after_s": None if self.repaired_t is None else round(self.repaired_t - self.t, 1),
        }


def rank_pid(agent: str) -> int:
    """The pid in an agent id ``<kind><n>.<pid>#<conn>``."""
    return int(agent.rsplit(".", 1)[1].split("#", 1)[0])


def controller_pid(run_dir: Path) -> int | None:
    """The live controller of ``run_dir`` (``controller.json``, checked on its command line), or None."""
    try:
        pid = int(json.loads((run_dir / "controller.json").read_text())["pid"])
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return pid if b"tmslurm.slurm.proc.ctlmain" in argv and str(run_dir).encode() in b" ".join(argv) else None


def _lab(*args: str) -> float:
    out = local_slurm(*args)
    t = fault_moment(out)
    if t is None:
        raise TmslurmError(f"local-slurm {' '.join(args)} printed no at=: {out[-300:]}")
    return t


def inject(kind: str, victims: list[dict[str, Any]], run_dir: Path, step: int, duration_s: float) -> Injected:
    """Cause ``kind`` on ``victims`` (status rank entries: rank, node, agent); see the module docstring."""
    ranks = [int(v["rank"]) for v in victims]
    nodes = [str(v["node"]) for v in victims]
    undo = time.monotonic() + duration_s
    if kind in ("sigkill", "sigstop"):
        pid = rank_pid(victims[0]["agent"])
        if not is_agent_of(pid, run_dir):  # a rank, or a standby that joined as one (the status says it serves)
            raise TmslurmError(f"pid {pid} on {nodes[0]} is not an agent of {run_dir}; not signalled")
        t = time.time()
        os.kill(pid, signal.SIGKILL if kind == "sigkill" else signal.SIGSTOP)
        return Injected(t=t, kind=kind, ranks=ranks, nodes=nodes, step=step, repaired=True)
    if kind == "drain":
        t = time.time()
        sh("scontrol", "update", f"nodename={nodes[0]}", "state=drain", "reason=chaos-maintenance")
        return Injected(t=t, kind=kind, ranks=ranks, nodes=nodes, step=step, undo_at=time.monotonic() + MAINTENANCE_S)
    if kind in ("power_off", "power_off2", "partition"):
        t = _lab("partition" if kind == "partition" else "power-off", *nodes)
        return Injected(t=t, kind=kind, ranks=ranks, nodes=nodes, step=step)
    if kind in ("throttle", "slowlink"):
        t = _lab(kind, *nodes, THROTTLE_PCT if kind == "throttle" else SLOWLINK_RATE)
        return Injected(t=t, kind=kind, ranks=ranks, nodes=nodes, step=step, undo_at=undo)
    if kind == "controller_kill":
        ctl_pid = controller_pid(run_dir)
        if ctl_pid is None:
            raise TmslurmError(f"no live controller of {run_dir} on this host; not signalled")
        t = time.time()
        os.kill(ctl_pid, signal.SIGKILL)
        return Injected(t=t, kind=kind, ranks=[], nodes=["controller"], step=step, repaired=True)
    if kind == "slurmctld_stop":
        t = _lab("ctld-stop")
        return Injected(t=t, kind=kind, ranks=[], nodes=["slurmctld"], step=step, undo_at=undo)
    raise TmslurmError(f"unknown chaos fault kind {kind!r}; valid: {', '.join(KINDS)}")


def needs_slurm(f: Injected) -> bool:
    """Whether ``f`` is a slurmctld outage still in force (no Slurm command may run meanwhile)."""
    return f.kind == "slurmctld_stop" and not f.repaired


def _flagged(node: str) -> bool:
    state = sh("sinfo", "-h", "-n", node, "-o", "%T", check=False, timeout=30).lower()
    return any(x in state for x in ("*", "down", "not_responding"))


def _unconfirmed(run_dir: Path) -> list[str]:
    try:
        return list(json.loads((run_dir / "spawner.json").read_text()).get("unconfirmed", []))
    except (OSError, ValueError):
        return []


def moved_off(f: Injected, st: dict[str, Any]) -> bool:
    """The run answered, has an event on the fault's node since the fault, and serves no rank there."""
    serving = {r.get("node") for r in st.get("ranks", [])}
    seen = any(
        set(str(e.get("node") or "").split(",")) & set(f.nodes) and (e.get("notice_t") or 0) >= f.t - 1
        for e in st.get("events", [])
    )
    return bool(st) and seen and not (set(f.nodes) & serving)


def repair_due(f: Injected, run_dir: Path, st: dict[str, Any], force: bool = False) -> bool:
    """Whether the admin may repair ``f`` now, given the run's status ``st`` (``force``: the soak is
    over, undo timed faults and end maintenance at once)."""
    if f.repaired:
        return False
    if f.kind in ("throttle", "slowlink", "slurmctld_stop"):
        return force or time.monotonic() >= (f.undo_at or 0.0)
    if f.kind == "drain":
        return force or moved_off(f, st) or time.monotonic() >= (f.undo_at or 0.0)
    # power-off, partition: once Slurm flagged every node and the run has confirmed them
    return all(_flagged(n) for n in f.nodes) and not (set(f.nodes) & set(_unconfirmed(run_dir)))


def repair(f: Injected) -> None:
    """Undo ``f`` as an admin would; marks it repaired."""
    if f.kind in ("throttle", "slowlink"):
        local_slurm(f.kind, *f.nodes, "off")
    elif f.kind == "slurmctld_stop":
        local_slurm("ctld-cont")
    elif f.kind in ("power_off", "power_off2"):
        local_slurm("power-on", *f.nodes)
    elif f.kind == "partition":
        local_slurm("heal", *f.nodes)
    if f.kind in ("drain", "power_off", "power_off2", "partition"):
        for n in f.nodes:
            resume_node(n)
    f.repaired, f.repaired_t = True, time.time()
    say(f"repaired {f.kind} on {','.join(f.nodes) or '-'} ({f.repaired_t - f.t:.1f}s after the fault)")
