"""``bench downtime``: downtime per interruption on the failure lab, tmslurm against fair restart baselines.

Contract: on the local Slurm cluster (``scripts/local-slurm up``), one model (``small`` with
``torch.compile`` by default, so warm-up is real work), one layout (DP2 x PP2, one rank per node)
and a checkpoint every ``--checkpoint-every`` steps for every strategy:

- ``reference``: an uninterrupted run with the same ranks; its median step is the one reference
  step subtracted from every strategy's gaps (``downtime = gap - reference step``);
- ``tmslurm`` (two warm standbys): the events of ``--events`` (dtstats.TM_EVENTS): admin drain,
  silent power-off, partition, SIGKILL and SIGSTOP of a rank, drain and power-off of the batch host;
- ``injob_restart`` / ``requeue_restart`` (``bench.restart_mode``): ``--restart-events``; a planned
  event checkpoints at the next step and restarts (nothing lost), an unexpected one pays the same
  detection as tmslurm (same node monitors and heartbeats). The in-job restart gets one spare
  allocation per event that takes a node away (a restart needs somewhere to run), and Slurm's own
  fixed requeue delay (``EligibleTime`` - requeue time) is recorded per requeue.

Each event is injected at a random step of a checkpoint interval (seeded, recorded); the benchmark
plays the admin afterwards (resume, power-on, heal) and waits until every running standby is warm
again, so no event overlaps another's warm-up. ``--repeats`` events per cell; rows go to
``--json`` (merged with the cells already there unless ``--fresh``), with p50/p90, ratios, the
command, the commit and the date. After each event a progress line (:func:`benchmarks.common.progress`:
events done / total, cells finished, elapsed, remaining) goes to stdout with the benchmark's log; the
reference run is not counted. Failures to drive Slurm raise TmslurmError naming the run.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks import dtstats
from benchmarks.common import (
    SlurmJob,
    commit,
    local_slurm,
    progress,
    recorded_command,
    resume_node,
    say,
    sh,
    write_json,
)
from tmslurm.agent.monitor import is_agent_of
from tmslurm.core.errors import TmslurmError
from tmslurm.core.progress import Progress
from tmslurm.slurm.lab import fault_moment

LEAVES = ("planned", "power-off", "partition", "bh-drain", "bh-power-off")
"""Events after which the victim's node has to be brought back by the admin."""


def base_overrides(args: Any) -> list[str]:
    return [
        "parallel.dp=2",
        "parallel.pp=2",
        f"model={args.model}",
        f"model.compile={str(args.compile).lower()}",
        "train.steps=1000000",
        f"train.checkpoint_every={args.checkpoint_every}",
        "slurm.partition=debug",
        "slurm.time=03:00:00",
        "slurm.poll_interval_s=0.5",
    ] + ([] if args.heartbeat_timeout is None else [f"detect.heartbeat_timeout_s={args.heartbeat_timeout}"])


def reference(out: Path, args: Any) -> dict[str, Any]:
    """The median step of an uninterrupted run with the same ranks (no standbys)."""
    job = SlurmJob(out / "reference", base_overrides(args) + ["standby.count=0"])
    job.wait(lambda st: st.get("step", 0) >= args.reference_steps, 3600, f"{args.reference_steps} steps")
    s = job.stop()
    say(f"reference step: median {s['median_step_s']:.4f}s over the run ({s.get('steps')} steps)")
    return {
        "median_step_s": s["median_step_s"],
        "steps": s.get("steps"),
        "final_params_sha256": s["final_params_sha256"],
    }


def run_strategy(
    out: Path,
    args: Any,
    strategy: str,
    events: list[str],
    ref_step: float,
    save: Callable[[list[dict[str, Any]]], None],
    prog: Progress,
) -> list[dict[str, Any]]:
    """Every event of ``strategy`` in one run; ``save(rows so far)`` and a progress line after each event."""
    over = base_overrides(args)
    if strategy == "tmslurm":
        over.append("standby.count=2")
    else:  # spare allocations for restarts off a node that left (none for a requeue: it gets a new allocation)
        takes = sum(1 for e in events if e in LEAVES) * args.repeats if strategy == "injob_restart" else 0
        over += [f"bench.restart_mode={strategy}", f"standby.count={min(takes + 1, 24) if takes else 0}"]
    job = SlurmJob(out / strategy, over)
    job.wait(lambda st: st.get("step", 0) >= 3, 1800, "training to start")
    pool = 2 if strategy == "tmslurm" else None if strategy == "injob_restart" else 0  # a requeue has no spares
    settle(job, pool)
    rng = random.Random(f"{args.seed}-{strategy}")
    measured = commit()
    rows: list[dict[str, Any]] = []
    seen: set[tuple[Any, Any]] = {_key(e) for e in job.events_done(job.status())}
    for rep in range(args.repeats):
        for i, event in enumerate(events):
            rank = 0 if event.startswith("bh-") else 1 + (rep + i) % 3  # rank 0's node is the batch host: its own cells
            offset = rng.randrange(args.checkpoint_every)
            step = at_offset(job, args.checkpoint_every, offset)
            node, pid = job.node_of_rank(rank)
            say(
                f"{strategy} {event} #{rep}: rank {rank} on {node} at step {step} "
                f"(offset {step % args.checkpoint_every})"
            )
            t_start = time.time()
            t_inject = inject(event, node, pid, job.run_dir)
            ev = wait_new(job, seen, t_start, strategy, None if event.startswith("bh-") else rank)
            delay = fixed_delay(job.job_id, ev) if "requeue" in str(ev.get("kind")) else None
            row = dtstats.make_row(
                strategy,
                event,
                rep,
                ev,
                ref_step_s=ref_step,
                t_inject=t_inject,
                inject_step=step,
                offset=step % args.checkpoint_every,
                fixed_delay_s=delay,
            )
            row.update(commit=measured, date=time.strftime("%Y-%m-%d"))
            say(dtstats.describe(row))
            rows.append(row)
            save(rows)
            if rep == args.repeats - 1:
                prog.count("cells")
            prog.advance(note=f"{strategy} {event} #{rep}")
            bring_back(event, node, job.run_dir)
            settle(job, pool)
    summary = job.stop()
    say(f"{strategy}: median step {summary['median_step_s']:.4f}s, final hash {summary['final_params_sha256'][:12]}")
    return rows


def at_offset(job: SlurmJob, k: int, offset: int, timeout: float = 600) -> int:
    """Wait for a commit at ``offset`` (or the step after) within a checkpoint interval, past the first one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = job.status()
        step = st.get("step", 0) if st.get("mode") == "running" else -1
        if step > k and (step - offset) % k < 2:
            return int(step)
        time.sleep(0.03)
    raise TmslurmError(f"run {job.run_dir}: no commit at offset {offset} of an interval within {timeout:.0f}s")


def _is_rank_of(pid: int, run_dir: Path) -> bool:
    """Whether ``pid`` is a training agent of ``run_dir``, the run this benchmark submitted (Slurm
    started it; the lab's nodes share this host's pid namespace): the node monitor's own check,
    :func:`~tmslurm.agent.monitor.is_agent_of`, plus a rank's flag or a standby's (a standby that
    took a rank over keeps its ``--standby`` command line); never a node monitor."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return is_agent_of(pid, run_dir) and (b"--rank" in argv or b"--standby" in argv)


def inject(event: str, node: str, pid: int, run_dir: Path) -> float:
    """Cause ``event``; returns its moment: the lab's ``at=`` (when the node froze or its link went
    down, after the script started), else the time right before the command or signal."""
    t = time.time()
    if event in ("planned", "bh-drain"):
        sh("scontrol", "update", f"nodename={node}", "state=drain", "reason=bench-maintenance")
    elif event in ("power-off", "bh-power-off", "partition"):
        return fault_moment(local_slurm("power-off" if event != "partition" else "partition", node)) or t
    elif event in ("sigkill", "sigstop"):  # the rank's pid comes from its agent id, checked against /proc
        if not _is_rank_of(pid, run_dir):
            raise TmslurmError(f"pid {pid} on {node} is not a rank agent of {run_dir}; not signalled")
        t = time.time()
        os.kill(pid, signal.SIGKILL if event == "sigkill" else signal.SIGSTOP)
    else:
        raise TmslurmError(f"unknown event {event!r}; valid: {', '.join(dtstats.TM_EVENTS)}")
    return t


def wait_new(
    job: SlurmJob, seen: set[tuple[Any, Any]], t_inject: float, strategy: str, rank: int | None
) -> dict[str, Any]:
    """The first completed event not seen before whose first step committed after the injection and
    that involves ``rank`` (None: any); other events (a drain Slurm made itself) are skipped, logged."""

    def new(st: dict[str, Any]) -> list[dict[str, Any]]:
        fresh = [e for e in job.events_done(st) if _key(e) not in seen and (e.get("first_step_t") or 0) > t_inject]
        for e in [e for e in fresh if rank is not None and rank not in (e.get("ranks") or [])]:
            say(
                f"skipping an event the benchmark did not inject: {e.get('kind')} ranks={e.get('ranks')} "
                f"({e.get('cause')})"
            )
            seen.add(_key(e))
        return [e for e in fresh if _key(e) not in seen]

    st = job.wait(lambda s: bool(new(s)), 1800, f"the {strategy} event to complete")
    ev = new(st)[0]
    seen.add(_key(ev))
    return ev


def _key(ev: dict[str, Any]) -> tuple[Any, Any]:
    return ev.get("kind"), ev.get("first_step_t")


def fixed_delay(job_id: str, ev: dict[str, Any]) -> float | None:
    """Slurm's fixed requeue delay for this requeue: its EligibleTime minus the requeue time."""
    requeue_t = ev.get("requeue_t")
    out = sh("scontrol", "show", "job", "-o", job_id, check=False)
    eligible = next((f.split("=", 1)[1] for f in out.split() if f.startswith("EligibleTime=")), None)
    if not isinstance(requeue_t, (int, float)) or not eligible or eligible in ("None", "Unknown"):
        say(f"no fixed requeue delay for job {job_id} (EligibleTime={eligible}, requeue_t={requeue_t})")
        return None
    return max(0.0, datetime.strptime(eligible, "%Y-%m-%dT%H:%M:%S").timestamp() - requeue_t)


def bring_back(event: str, node: str, run_dir: Path, timeout: float = 300) -> None:
    """Play the admin: maintenance done, node repaired, link mended; the node is usable again. A
    silent node is repaired only once Slurm has flagged it (not responding or down) and the run has
    seen that (``spawner.json``: a node found dead that Slurm never flagged stays suspect to it)."""
    if event in ("power-off", "bh-power-off", "partition"):
        deadline = time.monotonic() + timeout
        while not any(
            f in sh("sinfo", "-h", "-n", node, "-o", "%T").lower() for f in ("*", "down", "not_responding")
        ) or (event != "bh-power-off" and node in _unconfirmed(run_dir)):
            if time.monotonic() > deadline:
                raise TmslurmError(f"Slurm did not flag {node}, or run {run_dir} did not see it, within {timeout:.0f}s")
            time.sleep(0.5)
        local_slurm("power-on" if event != "partition" else "heal", node)
    if event in LEAVES:
        resume_node(node)


def _drained_by_slurm() -> list[str]:
    """Nodes drained with a reason the benchmark did not give (its own is ``bench-maintenance``)."""
    out = sh("sinfo", "-h", "-R", "-N", "-o", "%N|%E", check=False)
    return [
        n
        for n, reason in (line.split("|", 1) for line in out.splitlines() if "|" in line)
        if reason.strip() and reason.strip() != "bench-maintenance"
    ]


def _idle_nodes() -> list[str]:
    """Nodes a pending job could start on now (``sinfo -t idle`` also lists IDLE+DRAIN ones)."""
    return [
        line.split()[0]
        for line in sh("sinfo", "-h", "-N", "-t", "idle", "-o", "%N %T", check=False).splitlines()
        if line.split()[1:] == ["idle"]
    ]


def _free_spares(run_dir: Path, running: list[str]) -> int:
    """Running spare jobs whose node the run knows and that no restarted rank uses (``spawner.json``)."""
    try:
        spares = json.loads((run_dir / "spawner.json").read_text()).get("spares", {})
    except (OSError, ValueError):
        return 0
    return sum(1 for j, s in spares.items() if j in running and s.get("node") and not s.get("used_for_restart"))


def _unconfirmed(run_dir: Path) -> list[str]:
    try:
        return list(json.loads((run_dir / "spawner.json").read_text()).get("unconfirmed", []))
    except (OSError, ValueError):
        return []


def settle(job: SlurmJob, pool: int | None, timeout: float = 900) -> None:
    """Wait until no spare job is pending while a node is free (a returned node is taken again), the
    standby pool is whole (``pool`` standbys; None: one per running spare job, for restarts, whose
    standbys are never used up) and every standby has warmed up every role: the next event overlaps
    nobody's start-up."""
    deadline = time.monotonic() + timeout
    for node in _drained_by_slurm():  # e.g. "Kill task failed" after a thawed node: the admin resumes it
        say(f"resuming {node}, drained by Slurm itself")
        resume_node(node)
    while sh("squeue", "-h", "-t", "PD", "-o", "%i", check=False).strip() and _idle_nodes():
        if time.monotonic() > deadline:
            raise TmslurmError(f"run {job.run_dir}: a spare job stays pending although a node is idle")
        time.sleep(0.5)

    def whole(st: dict[str, Any]) -> bool:
        if not _pool_warm(st):
            return False
        have = len(st.get("standbys", []))
        if pool is None:  # restarts: a standby for every running spare job, and one spare no rank uses yet
            running = [j for j in sh("squeue", "-h", "-t", "R", "-o", "%i").split() if j != job.job_id]
            return have >= len(running) and _free_spares(job.run_dir, running) >= 1
        return have >= pool

    job.wait(whole, max(1.0, deadline - time.monotonic()), "the standby pool whole and warm")


def _pool_warm(st: dict[str, Any]) -> bool:
    roles = {r["role"] for r in st.get("ranks", [])}
    standbys = st.get("standbys", [])
    return st.get("mode") == "running" and all(len(s["roles"]) >= len(roles) for s in standbys)


def event_plan(args: Any) -> list[tuple[str, list[str]]]:
    """Each strategy of ``--strategies`` but the reference run, in order, with its events."""
    return [
        (s, (args.events if s == "tmslurm" else args.restart_events).split(","))
        for s in args.strategies.split(",")
        if s != "reference"
    ]


def main(args: Any) -> dict[str, Any]:
    out, path = Path(args.out).resolve(), Path(args.json)
    old = {} if args.fresh or not path.exists() else json.loads(path.read_text())
    strategies = args.strategies.split(",")
    # a file of the old format (no reference run) is replaced whole, and so is one whose reference is measured again
    old = old if "reference" in old and "reference" not in strategies else {}
    ref = reference(out, args) if "reference" in strategies or not old else old["reference"]
    command = recorded_command("downtime")
    commands = [*[c for c in old.get("commands", []) if c != command], command]
    rows: list[dict[str, Any]] = old.get("rows", [])
    result: dict[str, Any] = {}
    plan = event_plan(args)
    prog = progress("downtime", sum(len(events) for _, events in plan) * args.repeats, "events")
    prog.count("cells", 0)
    for strategy, events in plan:
        say(f"== {strategy}: {', '.join(events)} x {args.repeats}")
        before = rows

        def combine(new: list[dict[str, Any]], before: list[dict[str, Any]] = before) -> list[dict[str, Any]]:
            return before + new if args.append else dtstats.merge(before, new)

        def save(new: list[dict[str, Any]]) -> None:
            write_json(path, _result(args, commands, ref, combine(new)))  # a later failure loses nothing measured

        rows = combine(run_strategy(out, args, strategy, events, ref["median_step_s"], save, prog))
        result = _result(args, commands, ref, rows)
    result = result or _result(args, commands, ref, rows)
    print(dtstats.table(result))
    write_json(path, result)
    return result


def _runs(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per strategy: the commit(s) and date(s) its rows were measured at."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        run = out.setdefault(r["strategy"], {"commits": [], "dates": [], "events": 0})
        for key, value in (("commits", r.get("commit")), ("dates", r.get("date"))):
            if value not in run[key]:
                run[key].append(value)
        run["events"] += 1
    return out


def _result(args: Any, commands: list[str], ref: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    cs = dtstats.cells(rows)
    result: dict[str, Any] = {
        "commands": commands,
        "commit": commit(),
        "date": time.strftime("%Y-%m-%d"),
        "reference": ref,
        "setup": {
            "model": args.model,
            "compile": args.compile,
            "layout": "DP2 x PP2, one rank per node",
            "checkpoint_every": args.checkpoint_every,
            "repeats": args.repeats,
            "seed": args.seed,
            "heartbeat_timeout_s": args.heartbeat_timeout,
            "cluster": "local Slurm (scripts/local-slurm), 6 nodes on one 2-core host",
            "downtime": "gap (commit before -> first commit after) - the reference run's median step",
        },
        "runs": _runs(rows),
        "rows": rows,
        "cells": cs,
        "ratios": dtstats.ratios(cs),
    }
    result.update(result["ratios"])
    for kind, event in (("planned", "planned"), ("unexpected", "power-off")):  # what `bench project` reads
        result[f"tmslurm_{kind}_median_s"] = cs.get("tmslurm", {}).get(event, {}).get("p50")
    return result
