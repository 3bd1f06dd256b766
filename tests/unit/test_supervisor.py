"""The supervisor's choice after a controller died: start an adopting successor while any worker or
standby runs (a standby may serve a rank) and restarts are left, else end the run."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass

import pytest

from tmslurm.core.config import compose_config
from tmslurm.run.supervisor import Supervisor


@dataclass
class FakeOwner:
    procs: list[tuple[str, int]]

    def alive(self) -> list[tuple[str, int]]:
        return list(self.procs)

    def stop_all(self, grace_s: float = 0.0) -> None:
        self.procs = []


@dataclass
class FakeStore:
    port: int = 1


@pytest.mark.parametrize(
    "alive,incarnation,restarts,adopts",
    [
        ([("worker", 0), ("standby", 5)], 0, 3, True),
        (
            [("standby", 1), ("standby", 4), ("standby", 5), ("standby", 6)],
            0,
            3,
            True,
        ),  # every rank served by a standby
        ([("standby", 7)], 1, 3, True),  # warm only: the successor refuses to adopt and restarts from the checkpoint
        ([], 0, 3, True),  # a restart's ranks not running yet: the successor restarts them from the checkpoint
        ([("worker", 0)], 3, 3, False),  # restarts used up
    ],
)
def test_a_successor_starts_while_restarts_are_left(tmp_path, alive, incarnation, restarts, adopts):
    cfg = compose_config([f"runtime.controller_restarts={restarts}"])
    with socket.create_server(("127.0.0.1", 0)) as listener:
        sup = Supervisor(cfg, tmp_path, FakeOwner(alive), listener, FakeStore(), "127.0.0.1")
        assert sup._restart(incarnation, -9) is adopts
    (died,) = [json.loads(line) for line in sup.rundir.events.read_text().splitlines()]
    assert died["type"] == "controller_died" and died["alive"] == [f"{k}{i}" for k, i in alive]
    if adopts:
        note = json.loads(sup.rundir.adopt.read_text())
        assert note["incarnation"] == incarnation + 1 and [tuple(p) for p in note["alive"]] == alive
    else:
        assert not sup.rundir.adopt.exists()
