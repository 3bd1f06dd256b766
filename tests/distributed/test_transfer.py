"""State transfer over a real gloo pair: bit-identical state, tensors sent from their own memory."""

from __future__ import annotations

import datetime
import multiprocessing as mp

import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.dist


def _state():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.LayerNorm(3))
    o = torch.optim.AdamW(m.parameters())
    m(torch.randn(2, 5)).sum().backward()
    o.step()
    return {"state": {"model": m.state_dict(), "optim": o.state_dict()}, "step": 7}


def _peer(rank: int, port: int, q) -> None:
    from tmslurm.comm.transfer import recv_state, send_state

    store = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False)
    pg = dist.ProcessGroupGloo(dist.PrefixStore("xfer", store), rank, 2, datetime.timedelta(seconds=30))
    st = _state()
    if rank == 0:
        q.put(("sent", send_state(pg, 1, st, 30)))
        return
    got, n = recv_state(pg, 0, 30)
    same = all(torch.equal(got["state"]["model"][k], v) for k, v in st["state"]["model"].items())
    for i, s in st["state"]["optim"]["state"].items():
        for k, v in s.items():
            same &= torch.equal(got["state"]["optim"]["state"][i][k], v) and got["state"]["optim"]["state"][i][k].shape == v.shape
    same &= got["step"] == 7 and got["state"]["optim"]["param_groups"] == st["state"]["optim"]["param_groups"]
    q.put(("recv", same, n))


def test_state_arrives_bit_identical():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_peer, args=(r, store.port, q), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    out = dict((item[0], item[1:]) for item in (q.get(timeout=60), q.get(timeout=60)))
    for p in procs:
        p.join(10)
    assert out["recv"][0] is True
    assert out["sent"][0] == out["recv"][1] > 0
