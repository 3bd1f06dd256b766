"""``python -m benchmarks watcher``: what the Slurm watcher's poll costs against a cluster that
defines many nodes.

Contract: needs a running local cluster (``scripts/local-slurm up``; for many defined nodes
``scripts/local-slurm up --ghost-nodes 1018``: defined, DOWN, never started) and ``SLURM_CONF`` set
(``eval "$(scripts/local-slurm env)"``). It watches every node Slurm defines (``--watch`` caps the
count) and measures, in one run, side by side:

- ``batched``: the watcher's own poll (:meth:`~tmslurm.slurm.watcher.SlurmWatcher.poll_once`: one
  ``scontrol -o show node <hostlist>`` for all watched nodes plus one ``scontrol -o show res``),
  ``--polls`` times;
- ``per_node``: one ``scontrol -o show node NAME`` per watched node (what a naive poller does),
  ``--per-node-polls`` times;

each as wall time per poll (p50, p90, every sample) and slurmctld's CPU time per poll (user+system
ticks of its process over the polls, minus its idle rate measured over an equal quiet window
before). Prints a table and writes ``--json``. A missing cluster or a Slurm error raises
SystemExit with the reason.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import say, write_json
from tmslurm.core.errors import SlurmError
from tmslurm.slurm.client import CliSlurmClient
from tmslurm.slurm.watcher import NodeWatch, SlurmWatcher

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def slurmctld_pid() -> int:
    out = subprocess.run(["pgrep", "-x", "slurmctld"], capture_output=True, text=True).stdout.split()
    if len(out) != 1:
        raise SystemExit(f"expected one slurmctld, found {len(out)}: start the lab (scripts/local-slurm up)")
    return int(out[0])


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S  # utime + stime


def defined_nodes() -> list[str]:
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f'sinfo failed: {out.stderr.strip()} (is SLURM_CONF set? eval "$(scripts/local-slurm env)")')
    return sorted(set(out.stdout.split()))


def measure(name: str, poll: Callable[[], Any], polls: int, pid: int, idle_rate: float) -> dict[str, Any]:
    walls = []
    c0, t0 = cpu_s(pid), time.perf_counter()
    for i in range(polls):
        w0 = time.perf_counter()
        poll()
        walls.append(time.perf_counter() - w0)
        say(f"  {name} poll {i + 1}/{polls}: {walls[-1] * 1000:.1f} ms")
    elapsed, cpu = time.perf_counter() - t0, cpu_s(pid) - c0
    qs = statistics.quantiles(walls, n=10) if len(walls) > 1 else walls * 9
    return {
        "mode": name,
        "polls": polls,
        "wall_ms_p50": 1000 * statistics.median(walls),
        "wall_ms_p90": 1000 * qs[8],
        "wall_ms": [round(1000 * w, 2) for w in walls],
        "ctld_cpu_ms_per_poll": 1000 * max(0.0, cpu - idle_rate * elapsed) / polls,
        "ctld_cpu_ms_raw": 1000 * cpu,
        "elapsed_s": elapsed,
    }


def main(args: argparse.Namespace) -> None:
    pid = slurmctld_pid()
    nodes = defined_nodes()[: args.watch or None]
    client = CliSlurmClient(timeout_s=60.0)
    watcher = SlurmWatcher(client, NodeWatch({n: "main" for n in nodes}), interval_s=3600.0, on_notice=lambda n: None)
    say(f"slurmctld pid {pid}; watching {len(nodes)} of the defined nodes")
    c0 = cpu_s(pid)
    time.sleep(args.idle_s)
    idle_rate = (cpu_s(pid) - c0) / args.idle_s
    say(f"slurmctld idle: {1000 * idle_rate:.1f} ms CPU per second")

    def per_node() -> None:
        for n in nodes:
            client.nodes([n])

    try:
        rows = [
            measure("batched", watcher.poll_once, args.polls, pid, idle_rate),
            measure("per_node", per_node, args.per_node_polls, pid, idle_rate),
        ]
    except SlurmError as exc:
        raise SystemExit(f"a Slurm query failed: {exc}") from None
    for r in rows:
        r["watched_nodes"] = len(nodes)
    b, p = rows
    say(f"\n{'mode':<10}{'nodes':>7}{'polls':>7}{'wall p50':>11}{'wall p90':>11}{'ctld CPU/poll':>15}")
    for r in rows:
        say(
            f"{r['mode']:<10}{r['watched_nodes']:>7}{r['polls']:>7}{r['wall_ms_p50']:>9.1f}ms{r['wall_ms_p90']:>9.1f}ms"
            f"{r['ctld_cpu_ms_per_poll']:>13.1f}ms"
        )
    say(f"per-node / batched: wall {p['wall_ms_p50'] / b['wall_ms_p50']:.0f}x")
    write_json(
        Path(args.json),
        {
            "defined_nodes": len(defined_nodes()),
            "idle_ctld_cpu_ms_per_s": 1000 * idle_rate,
            "tick_ms": 1000 * TICK_S,
            "rows": rows,
            "date": time.strftime("%Y-%m-%d"),
        },
    )
