"""``python -m benchmarks linkbw``: tmslurm's state transfer against the raw link it runs on.

Contract: for each ``--models`` preset, two processes (one gloo pair over a TCPStore, built as a
rank's groups are; ``train.threads`` = 1 each, as ranks have) hold the state of the preset's first pipeline stage at
DP2 x PP2 (parameters and AdamW moments after one step; the receiver's own state of the same shape
but other values, as a standby's is). Each repeat measures, on the same pair, in alternating order:

- ``link``: one gloo send/recv of a single flat tensor of the same byte count;
- ``transfer``: :func:`~tmslurm.comm.transfer.send_state` / ``recv_state(into=...)``, what a move does.

The two processes run on loopback, or with ``--lab-nodes A,B`` inside two nodes of the failure lab
(``scripts/local-slurm exec``; the sender on A, which also hosts the store), over the link between
those nodes' network namespaces. Both are timed on the receiver from a ready handshake to the last byte. It prints, per
preset, the state size, the p50 (and min-max) of both in GB/s, and their ratio, and writes every sample to ``--json``.
Every received state is checked bit for bit against the sender's digest; a mismatch or a failure of either process
raises.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, commit, recorded_command, say, write_json

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


def _peer(rank: int, host: str, port: int, model: str, repeats: int) -> dict[str, Any] | None:
    """One end of the pair; the receiver (rank 1) returns the samples, the sender None.

    The gloo pair is built as a rank's groups are (:func:`~tmslurm.comm.fabric.make_pg`, bound to the
    address that routes to the store), so between lab nodes it runs over the nodes' own link."""
    import torch
    import torch.distributed as dist

    from tmslurm.comm.fabric import FabricSettings, make_pg
    from tmslurm.comm.transfer import recv_state, send_state
    from tmslurm.core.netaddr import local_address_towards
    from tmslurm.train.schedule import state_digest, tensor_bytes

    torch.set_num_threads(1)
    store = dist.TCPStore(host, port, is_master=False, wait_for_workers=False, timeout=datetime.timedelta(seconds=600))
    pg = make_pg(store, "linkbw", 0, rank, 2, FabricSettings("gloo", 600.0, 0.05, 600.0, local_address_towards(host)))
    state = _stage_state(model, seed=rank)
    nbytes = tensor_bytes(state)
    flat = torch.zeros(nbytes, dtype=torch.uint8)
    tick = torch.zeros(1)
    samples: dict[str, list[float]] = {"link": [], "transfer": []}
    for i in range(repeats):
        for mode in ("link", "transfer") if i % 2 == 0 else ("transfer", "link"):
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
        return None
    theirs = torch.empty_like(digest)
    pg.recv([theirs], 0, DIGEST_TAG).wait()
    return {"bytes": nbytes, "exact": bool(torch.equal(theirs, digest)), "samples": samples}


def _local_peer(rank: int, port: int, model: str, repeats: int, q: Any) -> None:
    out = _peer(rank, "127.0.0.1", port, model, repeats)
    if out is not None:
        q.put(out)


def _checked(model: str, out: dict[str, Any] | None) -> dict[str, Any]:
    if out is None:
        raise RuntimeError(f"linkbw {model}: the receiver reported nothing")
    if not out["exact"]:
        raise RuntimeError(f"linkbw {model}: the received state differs from the sender's")
    return out


def measure(model: str, repeats: int) -> dict[str, Any]:
    """Both ends as local processes on loopback."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_local_peer, args=(r, store.port, model, repeats, q)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(3600)
    if any(p.exitcode != 0 for p in procs) or q.empty():
        raise RuntimeError(f"linkbw {model}: a peer failed (exit codes {[p.exitcode for p in procs]})")
    return _checked(model, q.get())


def lab_addresses(status: str) -> dict[str, str]:
    """Node name -> address, from ``scripts/local-slurm status`` output."""
    return dict(re.findall(r"^\s+(\S+)\s+addr\s+(\S+)", status, re.M))


def measure_lab(model: str, repeats: int, nodes: tuple[str, str], port: int) -> dict[str, Any]:
    """The sender on ``nodes[0]``, which also hosts the store, the receiver on ``nodes[1]``: each a
    process inside its lab node (``scripts/local-slurm exec``), over the nodes' veth link."""
    lab = str(REPO / "scripts" / "local-slurm")
    status = subprocess.run([lab, "status"], capture_output=True, text=True, timeout=120)
    addrs = lab_addresses(status.stdout)
    missing = [n for n in nodes if n not in addrs]
    if missing:
        raise RuntimeError(
            f"linkbw: lab nodes {missing} not found (is the lab up? scripts/local-slurm up); status said:\n"
            f"{status.stdout[-1000:]}{status.stderr[-500:]}"
        )
    host = addrs[nodes[0]]
    procs = [
        subprocess.Popen(
            [
                lab,
                "exec",
                node,
                sys.executable,
                "-m",
                "benchmarks.linkbw",
                str(rank),
                host,
                str(port),
                model,
                str(repeats),
            ]
            + (["--store"] if rank == 0 else []),
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank, node in enumerate(nodes)
    ]
    outs = [p.communicate(timeout=3600)[0] for p in procs]
    if any(p.returncode != 0 for p in procs):
        raise RuntimeError(f"linkbw {model} on {nodes}: a peer failed (exit codes {[p.returncode for p in procs]})")
    return _checked(model, json.loads(outs[1].strip().splitlines()[-1]))


def row(model: str, out: dict[str, Any]) -> dict[str, Any]:
    gb = out["bytes"] / 1e9
    rates = {mode: sorted(gb / s for s in xs) for mode, xs in out["samples"].items()}
    p50 = {mode: statistics.median(r) for mode, r in rates.items()}
    return {
        "model": model,
        "state_mb_per_rank": round(out["bytes"] / 1e6, 1),
        "n": len(out["samples"]["link"]),
        "link_gbps": round(p50["link"], 3),
        "transfer_gbps": round(p50["transfer"], 3),
        "link_gbps_range": [round(rates["link"][0], 3), round(rates["link"][-1], 3)],
        "transfer_gbps_range": [round(rates["transfer"][0], 3), round(rates["transfer"][-1], 3)],
        "transfer_over_link": round(p50["transfer"] / p50["link"], 3),
        "samples_s": {m: [round(s, 5) for s in xs] for m, xs in out["samples"].items()},
    }


def main(args: argparse.Namespace) -> None:
    rows = []
    nodes = tuple(args.lab_nodes.split(",")) if args.lab_nodes else None
    if nodes is not None and len(nodes) != 2:
        raise SystemExit(f"--lab-nodes takes two lab nodes, e.g. node1,node2 (got {args.lab_nodes!r})")
    where = f"lab nodes {nodes[0]} -> {nodes[1]}" if nodes else "loopback"
    for model in args.models.split(","):
        say(f"{model}: {args.repeats} repeats of link and transfer on one gloo pair ({where})")
        out = measure_lab(model, args.repeats, nodes, args.port) if nodes else measure(model, args.repeats)
        rows.append(row(model, out))
    print(f"{'model':<8}{'MB/rank':>9}{'n':>4}{'link GB/s':>12}{'transfer GB/s':>15}{'ratio':>8}")
    for r in rows:
        print(
            f"{r['model']:<8}{r['state_mb_per_rank']:>9.1f}{r['n']:>4}{r['link_gbps']:>12.3f}{r['transfer_gbps']:>15.3f}"
            f"{r['transfer_over_link']:>8.2f}   (link {r['link_gbps_range']}, transfer {r['transfer_gbps_range']})"
        )
    write_json(
        Path(args.json),
        {
            "command": recorded_command("linkbw"),
            "commit": commit(),
            "date": datetime.date.today().isoformat(),
            "endpoints": where,
            "rows": rows,
        },
    )


def _peer_main(argv: list[str]) -> None:
    """``python -m benchmarks.linkbw RANK HOST PORT MODEL REPEATS [--store]``: one end, in a lab node.
    With ``--store`` this process hosts the TCPStore; the receiver prints its samples as one JSON line."""
    import torch.distributed as dist

    rank, host, port, model, repeats = int(argv[0]), argv[1], int(argv[2]), argv[3], int(argv[4])
    store = (
        dist.TCPStore("0.0.0.0", port, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=600))
        if "--store" in argv
        else None
    )
    out = _peer(rank, host, port, model, repeats)
    if out is not None:
        print(json.dumps(out), flush=True)
    del store


if __name__ == "__main__":
    _peer_main(sys.argv[1:])
