"""State transfer over a real gloo pair: bit-identical state in flat buckets (boundaries inside tensors,
buckets spanning several), received into the receiver's own tensors when given."""

from __future__ import annotations

import datetime
import multiprocessing as mp

import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.dist


def _state(extra: int = 0, seed: int = 0):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.LayerNorm(3))
    o = torch.optim.AdamW(m.parameters())
    m(torch.randn(2, 5)).sum().backward()
    o.step()
    # ``extra`` more tensors (mixed dtypes, 0-dim ones among them): several windows of messages in flight
    more = [
        torch.randn(i % 7 + 1).to([torch.float32, torch.float64, torch.int64][i % 3])
        if i % 5
        else torch.tensor(float(i))
        for i in range(extra)
    ]
    return {"state": {"model": m.state_dict(), "optim": o.state_dict(), "more": more}, "step": 7}


def _peer(rank: int, port: int, q, extra: int, bucket: int, into: bool) -> None:
    from tmslurm.comm import transfer
    from tmslurm.comm.transfer import recv_state, send_state

    transfer.BUCKET_BYTES = bucket

    store = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False)
    pg = dist.ProcessGroupGloo(dist.PrefixStore("xfer", store), rank, 2, datetime.timedelta(seconds=30))
    st = _state(extra)
    if rank == 0:
        q.put(("sent", send_state(pg, 1, st, 30)))
        return
    mine = _state(extra, seed=1) if into else None  # same structure, other values
    got, n = recv_state(pg, 0, 30, into=mine)
    if into:  # every tensor landed in the receiver's own memory
        own = [t.data_ptr() for t in mine["state"]["model"].values()]
        own += [t.data_ptr() for s in mine["state"]["optim"]["state"].values() for t in s.values()]
        landed = [t.data_ptr() for t in got["state"]["model"].values()]
        landed += [t.data_ptr() for s in got["state"]["optim"]["state"].values() for t in s.values()]
        if landed != own:
            q.put(("recv", "not received in place", n))
            return
    same = all(torch.equal(got["state"]["model"][k], v) for k, v in st["state"]["model"].items())
    for i, s in st["state"]["optim"]["state"].items():
        for k, v in s.items():
            same &= (
                torch.equal(got["state"]["optim"]["state"][i][k], v)
                and got["state"]["optim"]["state"][i][k].shape == v.shape
            )
    same &= got["step"] == 7 and got["state"]["optim"]["param_groups"] == st["state"]["optim"]["param_groups"]
    same &= len(got["state"]["more"]) == extra and all(
        a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        for a, b in zip(got["state"]["more"], st["state"]["more"])
    )
    q.put(("recv", same, n))


@pytest.mark.parametrize(
    "extra,bucket,into",
    [
        (0, 32 << 20, False),  # the whole state in one bucket: staged
        (150, 7, False),  # 7-byte buckets: boundaries inside every tensor, 0-dim ones included
        (150, 64, True),  # buckets spanning several tensors, received into the receiver's own tensors
    ],
)
def test_state_arrives_bit_identical(extra, bucket, into):
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_peer, args=(r, store.port, q, extra, bucket, into), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    out = dict((item[0], item[1:]) for item in (q.get(timeout=60), q.get(timeout=60)))
    for p in procs:
        p.join(10)
    assert out["recv"][0] is True
    assert out["sent"][0] == out["recv"][1] > 0
