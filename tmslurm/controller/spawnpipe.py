"""Spawning through the supervisor: the controller asks, the supervisor's spawner acts.

Contract: a controller that a supervisor restarts must not own the run's processes (killing it
would orphan them, and its successor could not fence them by a handle of its own). So the
supervisor holds the real spawner and the controller holds a :class:`PipeSpawner`, which
implements the :class:`~tmslurm.controller.spawner.Spawner` protocol by writing one typed request
per line (:data:`SpawnRequest`) to a pipe. It never waits for the work and never raises: a broken
pipe (the supervisor is gone) is logged once and later requests are dropped. :func:`serve` (the
supervisor's side) reads the pipe until EOF and runs each request, in order, on the real spawner;
a line that is not a valid request is logged and skipped. Fencing therefore still goes through
the handle of the process that started the agent, whichever controller incarnation asks.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from tmslurm.controller.spawner import Spawner, local_node
from tmslurm.core.config import RunConfig

log = logging.getLogger(__name__)


class _Req(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class SpawnWorker(_Req):
    op: Literal["worker"] = "worker"
    rank: Annotated[int, Field(ge=0)]
    incarnation: Annotated[int, Field(ge=0)]


class SpawnStandby(_Req):
    op: Literal["standby"] = "standby"
    index: Annotated[int, Field(ge=0)]


class Fence(_Req):
    op: Literal["fence"] = "fence"
    kind: Literal["worker", "standby"]
    ident: Annotated[int, Field(ge=0)]


class StopAll(_Req):
    op: Literal["stop_all"] = "stop_all"
    grace_s: Annotated[float, Field(ge=0.0, le=3600.0)]


SpawnRequest = Annotated[SpawnWorker | SpawnStandby | Fence | StopAll, Field(discriminator="op")]
_REQUEST: TypeAdapter[SpawnRequest] = TypeAdapter(SpawnRequest)


class PipeSpawner:
    """The controller's spawner when a supervisor owns the processes."""

    def __init__(self, fd: int, cfg: RunConfig) -> None:
        self.file = os.fdopen(fd, "w", buffering=1)
        self.cfg = cfg
        self.lock = threading.Lock()
        self.broken = False

    def _send(self, req: SpawnWorker | SpawnStandby | Fence | StopAll) -> None:
        with self.lock:
            if self.broken:
                return
            try:
                self.file.write(req.model_dump_json() + "\n")
            except OSError as exc:
                self.broken = True
                log.error("the supervisor is gone (%s): cannot %s", exc, req.op)

    def spawn_worker(self, rank: int, incarnation: int) -> bool:
        self._send(SpawnWorker(rank=rank, incarnation=incarnation))
        return True

    def spawn_standby(self, index: int) -> None:
        self._send(SpawnStandby(index=index))

    def fence(self, kind: str, ident: int) -> None:
        self._send(Fence(kind=_fenced(kind), ident=ident))

    def stop_all(self, grace_s: float = 0.0) -> None:
        self._send(StopAll(grace_s=grace_s))

    def pending_standbys(self) -> list[int]:
        return []  # the supervisor's own spawner starts local processes: it lists every live one

    def take_lost_standbys(self) -> list[int]:
        return []

    def node_of_rank(self, rank: int) -> str:
        return local_node(self.cfg, rank)


def serve(fd: int, spawner: Spawner) -> None:
    """Run the requests read from ``fd`` on ``spawner`` until EOF (the controller exited)."""
    with os.fdopen(fd, "r") as f:
        for line in f:
            try:
                req = _REQUEST.validate_json(line)
            except ValidationError as exc:
                log.error("ignoring a bad spawn request %r: %s", line[:200], exc.errors(include_url=False)[:1])
                continue
            try:
                _run(req, spawner)
            except Exception:  # one failed start must not stop the others
                log.exception("spawn request %s failed", req)


def _run(req: SpawnRequest, spawner: Spawner) -> None:
    if isinstance(req, SpawnWorker):
        spawner.spawn_worker(req.rank, req.incarnation)
    elif isinstance(req, SpawnStandby):
        spawner.spawn_standby(req.index)
    elif isinstance(req, Fence):
        spawner.fence(req.kind, req.ident)
    else:
        spawner.stop_all(req.grace_s)


def _fenced(kind: str) -> Literal["worker", "standby"]:
    """``kind`` as a :class:`Fence` names it; only workers and standbys are fenced (ValueError otherwise)."""
    if kind == "worker":
        return "worker"
    if kind == "standby":
        return "standby"
    raise ValueError(f"only a worker or a standby is fenced, not a {kind!r}")
