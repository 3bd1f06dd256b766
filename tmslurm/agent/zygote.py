"""The agent zygote: one process that imported torch and the agent once, and forks every local agent.

Why: on ``cluster=local`` every rank and standby is its own ``python -m tmslurm.agent.main``, and
each spent ~2 s of CPU importing torch before doing anything. A restart of four ranks on a 2-core
host paid that four times over; a test suite paid it for every process of every run. The zygote
pays it once per run; a forked agent starts in milliseconds and shares the imported pages
copy-on-write. (``multiprocessing``'s forkserver with preloading is the same idea, but it returns
its own process objects whose parent is the server, and its protocol unpickles: neither fits.)

Contract: ``python -m tmslurm.agent.zygote`` (started by the supervisor's
:class:`~tmslurm.controller.spawner.LocalSpawner`, with the agents' environment) imports torch and
the agent's modules, starts no thread of its own and runs no torch operation, then reads one
request per line on its standard input: a JSON object ``{"argv": [...], "env": {...}, "log":
PATH}`` (:class:`ForkRequest`). For each it forks a child that forks the agent and exits at once,
so the agent is re-parented to the nearest child subreaper: the supervisor, which declared itself
one (:mod:`tmslurm.controller.zygote_client`). It then writes one line back: ``{"pid": N}`` (the agent's pid, a
child of the supervisor from that moment) or ``{"error": "..."}`` for a request it refused (bad
JSON or fields) or could not carry out. A refused request forks nothing.

The agent itself: a new session (as ``start_new_session``), standard input from ``/dev/null``,
standard output and error appended to ``log``, its environment replaced by ``env``, its command line
rewritten to read as a fresh agent's on ``/proc`` (the node monitor checks it before it watches a
pid), Python's ``random`` reseeded (a fork copies the generator), then :func:`tmslurm.agent.main.main` with
``argv``, and the process ends through :func:`~tmslurm.agent.main.exit_now` as a fresh one does.

Failure behaviour: the zygote exits when its standard input closes (the supervisor stopped or
died); agents already forked are not its children and live on. Anything that goes wrong in the
zygote itself ends it; the spawner then starts agents as fresh processes.
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import sys
import traceback
from pathlib import Path

from pydantic import ValidationError

from tmslurm.wire.zygote import ForkRequest


def _preload() -> None:
    import torch  # noqa: F401  (the reason this process exists)

    import tmslurm.agent.main  # noqa: F401
    import tmslurm.agent.standby  # noqa: F401
    import tmslurm.agent.worker  # noqa: F401


def _cmdline(argv: list[str]) -> bytes:
    """What ``/proc/PID/cmdline`` of a fresh agent with ``argv`` reads."""
    return b"".join(os.fsencode(a) + b"\0" for a in [sys.executable, "-m", "tmslurm.agent.main", *argv])


def _arg_area() -> tuple[int, int]:
    """Start and end address of this process's command line (``/proc/self/stat`` fields 48, 49)."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[45]), int(fields[46])


def _retitle(argv: list[str]) -> None:
    """Rewrite this process's command line in place to a fresh agent's (as ``setproctitle`` does),
    so whoever identifies agents on ``/proc`` (the node monitor, the benchmarks) sees one. The
    zygote's own command line holds :data:`tmslurm.wire.zygote.CMDLINE_ROOM` bytes of room for it."""
    start, end = _arg_area()
    line = _cmdline(argv)
    ctypes.memmove(start, line + b"\0" * (end - start - len(line)), end - start)


def _agent(req: ForkRequest, ready: int) -> None:
    """In the agent (the grandchild): detach, redirect, say its pid on ``ready`` once it reads as an
    agent (so whoever gets the pid sees its session and command line), run; never returns."""
    rc = 1
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(req.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(null)
        os.close(out)
        os.environ.clear()
        os.environ.update(req.env)
        _retitle(req.argv)
        random.seed()
        os.write(ready, str(os.getpid()).encode())
        os.close(ready)
        from tmslurm.agent.main import exit_now, main

        sys.argv = ["tmslurm.agent.main", *req.argv]
        rc = main(req.argv)
        exit_now(rc)
    except SystemExit as exc:  # argparse
        rc = exc.code if isinstance(exc.code, int) else 2
    except BaseException:  # noqa: BLE001 (the agent's last word goes to its log)
        traceback.print_exc()
    sys.stderr.flush()
    os._exit(rc)


def fork_agent(req: ForkRequest) -> int:
    """Fork the agent of ``req`` through a child that exits at once; return the agent's pid once it
    is re-parented and reads as an agent."""
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(r)
            if os.fork() == 0:
                _agent(req, w)
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(child, 0)  # the agent is an orphan from here: re-parented to the subreaper
    with os.fdopen(r, "rb") as f:
        data = f.read()  # its pid, written when it is ready; EOF when it died before
    if not data.strip().isdigit():
        raise OSError("the zygote's child could not fork the agent")
    return int(data)


def _reply(obj: dict) -> None:
    os.write(1, (json.dumps(obj) + "\n").encode())


def serve() -> int:
    _preload()
    start, end = _arg_area()
    for line in sys.stdin.buffer:
        try:
            req = ForkRequest.model_validate_json(line)
        except ValidationError as exc:
            _reply({"error": f"bad request: {exc.errors()[0]['msg']}"})
            continue
        if len(_cmdline(req.argv)) > end - start:
            _reply({"error": f"command line longer than the {end - start} bytes of room"})
            continue
        try:
            _reply({"pid": fork_agent(req)})
        except OSError as exc:
            _reply({"error": f"fork failed: {exc}"})
    return 0


if __name__ == "__main__":
    sys.exit(serve())
