"""What a restarted controller takes back from the incarnation that died, before it adopts anybody.

Contract (at start-up, on the controller's thread, before the loop):
- :class:`AdoptOrder` is what the supervisor wrote in ``adopt.json``: the incarnation number, when
  the previous one died, and the (kind, ident) of every worker and standby process still running
  (other kinds are dropped). :meth:`AdoptOrder.parse` raises what ``json`` and ``int``/``float``
  raise on a file that is not one.
- :func:`restore` takes back what the dead incarnation had committed: the step log
  (``steps.jsonl``), the completed events (``event`` journal lines), the fired faults, the standbys
  started, the incarnation and the highest epoch ever handed out (the snapshot, and the journal for
  what came after it), and puts the run in :data:`Mode.ADOPTING`, expecting a hello from the listed
  processes but those its journal found lost (``adopting`` in the journal). A missing snapshot or
  journal counts as empty.
- Once adopted: :func:`complete_log` gives each step the dead controller decided but had no time to
  log an entry (``restored``, timed at the death, its losses gone), and :func:`open_restart_event`
  opens the ``controller_restart`` event whose parts (before the death, the restart, the adoption)
  add up to the gap.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from tmslurm.controller.context import Context
from tmslurm.controller.journal import journalled, read_journal
from tmslurm.controller.snapshot import read_snapshot, read_steps
from tmslurm.controller.state import Mode, found_gone
from tmslurm.wire.messages import Decision, Vote

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdoptOrder:
    """What the supervisor tells a restarted controller (``adopt.json``)."""

    incarnation: int
    died_t: float
    alive: list[tuple[str, int]]

    @classmethod
    def parse(cls, text: str) -> AdoptOrder:
        data = json.loads(text)
        alive = [(str(k), int(i)) for k, i in data["alive"] if k in ("worker", "standby")]
        return cls(int(data["incarnation"]), float(data["died_t"]), alive)


def restore(ctx: Context, order: AdoptOrder) -> None:
    """Take back what the dead incarnation committed and start adopting (see the module docstring)."""
    st, rd = ctx.state, ctx.rundir
    snap = read_snapshot(rd.snapshot) or {}
    journal = read_journal(rd.events)
    st.step_log = read_steps(rd.steps)
    st.step = st.step_log[-1]["step"] + 1 if st.step_log else st.start_step
    st.fired = set(snap.get("fired", [])) | set(journalled(journal, ("fault", "fault_firing"), "index"))
    st.standbys_started = max(
        int(snap.get("standbys_started", 0)), 1 + max((i for k, i in order.alive if k == "standby"), default=-1)
    )
    st.epochs = max([int(snap.get("epochs", 0)), int(snap.get("epoch", 0)), *journalled(journal, None, "epoch")])
    st.epoch = int(snap.get("epoch", 0))
    st.incarnation = max([int(snap.get("incarnation", 0)), *journalled(journal, ("restart",), "incarnation")])
    st.expected = set(order.alive) - found_gone(journal)  # not waited for: found lost already
    st.mode = Mode.ADOPTING
    ctx.events.restore(journal, st.step_log[-1]["t_end"] if st.step_log else None)
    ctx.journal.write(
        "adopting", incarnation=order.incarnation, step=st.step, expected=[f"{k}{i}" for k, i in sorted(st.expected)]
    )
    log.warning(
        "controller incarnation %d: adopting %d live processes at step %d", order.incarnation, len(st.expected), st.step
    )


def complete_log(ctx: Context, order: AdoptOrder, lead: Decision | None, votes: list[Vote]) -> None:
    """A decided step the dead controller had no time to log gets an entry (its losses are gone), up to
    ``lead``'s step; its time is the slowest of the rejoined ranks' ``votes`` for it."""
    st = ctx.state
    if lead is None:
        return
    logged = st.step_log[-1]["step"] if st.step_log else st.start_step - 1
    for step in range(logged + 1, lead.step + 1):
        st.step_log.append(
            {
                "step": step,
                "t_end": order.died_t,
                "dt": max((v.dt for v in votes if v.step == step), default=0.0),
                "loss": None,
                "epoch": lead.epoch,
                "restored": True,
            }
        )


def open_restart_event(ctx: Context, order: AdoptOrder, up_t: float, now: float) -> None:
    """Open the ``controller_restart`` event: the gap from the last commit to the death, the restart
    (death to this incarnation's start ``up_t``) and the adoption (to ``now``)."""
    st = ctx.state
    last_t = st.step_log[-1]["t_end"] if st.step_log else None
    died = order.died_t
    ctx.events.open_record(
        {
            "kind": "controller_restart",
            "cause": "the controller process died",
            "epoch": st.epoch,
            "ranks": [],
            "node": "",
            "standby": "",
            "notice_t": died,
            "last_commit_t": last_t,
            "status": "switched",
            "switched_t": now,
            "target_step": st.step,
            "incarnation": order.incarnation,
            "before_death_s": None if last_t is None else max(0.0, died - last_t),
            "restart_s": max(0.0, up_t - died),
            "adopt_s": max(0.0, now - up_t),
        }
    )
