"""``bench downtime``: downtime per interruption, tmslurm against the two restarts users run today.

Contract: on the local Slurm cluster (``scripts/local-slurm up``), one model (``small`` with
``torch.compile`` by default, so warm-up is real work) and one layout (DP2 x PP2, one rank per node),
three runs in one go:

- tmslurm: planned migration (``scontrol`` drain), unexpected failure (``--unexpected``:
  ``local-slurm power-off`` of the rank's node by default, silent like a real power loss, or
  ``kill-node``), hang (SIGSTOP of a rank), the ``--events`` chosen, each repeated ``--repeats`` times; the benchmark plays the admin and
  brings each node back after the event (resume, revive) so the spare pool refills;
- in-job restart (``runtime.restart_mode=injob_restart``, torchrun/elastic style) and requeue
  restart (``runtime.restart_mode=requeue_restart``, submitit/Lightning style): the same planned
  (drain) and unexpected (SIGKILL of a rank) events, with a checkpoint every K steps, each event
  injected in the middle of a checkpoint interval.
It prints each event with its parts, medians, and the ratios baseline / tmslurm, and writes
``docs/bench/downtime.json``. Failures to drive Slurm raise TmslurmError with the run directory.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from tmslurm.bench.common import SlurmJob, local_slurm, median, resume_node, say, sh, write_json

TM_PARTS = ("detect_s", "pick_s", "phase1_s", "phase2_s", "transfer_s", "first_step_s")
RS_PARTS = ("detect_s", "stop_s", "reschedule_s", "startup_s", "group_setup_s", "ckpt_load_s", "redo_s")


def base_overrides(args: Any) -> list[str]:
    out = ["parallel.dp=2", "parallel.pp=2", f"model={args.model}", f"model.compile={str(args.compile).lower()}",
           "train.steps=1000000", "slurm.partition=debug", "slurm.time=02:00:00", "slurm.poll_interval_s=0.5",
           f"runtime.heartbeat_timeout_s={args.heartbeat_timeout}"]
    return out


def _row(event: str, strategy: str, repeat: int, ev: dict[str, Any], t_inject: float) -> dict[str, Any]:
    parts = {k: ev.get(k) for k in (TM_PARTS if strategy == "tmslurm" else RS_PARTS) if ev.get(k) is not None}
    if isinstance(ev.get("notice_t"), (int, float)):
        # detection measured from the moment the benchmark injected the event (the run cannot know it)
        parts["detect_s"] = max(0.0, ev["notice_t"] - t_inject)
    row = {"event": event, "strategy": strategy, "repeat": repeat, "downtime_s": ev.get("downtime_s"),
           "gap_s": ev.get("gap_s"), "parts": parts, "ranks": ev.get("ranks"), "node": ev.get("node"),
           "lost_steps": ev.get("lost_steps")}
    say(f"{strategy:<16} {event:<10} #{repeat}: downtime {row['downtime_s']:.3f}s  " +
        " ".join(f"{k[:-2]}={v:.3f}" for k, v in parts.items() if isinstance(v, (int, float))))
    return row


def run_tmslurm(out: Path, args: Any) -> list[dict[str, Any]]:
    job = SlurmJob(out / "tmslurm", base_overrides(args) + ["standby.count=2"])
    job.wait(lambda st: st.get("step", 0) >= 3, 1800, "training to start")
    job.warm_pool(1, timeout=1800)
    rows, n = [], 0
    for rep in range(args.repeats):
        for event in args.events.split(","):
            before = job.done_count()
            rank = 1 + n % 3  # rank 0 runs on the batch host
            node, pid = job.node_of_rank(rank)
            say(f"tmslurm {event} #{rep}: rank {rank} on {node}")
            t_inject = time.time()
            if event == "planned":
                sh("scontrol", "update", f"nodename={node}", "state=drain", "reason=bench-maintenance")
            elif event == "unexpected":
                local_slurm(args.unexpected, node)
            else:
                os.kill(pid, signal.SIGSTOP)
            n += 1
            rows.append(_row(event, "tmslurm", rep, job.wait_event(before, t_inject), t_inject))
            _bring_back(event, node, args.unexpected)
            job.warm_pool(1, timeout=1800)
    summary = job.stop()
    return rows + [{"summary_median_step_s": summary["median_step_s"], "strategy": "tmslurm", "event": "_run",
                    "final_params_sha256": summary["final_params_sha256"]}]


def _bring_back(event: str, node: str, unexpected: str = "kill-node") -> None:
    """Play the admin: maintenance done, node repaired."""
    if event == "planned":
        deadline = time.monotonic() + 60
        while "drained" not in sh("sinfo", "-h", "-n", node, "-o", "%T").lower() and time.monotonic() < deadline:
            time.sleep(0.5)
        resume_node(node)
    elif event == "unexpected":
        local_slurm("power-on" if unexpected == "power-off" else "revive-node", node)
        resume_node(node)


def run_restart(out: Path, args: Any, mode: str) -> list[dict[str, Any]]:
    k = args.checkpoint_every
    job = SlurmJob(out / mode, base_overrides(args) + [f"runtime.restart_mode={mode}", "standby.count=0",
                                                       f"train.checkpoint_every={k}"])
    rows, n = [], 0
    for rep in range(args.repeats_restart):
        for event in ("planned", "unexpected"):
            st = job.wait(lambda s: s.get("mode") == "running" and s.get("step", 0) >= k + k // 2 and s["step"] % k == k // 2,
                          3600, "the middle of a checkpoint interval")
            rank = 1 + n % 3
            node, pid = job.node_of_rank(rank)
            before = job.done_count()
            say(f"{mode} {event} #{rep}: rank {rank} on {node} at step {st['step']}")
            t_inject = time.time()
            if event == "planned":
                sh("scontrol", "update", f"nodename={node}", "state=drain", "reason=bench-maintenance")
            else:
                os.kill(pid, signal.SIGKILL)
            n += 1
            ev = job.wait_event(before, t_inject, timeout=3600)
            rows.append(_row(event, mode, rep, ev, t_inject))
            if event == "planned":
                resume_node(node)
    summary = job.stop()
    return rows + [{"summary_median_step_s": summary["median_step_s"], "strategy": mode, "event": "_run",
                    "final_params_sha256": summary["final_params_sha256"]}]


def medians(rows: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    out: dict[str, dict[str, float | None]] = {}
    for r in rows:
        if r["event"].startswith("_"):
            continue
        out.setdefault(r["strategy"], {}).setdefault(r["event"], [])  # type: ignore[arg-type]
        out[r["strategy"]][r["event"]].append(r["downtime_s"])  # type: ignore[union-attr]
    return {s: {e: median(v) for e, v in d.items()} for s, d in out.items()}  # type: ignore[arg-type]


def spread(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per strategy and event: n, p50, p90 of the downtime and of detection, and every sample."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        if not r["event"].startswith("_") and r["downtime_s"] is not None:
            cell = out.setdefault(r["strategy"], {}).setdefault(r["event"], {"samples": [], "detect": []})
            cell["samples"].append(r["downtime_s"])
            cell["detect"].append(r["parts"].get("detect_s"))
    for cells in out.values():
        for cell in cells.values():
            xs, ds = sorted(cell["samples"]), sorted(d for d in cell["detect"] if d is not None)
            cell.update(n=len(xs), p50=_pct(xs, 50), p90=_pct(xs, 90), detect_p50=_pct(ds, 50), detect_p90=_pct(ds, 90))
    return out


def _pct(xs: list[float], q: float) -> float | None:
    """Nearest-rank percentile of sorted ``xs``."""
    return xs[max(0, min(len(xs) - 1, -(-len(xs) * q // 100) - 1))] if xs else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def table(result: dict[str, Any]) -> str:
    m = result["medians"]
    lines = [f"{'event':<11}{'tmslurm':>10}{'in-job restart':>16}{'requeue restart':>17}{'in-job/tm':>11}{'requeue/tm':>12}"]
    for ev in ("planned", "unexpected", "hang"):
        tm = m.get("tmslurm", {}).get(ev)
        ij = m.get("injob_restart", {}).get(ev)
        rq = m.get("requeue_restart", {}).get(ev)
        f = lambda x: "-" if x is None else f"{x:.2f}s"  # noqa: E731
        r = lambda a, b: "-" if ratio(a, b) is None else f"{ratio(a, b):.0f}x"  # noqa: E731
        lines.append(f"{ev:<11}{f(tm):>10}{f(ij):>16}{f(rq):>17}{r(ij, tm):>11}{r(rq, tm):>12}")
    lines.append("")
    lines.append("median parts per strategy and event (seconds):")
    for strategy in ("tmslurm", "injob_restart", "requeue_restart"):
        for ev in ("planned", "unexpected", "hang"):
            rows = [r for r in result["rows"] if r["strategy"] == strategy and r["event"] == ev]
            if not rows:
                continue
            keys = TM_PARTS if strategy == "tmslurm" else RS_PARTS
            parts = {k: median([r["parts"].get(k) for r in rows]) for k in keys}
            lines.append(f"  {strategy:<16}{ev:<11}" + " ".join(f"{k[:-2]}={v:.3f}" for k, v in parts.items() if v is not None))
    return "\n".join(lines)


def main(args: Any) -> dict[str, Any]:
    out = Path(args.out).resolve()
    rows: list[dict[str, Any]] = []
    for strategy in args.strategies.split(","):
        say(f"== {strategy}")
        rows += run_tmslurm(out, args) if strategy == "tmslurm" else run_restart(out, args, strategy)
    m = medians(rows)
    tm = m.get("tmslurm", {})
    result = {
        "setup": {"model": args.model, "compile": args.compile, "layout": "DP2 x PP2, one rank per node",
                  "checkpoint_every": args.checkpoint_every, "repeats": args.repeats, "repeats_restart": args.repeats_restart,
                  "cluster": "local Slurm (scripts/local-slurm), 6 nodes on one 2-core host",
                  "baseline_unexpected_event": f"SIGKILL of a rank process (tmslurm: {args.unexpected} of its node)",
                  "events": args.events,
                  "injob_restart_planned": "ranks restart on the same nodes (the draining node included)"},
        "rows": rows, "medians": m, "spread": spread(rows),
        "tmslurm_planned_median_s": tm.get("planned"), "tmslurm_unexpected_median_s": tm.get("unexpected"),
        "tmslurm_hang_median_s": tm.get("hang"),
        "ratio_planned": ratio(m.get("injob_restart", {}).get("planned"), tm.get("planned")),
        "ratio_unexpected": ratio(m.get("injob_restart", {}).get("unexpected"), tm.get("unexpected")),
        "ratio_planned_requeue": ratio(m.get("requeue_restart", {}).get("planned"), tm.get("planned")),
        "ratio_unexpected_requeue": ratio(m.get("requeue_restart", {}).get("unexpected"), tm.get("unexpected")),
    }
    print(table(result))
    for strategy, cells in result["spread"].items():
        for ev, c in cells.items():
            say(f"{strategy} {ev}: n={c['n']} downtime p50 {c['p50']:.3f}s p90 {c['p90']:.3f}s; "
                f"detect p50 {c['detect_p50']}, p90 {c['detect_p90']}")
    write_json(Path(args.json), result)
    return result
