"""The fabric on real processes: a dead peer fails fast, a hung peer is abandoned on abort,
and rebuilding one group leaves every other group's ProcessGroup untouched."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time

import pytest
import torch
import torch.distributed as dist

from tmslurm.comm.fabric import Fabric, FabricSettings
from tmslurm.core.errors import CommAborted, CommError
from tmslurm.core.topology import Layout

pytestmark = pytest.mark.dist
LAYOUT = Layout(dp=2, pp=2)


def _fabric(rank: int, port: int, abort: threading.Event, timeout: float = 20.0) -> Fabric:
    def store():
        return dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False)

    f = Fabric(rank, LAYOUT, store, FabricSettings("gloo", timeout, 0.05, 30.0), abort)
    f.install(f.build({g.name: 0 for g in f.my_groups()}))
    return f


def _peer(rank: int, port: int, mode: str, ready, q, go) -> None:
    abort = threading.Event()
    f = _fabric(rank, port, abort)
    ready.put(rank)
    go.wait(60)  # every rank has built every group before anyone dies
    t = torch.ones(8)
    if rank == 1:  # rank 1 (stage 1, replica 0) dies or hangs
        os.kill(os.getpid(), signal.SIGKILL if mode == "kill" else signal.SIGSTOP)
    if rank == 0:
        t0 = time.monotonic()
        try:
            if mode == "kill":
                f.recv("pp/replica0/0-1", t, 1, 0)
            else:
                threading.Timer(1.0, abort.set).start()
                f.recv("pp/replica0/0-1", t, 1, 0)
            q.put(("no-error", time.monotonic() - t0))
        except CommAborted as exc:
            q.put(("aborted", time.monotonic() - t0, str(exc), f.status()))
        except CommError as exc:
            q.put(("error", time.monotonic() - t0, str(exc), f.status()))
    if rank == 3:  # dp/stage1 contains rank 1: an all-reduce with a dead peer errors
        t0 = time.monotonic()
        try:
            f.allreduce("dp/stage1", t)
            q.put(("no-error-ar", 0))
        except CommError as exc:
            q.put(("ar-error", time.monotonic() - t0, str(exc)))
    time.sleep(3 if mode == "kill" else 0.5)


def _start(mode: str):
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    # Two queues: a queue's writers share one lock, and rank 1 is SIGSTOPped or SIGKILLed. Had
    # it written to the results queue, its feeder thread could still hold that lock when it
    # stops, and every later report would block. Rank 1 writes only its ready message.
    ready, q, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_peer, args=(r, store.port, mode, ready, q, go), daemon=True) for r in range(4)]
    for p in procs:
        p.start()
    return store, procs, (ready, q, go)


def _results(qg, n: int, timeout: float = 60) -> list[tuple]:
    ready, q, go = qg
    deadline = time.monotonic() + timeout
    ranks = {ready.get(timeout=timeout) for _ in range(4)}
    assert ranks == {0, 1, 2, 3}, ranks
    go.set()
    out = []
    while len(out) < n and time.monotonic() < deadline:
        try:
            out.append(q.get(timeout=1))
        except Exception:
            continue
    return out


def test_killed_peer_fails_fast_with_a_clear_error():
    store, procs, q = _start("kill")
    try:
        res = {r[0]: r for r in _results(q, 2)}
        kind, seconds, msg, status = res["error"]
        assert seconds < 5.0, seconds  # far below the 20 s group timeout
        assert "pp/replica0/0-1" in msg and "failed" in msg
        assert status["pp/replica0/0-1"]["pending"] == 1  # the abandoned recv marks the group dirty
        assert res["ar-error"][1] < 5.0 and "dp/stage1" in res["ar-error"][2]
    finally:
        for p in procs:
            p.kill()


def test_hung_peer_wait_is_abandoned_when_the_step_aborts():
    store, procs, q = _start("stop")
    try:
        res = {r[0]: r for r in _results(q, 1)}
        kind, seconds, msg, status = res["aborted"]
        assert 0.9 < seconds < 3.0, seconds
        assert "abandoned" in msg
    finally:
        for p in procs:
            if p.pid:
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def _rebuild_peer(rank: int, port: int, q) -> None:
    abort = threading.Event()
    f = _fabric(rank, port, abort)
    before = {n: id(h.pg) for n, h in f.handles.items()}
    t = torch.full((4,), float(rank))
    # rebuild only the groups containing rank 0, in the background, while dp/stage1 carries traffic
    affected = {n: 1 for n in LAYOUT.affected_groups([0]) if n in f.handles}
    build = f.build_in_background(affected)
    if "dp/stage1" in f.handles:
        for _ in range(5):
            f.allreduce("dp/stage1", t.clone())
    f.install(build.join(30))
    after = {n: id(h.pg) for n, h in f.handles.items()}
    out = t.clone()
    for name in sorted(affected):
        if name.startswith("dp/"):
            f.allreduce(name, out)
    q.put((rank, sorted(n for n in before if before[n] == after[n]), sorted(affected), f.generations(), out.tolist()))
    time.sleep(1)


def test_rebuilding_only_the_affected_groups_keeps_the_others_and_works():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_rebuild_peer, args=(r, store.port, q), daemon=True) for r in range(4)]
    for p in procs:
        p.start()
    res = {}
    for _ in range(4):
        item = q.get(timeout=60)
        res[item[0]] = item
    for p in procs:
        p.join(10)
    # rank 3 shares no group with rank 0: nothing rebuilt, nothing replaced
    assert res[3][1] == ["dp/stage1", "pp/replica1/0-1"] and res[3][2] == []
    # rank 1: pp/replica0/0-1 rebuilt (generation 1), dp/stage1 kept as the same object
    assert res[1][1] == ["dp/stage1"] and res[1][3]["pp/replica0/0-1"] == 1
    # the new generation of dp/stage0 (ranks 0 and 2) reduces correctly: 0 + 2
    assert res[0][4] == [2.0] * 4 and res[2][4] == [2.0] * 4
