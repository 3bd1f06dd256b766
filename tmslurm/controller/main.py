"""The controller as its own process, run (and restarted) by a supervisor (:mod:`tmslurm.run.supervisor`).

Contract: ``python -m tmslurm.controller.main --run-dir D --host H --listen-fd N --store-port P
--spawn-fd M [--adopt]`` (cluster=local) reads the run's ``config.json`` and ``token``, serves on the listening
socket the supervisor passed (fd ``N``; the rendezvous store on port ``P`` is the supervisor's
too), asks the supervisor for every process start and fence through the pipe ``M``
(:class:`~tmslurm.controller.spawnpipe.PipeSpawner`), and with ``--adopt`` re-adopts the live agents
named in ``adopt.json`` instead of spawning. Exit status: :data:`FINISHED` (0) when the run
finished with its final hash, :data:`FINISHED_FAILED` when it ended without one (summary written,
its ``failed`` field says why), 2 for a bad run directory or a supervisor already gone. It is
SIGKILLed when its supervisor dies (``PR_SET_PDEATHSIG``). Anything else (a signal, a crash) means
the controller died and the supervisor may restart it. :func:`begin`, :func:`build` and
:func:`finish` are shared with the Slurm controller (:mod:`tmslurm.slurm.proc.ctlmain`), which has no
spawn pipe: its processes are Slurm steps and jobs that it launches and fences itself.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from tmslurm.controller.adoption import AdoptOrder
from tmslurm.controller.hooks import ClusterHooks, LocalHooks
from tmslurm.controller.loop import Controller
from tmslurm.controller.server import ControlServer
from tmslurm.controller.spawner import Spawner
from tmslurm.controller.spawnpipe import PipeSpawner
from tmslurm.core.config import RunConfig, from_dict
from tmslurm.core.errors import TmslurmError
from tmslurm.core.logs import LOG_CONTEXT, setup_logging
from tmslurm.core.rundir import RunDir
from tmslurm.wire.protocol import read_token

log = logging.getLogger(__name__)
FINISHED = 0
FINISHED_FAILED = 10
"""The run ended (summary written) without a final hash: not a crash, never restarted."""
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Start:
    """What every controller child reads before it serves."""

    args: argparse.Namespace
    rundir: RunDir
    cfg: RunConfig
    token: str
    order: AdoptOrder | None


def begin(argv: list[str] | None, *, spawn_fd: bool, flags: tuple[str, ...] = ()) -> Start | None:
    """Parse the arguments (``flags``: extra on/off options), tie this process to its supervisor and
    read the run; None (logged) when it must not start (status 2)."""
    ap = argparse.ArgumentParser(prog="tmslurm-controller")
    ap.add_argument("--run-dir", required=True, type=Path)
    ap.add_argument("--host", required=True)
    ap.add_argument("--listen-fd", required=True, type=int)
    ap.add_argument("--store-port", required=True, type=int)
    if spawn_fd:
        ap.add_argument("--spawn-fd", required=True, type=int)
    for flag in ("--adopt", *flags):
        ap.add_argument(flag, action="store_true")
    args = ap.parse_args(argv)
    setup_logging()
    if not _die_with_parent():
        log.error("the supervisor is gone: not starting")
        return None
    rd = RunDir(args.run_dir)
    LOG_CONTEXT.update(run=rd.name, who="controller")
    try:
        cfg = from_dict(json.loads(rd.config.read_text()))
        token = read_token(rd.path)
        order = AdoptOrder.parse(rd.adopt.read_text()) if args.adopt else None
    except (OSError, ValueError, KeyError, TypeError, TmslurmError) as exc:
        log.error("cannot start the controller of %s: %s", rd.path, exc)
        return None
    return Start(args, rd, cfg, token, order)


def build(start: Start, spawner: Spawner, hooks: ClusterHooks) -> tuple[Controller, ControlServer]:
    """The controller on the supervisor's listening socket and store."""
    server = ControlServer.inherit(start.args.host, start.args.listen_fd, start.args.store_port)
    return Controller(start.cfg, start.rundir.path, spawner, hooks, server.address, adopt=start.order), server


def finish(ctl: Controller, server: ControlServer, token: str) -> int:
    """Run the controller to the end; the exit status for the supervisor."""
    LOG_CONTEXT["step"] = lambda: ctl.state.step  # its lines carry the run's step
    summary = ctl.run(server, token)
    return FINISHED if summary.get("final_params_sha256") else FINISHED_FAILED


def main(argv: list[str] | None = None) -> int:
    start = begin(argv, spawn_fd=True)
    if start is None:
        return 2
    ctl, server = build(start, PipeSpawner(start.args.spawn_fd, start.cfg), LocalHooks())
    return finish(ctl, server, start.token)


def _die_with_parent() -> bool:
    """SIGKILL this controller when its supervisor dies (PR_SET_PDEATHSIG): a supervisor killed with
    it leaves no controller behind, and the agents, finding nobody at the address, exit. False when
    the supervisor is already gone."""
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        log.warning(
            "prctl(PR_SET_PDEATHSIG) failed (errno %d): this controller may outlive its supervisor", ctypes.get_errno()
        )
    return os.getppid() == parent != 1


if __name__ == "__main__":
    sys.exit(main())
