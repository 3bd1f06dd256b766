"""Local agents forked from a zygote that imported torch once (``runtime.fork_agents``).

Contract: :class:`Zygote` starts ``python -m tmslurm.agent.zygote`` (see that module) the first time
an agent is asked for, after making this process a child subreaper, and :meth:`Zygote.spawn` returns a
:class:`Forked` handle for the agent: a child of *this* process (the zygote's short-lived middle
child exits at once, so the agent is re-parented here), with the subset of ``subprocess.Popen`` the
spawner uses: ``pid``, :meth:`~Forked.poll`, :meth:`~Forked.wait` and :meth:`~Forked.kill`. Like a
``Popen``, a handle reaps its process only through its own ``waitpid`` and signals it only while it
is unreaped, so a pid reused by another process is never signalled.

Failure behaviour: :meth:`Zygote.spawn` returns None, logs why, and gives the zygote up for the rest
of the run when it cannot be started, refuses, dies or answers nonsense; the caller then starts the
agent as a fresh process (slower, the same behaviour). :meth:`Zygote.close` ends it (its standard
input closes); agents it forked live on.

Noticed and accepted: as a subreaper this process also inherits the orphans of its agents (a killed
rank's helper processes, if any); they stay zombies until this process exits.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from tmslurm.wire.zygote import CMDLINE_ROOM, ForkRequest

log = logging.getLogger(__name__)
PR_SET_CHILD_SUBREAPER = 36
START_TIMEOUT_S = 120.0
"""Longest wait for the zygote's first answer (it imports torch before reading anything)."""


def become_subreaper() -> bool:
    """``prctl(PR_SET_CHILD_SUBREAPER, 1)``: orphaned descendants become this process's children."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class Forked:
    """An agent forked by the zygote, now this process's child (a ``Popen``-like handle)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: it is gone all the same
                self.returncode = -1
                return self.returncode
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"agent {self.pid}", timeout or 0.0)
            try:
                fd = os.pidfd_open(self.pid)
            except OSError:  # exited and reaped between the poll and here: poll says so next
                continue
            try:
                select.select([fd], [], [], min(left, 1.0) if left is not None else 1.0)
            finally:
                os.close(fd)
        return code

    def kill(self) -> None:
        if self.poll() is None:  # unreaped: the pid is still this child's, never someone else's
            os.kill(self.pid, signal.SIGKILL)


class Zygote:
    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.env = env
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.given_up = False

    def _start(self) -> subprocess.Popen | None:
        if not become_subreaper():
            self._give_up("prctl(PR_SET_CHILD_SUBREAPER) is not available here")
            return None
        with open(self.log_path, "ab") as err:
            room = "_" * CMDLINE_ROOM  # room for each agent to rewrite its command line to its own
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tmslurm.agent.zygote", room],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=self.env,
                start_new_session=True,
            )
        return self.proc

    def spawn(self, argv: list[str], env: dict[str, str], log_path: Path) -> Forked | None:
        """The agent ``python -m tmslurm.agent.main *argv``, forked; None: start it afresh instead."""
        if self.given_up:
            return None
        proc = self.proc or self._start()
        if proc is None:
            return None
        line = ForkRequest(argv=argv, env=env, log=str(log_path)).model_dump_json() + "\n"
        stdin, stdout = proc.stdin, proc.stdout
        assert stdin is not None and stdout is not None  # both pipes (see _start)
        try:
            stdin.write(line.encode())
            stdin.flush()
            answer = _read_line(stdout, START_TIMEOUT_S)
            reply = json.loads(answer)
        except (OSError, ValueError, TimeoutError) as exc:
            self._give_up(f"no answer ({exc})")
            return None
        if not isinstance(reply, dict) or not isinstance(reply.get("pid"), int) or reply["pid"] <= 0:
            self._give_up(f"answer {reply!r}")
            return None
        return Forked(reply["pid"])

    def _give_up(self, why: str) -> None:
        log.warning("agent zygote unusable (%s): agents start as fresh processes; see %s", why, self.log_path)
        self.given_up = True
        self.close()

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:  # always a pipe (see _start)
                proc.stdin.close()
            proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()


def _read_line(stream: IO[bytes], timeout: float) -> str:
    ready, _, _ = select.select([stream], [], [], timeout)
    if not ready:
        raise TimeoutError(f"nothing in {timeout:.0f}s")
    line = stream.readline()
    if not line:
        raise OSError("the zygote exited")
    return line.decode()
