"""``python -m benchmarks linkbw``: tmslurm's state transfer against the raw link it runs on.

Contract: for each ``--models`` preset, two processes on loopback (one gloo pair over a TCPStore,
``train.threads`` = 1 each, as ranks have) hold the state of the preset's first pipeline stage at
DP2 x PP2 (parameters and AdamW moments after one step; the receiver's own state of the same shape
but other values, as a standby's is). Each repeat measures, on the same pair, in alternating order:

- ``link``: one gloo send/recv of a single flat tensor of the same byte count;
- ``transfer``: :func:`~tmslurm.comm.transfer.send_state` / ``recv_state(into=...)``, what a move does.

Both are timed on the receiver from a ready handshake to the last byte. It prints, per preset, the
state size, the p50 (and min-max) of both in GB/s, and their ratio, and writes every sample to
``--json``. Every received state is checked bit for bit against the sender's digest; a mismatch or
a failure of either process raises.
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.common import commit, recorded_command, say, write_json

SYNC_TAG, DIGEST_TAG, RAW_TAG = 7, 8, 9


def _stage_state(model: str, seed: int) -> dict[str, Any]:
    import torch

    from benchmarks.ckpt import build_stage_runner

    torch.manual_seed(seed)
    runner = build_stage_runner(model, stage=0, stages=2)
    for p in runner.module.parameters():  # one optimizer step on random gradients: the moments exist
        p.grad = torch.randn_like(p)
    runner.apply()
    return {"state": runner.state(), "step": 1}


def _peer(rank: int, port: int, model: str, repeats: int, q: Any) -> None:
    import torch
    import torch.distributed as dist

    from tmslurm.comm.transfer import recv_state, send_state
    from tmslurm.train.schedule import state_digest, tensor_bytes

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False)
    pg = dist.ProcessGroupGloo(dist.PrefixStore("linkbw", store), rank, 2, datetime.timedelta(seconds=600))
    state = _stage_state(model, seed=rank)
    nbytes = tensor_bytes(state)
    flat = torch.zeros(nbytes, dtype=torch.uint8)
    tick = torch.zeros(1)
    samples: dict[str, list[float]] = {"link": [], "transfer": []}
    for i in range(repeats):
        for mode in (("link", "transfer") if i % 2 == 0 else ("transfer", "link")):
            if rank == 0:
                pg.recv([tick], 1, SYNC_TAG).wait()  # the receiver is ready
                if mode == "link":
                    pg.send([flat], 1, RAW_TAG).wait()
                else:
                    send_state(pg, 1, state, 600)
                continue
            pg.send([tick], 0, SYNC_TAG).wait()
            t0 = time.perf_counter()
            if mode == "link":
                pg.recv([flat], 0, RAW_TAG).wait()
            else:
                got, n = recv_state(pg, 0, 600, into=state)
                if n != nbytes:
                    raise RuntimeError(f"received {n} bytes, expected {nbytes}")
            samples[mode].append(time.perf_counter() - t0)
    digest = torch.frombuffer(bytearray(state_digest(state).encode()), dtype=torch.uint8)
    if rank == 0:
        pg.send([digest], 1, DIGEST_TAG).wait()
        return
    theirs = torch.empty_like(digest)
    pg.recv([theirs], 0, DIGEST_TAG).wait()
    q.put({"bytes": nbytes, "exact": bool(torch.equal(theirs, digest)), "samples": samples})


def measure(model: str, repeats: int) -> dict[str, Any]:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_peer, args=(r, store.port, model, repeats, q)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(3600)
    if any(p.exitcode != 0 for p in procs) or q.empty():
        raise RuntimeError(f"linkbw {model}: a peer failed (exit codes {[p.exitcode for p in procs]})")
    out = q.get()
    if not out["exact"]:
        raise RuntimeError(f"linkbw {model}: the received state differs from the sender's")
    return out


def row(model: str, out: dict[str, Any]) -> dict[str, Any]:
    gb = out["bytes"] / 1e9
    rates = {mode: sorted(gb / s for s in xs) for mode, xs in out["samples"].items()}
    p50 = {mode: statistics.median(r) for mode, r in rates.items()}
    return {"model": model, "state_mb_per_rank": round(out["bytes"] / 1e6, 1), "n": len(out["samples"]["link"]),
            "link_gbps": round(p50["link"], 3), "transfer_gbps": round(p50["transfer"], 3),
            "link_gbps_range": [round(rates["link"][0], 3), round(rates["link"][-1], 3)],
            "transfer_gbps_range": [round(rates["transfer"][0], 3), round(rates["transfer"][-1], 3)],
            "transfer_over_link": round(p50["transfer"] / p50["link"], 3),
            "samples_s": {m: [round(s, 5) for s in xs] for m, xs in out["samples"].items()}}


def main(args: argparse.Namespace) -> None:
    rows = []
    for model in args.models.split(","):
        say(f"{model}: {args.repeats} repeats of link and transfer on one loopback gloo pair")
        rows.append(row(model, measure(model, args.repeats)))
    print(f"{'model':<8}{'MB/rank':>9}{'n':>4}{'link GB/s':>12}{'transfer GB/s':>15}{'ratio':>8}")
    for r in rows:
        print(f"{r['model']:<8}{r['state_mb_per_rank']:>9.1f}{r['n']:>4}{r['link_gbps']:>12.3f}{r['transfer_gbps']:>15.3f}"
              f"{r['transfer_over_link']:>8.2f}   (link {r['link_gbps_range']}, transfer {r['transfer_gbps_range']})")
    write_json(Path(args.json), {"command": recorded_command("linkbw"), "commit": commit(),
                                 "date": datetime.date.today().isoformat(), "endpoints": "loopback", "rows": rows})
