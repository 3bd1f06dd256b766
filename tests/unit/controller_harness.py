"""A controller with fake channels and a fake cluster: drives the state machine with no process."""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Callable
from typing import Any

from tmslurm.controller import Controller, LocalHooks
from tmslurm.controller.items import Disconnected, HelloIn, MessageIn
from tmslurm.controller.journal import read_journal
from tmslurm.controller.state import Mode
from tmslurm.core.config import compose_config
from tmslurm.wire.messages import Hello, decode_agent
from tmslurm.wire.protocol import GateSide

ADDRESS = {"host": "127.0.0.1", "port": 1, "store_port": 2}


@functools.cache
def _config(overrides: tuple[str, ...]) -> Any:
    return compose_config(list(overrides))


class FakeChannel(GateSide):
    """Records every line sent (decoded), even after ``close()``; a send after it reports failure."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.closed = False

    def send_line(self, data: bytes) -> None:
        self.sent.append(json.loads(data))

    def try_send_line(self, data: bytes) -> bool:
        self.send_line(data)
        return not self.closed

    def send_now_line(self, data: bytes) -> bool:
        return self.try_send_line(data)

    def close(self) -> None:
        self.closed = True


class FakeSpawner:
    """Records what the controller asks; fences by (kind, ident) only: there is no pid to give."""

    def __init__(self) -> None:
        self.workers: list[tuple[int, int]] = []
        self.standbys: list[int] = []
        self.fenced: list[tuple[str, int]] = []
        self.pending: list[int] = []
        """Standby ids whose (simulated) allocation is still queued."""
        self.lost_standbys: list[int] = []
        """Standby ids whose (simulated) allocation failed: handed to the controller once."""

    def spawn_worker(self, rank: int, incarnation: int) -> bool:
        self.workers.append((rank, incarnation))
        return True

    def spawn_standby(self, index: int) -> None:
        self.standbys.append(index)

    def fence(self, kind: str, ident: int) -> None:
        self.fenced.append((kind, ident))

    def stop_all(self, grace_s: float = 0.0) -> None:
        return None

    def node_of_rank(self, rank: int) -> str:
        return f"n{rank}"

    def pending_standbys(self) -> list[int]:
        return list(self.pending)

    def take_lost_standbys(self) -> list[int]:
        lost, self.lost_standbys = self.lost_standbys, []
        return lost


class FakeCluster(LocalHooks):
    def __init__(self) -> None:
        self.released: list[list[str]] = []
        self.lost: list[str] = []

    def node_lost(self, node):
        self.lost.append(node)

    def release_nodes(self, nodes, released):
        self.released.append(nodes)
        for n in nodes:
            released(n)


class Harness:
    """dp x pp workers on nodes n<rank>, ``standbys`` warm standbys on nodes s<i>, all connected."""

    def __init__(
        self,
        tmp_path,
        dp: int = 2,
        pp: int = 2,
        standbys: int = 1,
        *overrides: str,
        cluster: Callable[[Any], tuple[Any, Any]] | None = None,
        shadow: bool = False,
    ) -> None:
        """``cluster(cfg)`` builds another (spawner, hooks) pair than the fakes. ``shadow``: planned
        switches use live shadows (off by default here: most tests drive the switch itself)."""
        cfg = copy.deepcopy(
            _config(
                (
                    f"parallel.dp={dp}",
                    f"parallel.pp={pp}",
                    f"standby.count={standbys}",
                    "train.steps=50",
                    f"shadow.enabled={str(shadow).lower()}",
                    *overrides,
                )
            )
        )
        self.spawner, self.cluster = cluster(cfg) if cluster is not None else (FakeSpawner(), FakeCluster())
        self.ctl = Controller(cfg, tmp_path, self.spawner, self.cluster, ADDRESS)
        self.state = self.ctl.state
        self.world = self.ctl.ctx.layout.world
        self.conns: dict[Any, int] = {}
        self.channels: dict[Any, FakeChannel] = {}
        for r in range(self.world):
            self.ctl.members.spawn_worker(r, 0)
        for _ in range(standbys):
            self.ctl.members.spawn_standby()
        self.state.mode = Mode.RUNNING
        for r in range(self.world):
            self.hello(r, "worker", r, f"n{r}")
        for i in range(standbys):
            self.hello(f"s{i}", "standby", i, f"s{i}")
            for role in self.ctl.ctx.layout.roles:
                self.send(
                    f"s{i}",
                    {
                        "type": "ready",
                        "role": role,
                        "warmup_s": 0.1,
                        "rss_mb": 1.0,
                        "role_rss_mb": 1.0,
                        "sandbox_sends_skipped": 0,
                    },
                )

    def hello(self, who: Any, kind: str, ident: int, node: str, pid: int = 4242) -> FakeChannel:
        conn = len(self.conns) + 1
        ch = FakeChannel()
        self.conns[who], self.channels[who] = conn, ch
        self.ctl.handle(HelloIn(Hello(type="hello", token="t", kind=kind, id=ident, pid=pid, node=node), conn, ch))
        return ch

    def aid(self, who: Any) -> str:
        return self.state.conn_agent[self.conns[who]]

    def send(self, who: Any, msg: dict[str, Any]) -> None:
        self.ctl.handle(MessageIn(self.conns[who], decode_agent(msg)))

    def vote(self, who: Any, rank: int | None = None, epoch: int | None = None, step: int | None = None) -> None:
        self.send(
            who,
            {
                "type": "vote",
                "step": self.state.step if step is None else step,
                "epoch": self.state.epoch if epoch is None else epoch,
                "rank": who if rank is None else rank,
                "loss": 1.0,
                "dt": 0.01,
                "peak_rss_mb": 1.0,
            },
        )

    def commit_all(self, who: dict[int, Any] | None = None) -> dict[str, Any]:
        """Every rank votes for the current step (``who`` maps a rank to another connection); the decision."""
        for r in range(self.world):
            self.vote((who or {}).get(r, r), rank=r)
        return self.got((who or {}).get(0, 0), "decision")[-1]

    def disconnect(self, who: Any) -> None:
        self.ctl.handle(Disconnected(self.conns[who]))

    def got(self, who: Any, mtype: str) -> list[dict[str, Any]]:
        return [m for m in self.channels[who].sent if m["type"] == mtype]

    def journal(self, etype: str) -> list[dict[str, Any]]:
        return [e for e in read_journal(self.ctl.ctx.rundir.events) if e["type"] == etype]

    def abort_all(self, alive: list[int]) -> None:
        for r in alive:
            self.send(
                r, {"type": "aborted", "epoch": self.state.epoch, "rank": r, "step": self.state.step, "status": {}}
            )

    def prepare_all(self) -> None:
        """Every participant of the current planned switch reports phase 1 done."""
        plan = self.state.plan
        for w in sorted(plan.waiting):
            who = int(w[1:]) if w.startswith("r") else next(k for k in self.conns if self.aid(k) == w)
            rank = who if isinstance(who, int) else plan.moves[0].rank
            self.send(who, {"type": "prepared", "epoch": plan.epoch, "rank": rank, "phase1_s": 0.01})


class FakeRelay:
    """A relay's connection as the controller sees it: it records each line sent."""

    def __init__(self) -> None:
        self.lines: list[bytes] = []

    def send_line(self, data: bytes) -> None:
        self.lines.append(data)

    def try_send_line(self, data: bytes) -> bool:
        self.send_line(data)
        return True

    def send_now_line(self, data: bytes) -> bool:
        self.lines.append(data)
        return True
