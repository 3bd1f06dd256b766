"""The supervisor: owns what must outlive a controller, and restarts a controller that died.

Contract: :class:`Supervisor` holds the listening control socket and the rendezvous store (a
restarted controller listens at the same address, and the groups keep their store) and an
:class:`Owner` of the run's processes. It runs the controller as a child process and advertises
it in ``controller.json`` (address, the controller's ``pid``, its incarnation, whether agents
connect through their node's relay (``runtime.relay``) and ``advert``, replaced atomically).

- ``cluster=local`` (:mod:`tmslurm.controller.main`): the owner is the
  :class:`~tmslurm.controller.spawner.LocalSpawner` whose children every agent and monitor is, so
  fencing stays by the handle of the process that started it, whichever controller asks; the
  controller's spawn requests come through a pipe (:mod:`tmslurm.controller.spawnpipe`).
- ``cluster=slurm`` (:mod:`tmslurm.slurm.proc.ctlmain`, in the main job's batch step): the processes
  are Slurm steps and spare jobs, which outlive the controller; the controller launches and fences
  them itself and records them in ``spawner.json``; the owner
  (:class:`~tmslurm.slurm.spawnstate.SlurmOwner`) only says which still run, and cancels the spare
  jobs when no controller is left.

- The controller exits with a finished status (0, or 10 without a final hash) or a start error
  (2): :meth:`Supervisor.run` stops every process and returns that status.
- It dies otherwise (a signal such as ``kill -9``, a crash): ``controller_died`` is journalled and,
  while ``runtime.controller_restarts`` allows, ``adopt.json`` is written (incarnation, time of
  death, the workers and standbys still alive: a standby may serve a rank, one that does not is
  adopted warm, and with none alive the successor restarts every rank from the checkpoint) and a
  new controller starts at once with ``--adopt`` (:mod:`tmslurm.controller.adoption`). Otherwise
  every process is stopped and the status returned.

It never signals anything but its own children. :meth:`Supervisor.forward` passes a signal on to
the running controller (on Slurm: SIGUSR1, the time limit near, sent to the batch shell only).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tmslurm.controller.journal import Journal
from tmslurm.controller.spawnpipe import serve
from tmslurm.core.config import RunConfig
from tmslurm.core.jsonfile import write_json_atomic
from tmslurm.core.logs import LOG_CONTEXT
from tmslurm.core.rundir import RunDir

log = logging.getLogger(__name__)
ENDED = (0, 10, 2)
"""Controller exit statuses that end the run (see :mod:`tmslurm.controller.main`)."""


class Owner(Protocol):
    """Who holds the run's processes for the supervisor."""

    def alive(self) -> list[tuple[str, int]]:
        """(kind, ident) of every worker and standby still running."""
        ...

    def stop_all(self, grace_s: float = 0.0) -> None: ...


@dataclass(frozen=True)
class Child:
    """How to run the controller child."""

    module: str = "tmslurm.controller.main"
    pipe: bool = True
    """Serve its spawn requests on the owner (a :class:`~tmslurm.controller.spawner.Spawner`) through a pipe."""
    args: tuple[str, ...] = ()
    advert: dict[str, Any] = field(default_factory=dict)
    """Extra fields of ``controller.json`` (on Slurm: ``main_job_id``)."""


class Supervisor:
    def __init__(
        self,
        cfg: RunConfig,
        run_dir: Path,
        owner: Owner,
        listener: socket.socket,
        store: Any,
        host: str,
        child: Child = Child(),
    ) -> None:
        self.cfg = cfg
        self.rundir = RunDir(Path(run_dir))
        self.owner = owner
        self.listener = listener
        self.store = store
        self.host = host
        self.child = child
        self.journal = Journal(self.rundir.events)
        self.proc: subprocess.Popen | None = None
        """The controller process this supervisor started last."""

    def forward(self, signum: int) -> None:
        """Pass a signal on to the controller (from a signal handler, on this main thread: Slurm
        signalled only the batch shell, which is this process). Only ever the child started here:
        ``send_signal`` does nothing once it was reaped, and only this thread reaps it."""
        if self.proc is None:
            log.warning("signal %s arrived before any controller: not passed on", signal.Signals(signum).name)
            return
        self.proc.send_signal(signum)

    def run(self) -> int:
        """Run controllers until one ends the run; the last controller's exit status."""
        log_as_supervisor(self.rundir)
        incarnation = 0
        try:
            while True:
                rc = self._run_controller(incarnation)
                if rc in ENDED or not self._restart(incarnation, rc):
                    return rc
                incarnation += 1
        finally:
            self.owner.stop_all()
            self.listener.close()

    def _run_controller(self, incarnation: int) -> int:
        lfd = self.listener.fileno()
        cmd = [
            sys.executable,
            "-m",
            self.child.module,
            "--run-dir",
            str(self.rundir.path),
            "--host",
            self.host,
            "--listen-fd",
            str(lfd),
            "--store-port",
            str(self.store.port),
            *self.child.args,
        ]
        cmd += ["--adopt"] if incarnation else []
        if not self.child.pipe:
            proc = self.proc = subprocess.Popen(cmd, pass_fds=(lfd,))
            self._advertise(proc.pid, incarnation)
            return proc.wait()
        rfd, wfd = os.pipe()
        proc = self.proc = subprocess.Popen(cmd + ["--spawn-fd", str(wfd)], pass_fds=(lfd, wfd))
        os.close(wfd)  # the pipe ends (EOF) when the controller does
        reader = threading.Thread(target=serve, args=(rfd, self.owner), name="spawn-requests", daemon=True)
        reader.start()
        self._advertise(proc.pid, incarnation)
        rc = proc.wait()
        reader.join()
        return rc

    def _advertise(self, pid: int, incarnation: int) -> None:
        write_json_atomic(
            self.rundir.controller,
            {
                "host": self.host,
                "port": self.listener.getsockname()[1],
                "store_port": self.store.port,
                "pid": pid,
                "incarnation": incarnation,
                "relay": self.cfg.runtime.relay,
                **self.child.advert,
            },
        )

    def _restart(self, incarnation: int, rc: int) -> bool:
        died_t = time.time()
        alive = self.owner.alive()
        limit = self.cfg.runtime.controller_restarts
        self.journal.write(
            "controller_died", incarnation=incarnation, returncode=rc, alive=[f"{k}{i}" for k, i in alive]
        )
        if incarnation >= limit:
            log.error(
                "the controller died (status %s) and runtime.controller_restarts=%d are used up: the run ends",
                rc,
                limit,
            )
            return False
        # Nobody alive (a checkpoint restart whose ranks were not running yet, say) still gets a successor:
        # it adopts nobody and restarts every rank from the checkpoint, in this job. Ending here ended
        # the Slurm job too, racing the node monitor that requeues a job whose controller was lost.
        log.warning(
            "the controller died (status %s); starting incarnation %d to adopt %d live processes",
            rc,
            incarnation + 1,
            len(alive),
        )
        write_json_atomic(self.rundir.adopt, {"incarnation": incarnation + 1, "died_t": died_t, "alive": alive})
        return True


def log_as_supervisor(rundir: RunDir) -> None:
    """This process's lines carry the run, ``supervisor`` and the step of the controller's latest
    per-commit snapshot (read at each line: the supervisor logs rarely, and never steps itself)."""
    LOG_CONTEXT.update(run=rundir.name, who="supervisor", step=lambda: _snapshot_step(rundir))


def _snapshot_step(rundir: RunDir) -> Any:
    """The snapshot's step, or ``-``; silent (it runs inside a log line, so it must not log)."""
    try:
        step = json.loads(rundir.snapshot.read_text()).get("step", "-")
    except (OSError, ValueError, AttributeError):
        return "-"
    return step if isinstance(step, int) else "-"
