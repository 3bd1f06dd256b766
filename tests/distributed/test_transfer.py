"""State transfer over a real gloo pair: bit-identical state, tensors sent from their own memory."""

from __future__ import annotations

import datetime
import multiprocessing as mp

import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.dist


def _state(extra: int = 0):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.LayerNorm(3))
    o = torch.optim.AdamW(m.parameters())
    m(torch.randn(2, 5)).sum().backward()
    o.step()
    # ``extra`` more tensors (mixed dtypes, 0-dim ones among them): several windows of messages in flight
    more = [torch.randn(i % 7 + 1).to([torch.float32, torch.float64, torch.int64][i % 3]) if i % 5 else torch.tensor(float(i))
            for i in range(extra)]
    return {"state": {"model": m.state_dict(), "optim": o.state_dict(), "more": more}, "step": 7}


def _peer(rank: int, port: int, q, extra: int) -> None:
    from tmslurm.comm.transfer import recv_state, send_state

    store = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False)
    pg = dist.ProcessGroupGloo(dist.PrefixStore("xfer", store), rank, 2, datetime.timedelta(seconds=30))
    st = _state(extra)
    if rank == 0:
        q.put(("sent", send_state(pg, 1, st, 30)))
        return
    got, n = recv_state(pg, 0, 30)
    same = all(torch.equal(got["state"]["model"][k], v) for k, v in st["state"]["model"].items())
    for i, s in st["state"]["optim"]["state"].items():
        for k, v in s.items():
            same &= torch.equal(got["state"]["optim"]["state"][i][k], v) and got["state"]["optim"]["state"][i][k].shape == v.shape
    same &= got["step"] == 7 and got["state"]["optim"]["param_groups"] == st["state"]["optim"]["param_groups"]
    same &= len(got["state"]["more"]) == extra and all(
        a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b) for a, b in zip(got["state"]["more"], st["state"]["more"]))
    q.put(("recv", same, n))


@pytest.mark.parametrize("extra", [0, 150])
def test_state_arrives_bit_identical(extra):
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_peer, args=(r, store.port, q, extra), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    out = dict((item[0], item[1:]) for item in (q.get(timeout=60), q.get(timeout=60)))
    for p in procs:
        p.join(10)
    assert out["recv"][0] is True
    assert out["sent"][0] == out["recv"][1] > 0
