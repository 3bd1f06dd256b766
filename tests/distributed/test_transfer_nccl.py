"""State transfer over NCCL point-to-point, device to device (needs two CUDA devices; skipped here).

With ``runtime.backend=nccl`` the two-member transfer group is an NCCL group and the state's CUDA
tensors travel from device memory to device memory: the header and the buckets are device tensors,
the receiver receives into its own CUDA tensors, and nothing is staged through host memory."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch
import torch.distributed as dist

pytestmark = [
    pytest.mark.dist,
    pytest.mark.skipif(
        not (torch.cuda.is_available() and torch.cuda.device_count() >= 2 and dist.is_nccl_available()),
        reason="needs two CUDA devices and NCCL (the CPU machine runs the gloo path: test_transfer.py)",
    ),
]


def _state(seed: int, device: torch.device):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.LayerNorm(256), torch.nn.Linear(256, 8)).to(device)
    o = torch.optim.AdamW(m.parameters())
    m(torch.randn(4, 64, device=device)).sum().backward()
    o.step()
    return {"state": {"model": m.state_dict(), "optim": o.state_dict()}, "step": 3}


def _peer(rank: int, port: int, q) -> None:
    from tmslurm.comm import transfer
    from tmslurm.comm.fabric import FabricSettings, make_pg
    from tmslurm.comm.transfer import recv_state, send_state
    from tmslurm.train.schedule import state_digest

    transfer.BUCKET_BYTES = 4096  # many buckets, boundaries inside tensors
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False)
    pg = make_pg(store, "xfer/r0", 1, rank, 2, FabricSettings("nccl", 60, 0.05, 60))
    st = _state(rank, device)
    copies: list[int] = []  # bytes of every device-to-host copy made while the state moves
    real_cpu, real_to = torch.Tensor.cpu, torch.Tensor.to

    def cpu(t, *a, **k):
        copies.append(t.numel() * t.element_size() if t.is_cuda else 0)
        return real_cpu(t, *a, **k)

    def to(t, *a, **k):
        out = real_to(t, *a, **k)
        copies.append(t.numel() * t.element_size() if t.is_cuda and not out.is_cuda else 0)
        return out

    torch.Tensor.cpu, torch.Tensor.to = cpu, to
    try:
        if rank == 0:
            q.put(("sent", send_state(pg, 1, st, 60), sum(copies)))
            return
        own = [t.data_ptr() for t in st["state"]["model"].values()]
        got, n = recv_state(pg, 0, 60, into=st)
    finally:
        torch.Tensor.cpu, torch.Tensor.to = real_cpu, real_to
    landed = [t.data_ptr() for t in got["state"]["model"].values()]
    on_device = all(t.is_cuda for t in got["state"]["model"].values())
    q.put(
        (
            "recv",
            n,
            sum(copies),
            landed == own and on_device,
            state_digest(got["state"]) == state_digest(_state(0, device)["state"]),
        )
    )


def test_cuda_state_travels_device_to_device_over_nccl():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_peer, args=(r, store.port, q), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    out = dict((item[0], item[1:]) for item in (q.get(timeout=120), q.get(timeout=120)))
    for p in procs:
        p.join(30)
    sent, sender_staged = out["sent"]
    received, receiver_staged, in_place, exact = out["recv"]
    assert sent == received > 0
    # nothing of the state goes through the host: only the receiver reads the small JSON header there
    assert sender_staged == 0 and receiver_staged < 64 << 10 < sent
    assert in_place and exact
