"""The controller process of ``bench control``: the real controller, with a spawner that starts nothing.

Contract: ``python -m benchmarks.ctlhost --run-dir D [OVERRIDE ...]`` composes the run config
from the Hydra overrides, prepares ``D`` (config, token), opens the real
:class:`~tmslurm.controller.server.ControlServer` on loopback, writes ``D/controller.json`` and runs
the real :class:`~tmslurm.controller.loop.Controller` loop until the run finished. Its agents are
not started by it: :class:`NullSpawner` only records what it was asked (the load generator's
simulated agents connect by themselves and say hello with the ids the controller expects), and its
``fence`` has no process to kill (the controller still closes the fenced agent's connection).
The soft open-files limit is raised to the hard one (one socket per agent). Exit status 0 when the
run ended with a final hash, 1 otherwise, 2 on a configuration error.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import sys
from pathlib import Path

from tmslurm.core.errors import TmslurmError

log = logging.getLogger(__name__)


class NullSpawner:
    """Starts nothing: the agents of this run connect by themselves (see :mod:`benchmarks.loadgen`)."""

    def __init__(self, ranks_per_node: int) -> None:
        self.ranks_per_node = ranks_per_node
        self.workers: list[tuple[int, int]] = []
        self.standbys: list[int] = []
        self.fenced: list[tuple[str, int]] = []

    def spawn_worker(self, rank: int, incarnation: int) -> bool:
        self.workers.append((rank, incarnation))
        return True

    def spawn_standby(self, index: int) -> None:
        self.standbys.append(index)

    def fence(self, kind: str, ident: int) -> None:
        self.fenced.append((kind, ident))
        log.info("fence %s %d: no process of ours (simulated agent)", kind, ident)

    def stop_all(self, grace_s: float = 0.0) -> None:
        return None

    def pending_standbys(self) -> list[int]:
        return []

    def take_lost_standbys(self) -> list[int]:
        return []

    def node_of_rank(self, rank: int) -> str:
        return f"sim{rank // self.ranks_per_node}"


def raise_open_files() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def main(argv: list[str] | None = None) -> int:
    from tmslurm.controller import Controller, ControlServer, LocalHooks
    from tmslurm.core.config import compose_config
    from tmslurm.core.logs import setup_logging
    from tmslurm.core.rundir import RunDir
    from tmslurm.run.prepare import prepare_run_dir
    from tmslurm.wire.protocol import write_token

    ap = argparse.ArgumentParser(prog="python -m benchmarks.ctlhost")
    ap.add_argument("--run-dir", required=True, type=Path)
    args, overrides = ap.parse_known_args(argv)
    setup_logging()
    nofile = raise_open_files()
    try:
        cfg = compose_config([*overrides, "cluster=local", f"run_dir={args.run_dir}"])
        run_dir = prepare_run_dir(cfg)
    except TmslurmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    token = write_token(run_dir)
    server = ControlServer.open("127.0.0.1")
    ctl = Controller(cfg, run_dir, NullSpawner(cfg.parallel.ranks_per_node), LocalHooks(), server.address)
    RunDir(run_dir).controller.write_text(json.dumps(server.address))
    log.info("bench controller: %d ranks, open files limit %d", ctl.ctx.layout.world, nofile)
    summary = ctl.run(server, token)
    return 0 if summary.get("final_params_sha256") else 1


if __name__ == "__main__":
    sys.exit(main())
