"""An agent process: one training rank (worker) or one standby, connected to the run's controller.

Contract: ``python -m tmslurm.agent.main --run-dir D (--rank R | --standby N | --monitor) [--node NAME]``
connects to the controller named in ``D/controller.json``, authenticates with ``D/token``, receives
its assignment (the run config, the generation of each group, the step to start at) and then runs
as a :class:`~tmslurm.agent.worker.Worker`, a :class:`~tmslurm.agent.standby.Standby` or the
node's :class:`~tmslurm.agent.monitor.Monitor` (which imports no torch).
Its code (torch, for a worker or standby) is imported before the hello, so the heartbeat thread
that starts with the hello is never held up by an import. A heartbeat thread reports liveness; a reader thread queues
controller messages and raises the abort flag the moment an ``abort`` arrives, so a rank blocked in a collective stops
waiting. If the controller goes away the agent exits (status 3): a rank never trains on without it. SIGUSR1 (Slurm's
notice that the main job's time limit is near) is ignored: the controller acts on it; so is SIGTERM by a rank in a Slurm
job (a preemption's grace time is for the controller's checkpoint). The process ends with :func:`exit_now` (logs and
standard streams flushed, then ``os._exit``), not through interpreter finalization: a daemon thread still blocked in a
c10d ``Work.wait`` (a collective abandoned when its peer's node went silent) would otherwise be ended by CPython with
``pthread_exit`` while it re-takes the GIL, and the forced unwind through pybind11's frame calls ``std::terminate``
(SIGABRT and a core file at every such exit).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path

from tmslurm.agent.link import hello, node_name
from tmslurm.core.config import from_dict
from tmslurm.core.errors import TmslurmError
from tmslurm.core.logs import LOG_CONTEXT, setup_logging
from tmslurm.wire.messages import AgentKind

__all__ = ["exit_now", "main", "setup_logging"]

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    # Slurm sends SIGUSR1 to every step's processes when the main job's time limit is near
    # (slurm.signal_lead_s); the controller acts on it, a rank carries on until told. SIGUSR2 is
    # submitit's timeout signal to a spare job (90 s before its limit): the controller renews spares
    # before that (slurm.spare_renew_s), and a spare it could not renew lives to its real limit.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    ap = argparse.ArgumentParser(prog="tmslurm-agent")
    ap.add_argument("--run-dir", required=True, type=Path)
    who = ap.add_mutually_exclusive_group(required=True)
    who.add_argument("--rank", type=int)
    who.add_argument("--standby", type=int)
    who.add_argument("--monitor", action="store_true")
    ap.add_argument("--node", default=None)
    args = ap.parse_args(argv)
    if args.rank is not None and os.environ.get("SLURM_JOB_ID"):
        # A preemption or scancel sends SIGTERM to every process of the job, then SIGKILL after the
        # grace time: a rank trains on until the controller's checkpoint decision (it is fenced
        # with SIGKILL, never SIGTERM).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    setup_logging()
    LOG_CONTEXT["run"] = args.run_dir.name
    kind: AgentKind
    if args.monitor:
        kind, ident = "monitor", 0
    else:
        kind, ident = ("worker", args.rank) if args.rank is not None else ("standby", args.standby)
    LOG_CONTEXT["who"] = {"worker": f"rank{ident}", "standby": f"standby{ident}", "monitor": "monitor"}[kind]
    # Imported before the hello: a worker's or standby's import (torch) takes seconds and holds the GIL
    # through whole C-extension loads. Started after the hello, its heartbeat thread could stay silent
    # past detect.heartbeat_timeout_s on a loaded host (a CI run fenced every rank at step 0 that way).
    if kind == "monitor":
        from tmslurm.agent.monitor import run_monitor
    elif kind == "worker":
        from tmslurm.agent.worker import Worker
    else:
        from tmslurm.agent.standby import Standby
    try:
        link, welcome = hello(args.run_dir, kind, ident, node_name(args.node))
        if kind == "monitor":
            cfg = from_dict(welcome.config)
            return run_monitor(args.run_dir, link, node_name(args.node), cfg, welcome.address.host)
        if kind == "worker":
            Worker.from_welcome(args.run_dir, link, welcome, ident).run()
        else:
            Standby(args.run_dir, link, welcome, ident).run()
    except TmslurmError as exc:
        log.error("%s", exc)
        return 2
    return 0


def exit_now(rc: int) -> None:
    """End the process with ``rc`` once logs and standard streams are flushed, skipping
    finalization (see the module's contract). Every thread of an agent is a daemon, and what a rank
    must leave behind (checkpoints, the final shards) is written before its loop returns."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(rc)


if __name__ == "__main__":
    exit_now(main())
