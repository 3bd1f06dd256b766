"""``python -m benchmarks chaos``: random faults on the failure lab for ``--minutes``, then the chaos checker.

Contract: on the local Slurm cluster (``scripts/local-slurm up``, 6 nodes or more), one ``cluster=slurm`` run
(DP2 x PP2, ``--model``, two warm standbys replenished, ``gray.evict=true``, a checkpoint
every ``--checkpoint-every`` steps, steps paced by ``--step-delay``) takes a fault every
``--min-gap``..``--max-gap`` seconds (uniform, seeded by ``--seed``) for ``--minutes`` once both
standbys are warm. Kinds (:data:`benchmarks.chaosfaults.KINDS`) come from a shuffled bag, so every
kind comes up equally often; a kind that cannot strike now (a second slurmctld outage, a controller
kill before the previous one was adopted, a node fault with no eligible node) waits for a later
draw. Node faults never hit the batch host (its loss is a requeue: bench downtime measures it).
Faults land whenever the controller answers, including during a recovery. The benchmark repairs
as an admin would (:mod:`benchmarks.chaosfaults`). At the end it undoes every fault, waits for the
pool to be whole and warm (at most :data:`POOL_WAIT_S`, then only for no event in flight), stops the run, waits for
every process it started (through Slurm) to be gone, runs the uninterrupted reference (``cluster=local``, the same
number of steps) and checks the run with :func:`tmslurm.tools.chaoscheck.check_run` (the driver's faults, the pids of
every agent and monitor the journal recorded, the reference's hashes). It prints a line per fault and repair, a progress
line per fault, the checker's report, and writes ``--json``: faults by kind, events by kind, switches, checkpoint
fallbacks, downtime p50/p90/max, false alarms, leftover processes, every check, ``passed``, the fault list, the command,
the commit and the date.

Failure behaviour: a run that ends early or does not settle raises
:class:`~tmslurm.core.errors.TmslurmError` after the lab is healed (every unrepaired fault undone);
a checker failure is reported in the result (``passed: false``, exit status 1), not raised.
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.chaosfaults import KINDS, NODE_FAULTS, Injected, controller_pid, inject, needs_slurm, repair, repair_due
from benchmarks.common import SlurmJob, commit, progress, recorded_command, run_local, say, sh, write_json
from tmslurm.controller.journal import read_journal
from tmslurm.core.errors import TmslurmError
from tmslurm.tools.chaoscheck import InjectedFault, check_run, format_report, read_reference

SETTLE_S = 900.0
POOL_WAIT_S = 90.0
"""How long the end waits for both standbys to be warm again before it settles for no event in flight
(a spare starts and warms in ~15 s when a node is free; on a small lab restarted ranks may hold them all)."""


def overrides(args: argparse.Namespace) -> list[str]:
    return [
        "parallel.dp=2",
        "parallel.pp=2",
        f"model={args.model}",
        "standby.count=2",
        "standby.replenish=true",
        "gray.evict=true",
        f"runtime.controller_restarts={args.max_controller_kills + 1}",
        f"train.checkpoint_every={args.checkpoint_every}",
        f"bench.step_delay_s={args.step_delay}",
        "train.steps=100000000",
        "slurm.partition=debug",
        f"slurm.time={args.slurm_time}",
        "slurm.poll_interval_s=0.5",
    ]


def lab_nodes() -> int:
    return len(set(sh("sinfo", "-h", "-N", "-o", "%N", check=False, timeout=30).split()))


def batch_host(job_id: str) -> str | None:
    out = sh("scontrol", "show", "job", "-o", job_id, check=False, timeout=30)
    return next((f.split("=", 1)[1] for f in out.split() if f.startswith("BatchHost=")), None)


class Chaos:
    """The soak's state: the run, the random source, the faults so far and the bag of kinds."""

    def __init__(
        self, job: SlurmJob, args: argparse.Namespace, host: str | None, controller_alive: Callable[[], bool]
    ) -> None:
        self.job = job
        self.controller_alive = controller_alive
        self.args = args
        self.rng = random.Random(args.seed)
        self.kinds = [k for k in args.kinds.split(",") if k]
        unknown = sorted(set(self.kinds) - set(KINDS))
        if unknown:
            raise TmslurmError(f"--kinds: unknown {unknown}; valid: {', '.join(KINDS)}")
        self.bag: list[str] = []
        self.faults: list[Injected] = []
        self.host = host

    def outage(self) -> bool:
        return any(needs_slurm(f) for f in self.faults)

    def faulty_nodes(self) -> set[str]:
        return {n for f in self.faults if not f.repaired for n in f.nodes}

    def victims(self, kind: str, st: dict[str, Any]) -> list[dict[str, Any]] | None:
        """Ranks a fault of ``kind`` may hit now (None: it cannot strike now)."""
        bad = self.faulty_nodes()
        ranks = [r for r in st.get("ranks", []) if r.get("alive") and r.get("agent") and r.get("node") not in bad]
        if kind in NODE_FAULTS:
            ranks = [r for r in ranks if r["node"] != self.host]
        if kind == "controller_kill":
            kills = sum(1 for f in self.faults if f.kind == kind)
            ok = kills < self.args.max_controller_kills and handled_kills(st) >= kills and self.controller_alive()
            return [] if ok and not self.outage() else None
        if kind == "slurmctld_stop":
            return [] if not self.outage() else None
        if kind == "drain" and self.outage():
            return None
        if kind == "power_off2":
            first = self.rng.sample(ranks, len(ranks))
            for a in first:
                b = next((r for r in first if r["role"] != a["role"] and r["node"] != a["node"]), None)
                if b is not None:
                    return [a, b]
            return None
        return [self.rng.choice(ranks)] if ranks else None

    def draw(self, st: dict[str, Any]) -> tuple[str, list[dict[str, Any]]] | None:
        """The first kind of the bag that can strike now, with its victims; when none can, a new
        round of every kind joins the bag (the ones waiting stay first in line)."""
        for refill in (not self.bag, True):
            if refill:
                self.bag += self.rng.sample(self.kinds, len(self.kinds))
            for i, kind in enumerate(self.bag):
                v = self.victims(kind, st)
                if v is not None:
                    del self.bag[i]
                    return kind, v
        return None

    def repairs(self, st: dict[str, Any], force: bool = False) -> None:
        """Repair what is due (nothing but the outage itself while slurmctld is stopped)."""
        for f in self.faults:
            if f.repaired or (self.outage() and f.kind != "slurmctld_stop"):
                continue
            if repair_due(f, self.job.run_dir, st, force):
                repair(f)

    def fault(self, st: dict[str, Any]) -> Injected | None:
        drawn = self.draw(st)
        if drawn is None:
            return None
        kind, victims = drawn
        if kind in NODE_FAULTS and not self.outage():
            self.host = batch_host(self.job.job_id) or self.host
            if any(v["node"] == self.host for v in victims):
                self.bag.append(kind)
                return None
        duration = self.rng.uniform(self.args.min_hold, self.args.max_hold)
        f = inject(kind, victims, self.job.run_dir, int(st.get("step", 0)), duration)
        self.faults.append(f)
        say(
            f"fault {len(self.faults)}: {kind} ranks={f.ranks} nodes={f.nodes} at step {f.step}"
            + (f" for {duration:.0f}s" if f.undo_at and kind != "drain" else "")
        )
        return f


def soak(chaos: Chaos, args: argparse.Namespace) -> None:
    """Faults until ``--minutes`` have passed; progress after each."""
    expected = int(args.minutes * 60 / ((args.min_gap + args.max_gap) / 2))
    prog = progress("chaos", expected, "faults")
    end = time.monotonic() + args.minutes * 60
    next_at = time.monotonic() + chaos.rng.uniform(args.min_gap, args.max_gap)
    while time.monotonic() < end:
        if (chaos.job.run_dir / "summary.json").exists():
            raise TmslurmError(f"run {chaos.job.run_dir} ended during the soak; see its events.jsonl")
        st = chaos.job.status()
        if not st and chaos.job.left_the_queue():
            raise TmslurmError(
                f"the main job {chaos.job.job_id} left Slurm's queue during the soak (the run ended "
                f"without a summary); see {chaos.job.run_dir}/events.jsonl"
            )
        chaos.repairs(st)
        if time.monotonic() >= next_at and st.get("mode") == "running":
            f = chaos.fault(st)
            if f is None:
                next_at = time.monotonic() + 2.0
                continue
            prog.advance(note=f"{f.kind}, step {st.get('step')}, events {len(st.get('events', []))}")
            next_at = time.monotonic() + chaos.rng.uniform(args.min_gap, args.max_gap)
        time.sleep(0.5)


def heal_all(chaos: Chaos, timeout: float = 600) -> None:
    """Undo every fault: timed ones at once, the others once Slurm and the run let the admin."""
    deadline = time.monotonic() + timeout
    while any(not f.repaired for f in chaos.faults):
        if time.monotonic() > deadline:
            left = [(f.kind, f.nodes) for f in chaos.faults if not f.repaired]
            raise TmslurmError(f"faults not repaired within {timeout:.0f}s: {left}")
        chaos.repairs(chaos.job.status(), force=True)
        time.sleep(1.0)


def settled(st: dict[str, Any], pool: int) -> bool:
    roles = {r["role"] for r in st.get("ranks", [])}
    warm = [s for s in st.get("standbys", []) if len(s["roles"]) >= len(roles) and not s["busy"]]
    busy = [e for e in st.get("events", []) if e.get("status") not in ("done", "cancelled", "failed")]
    return st.get("mode") == "running" and len(warm) >= pool and not busy


def leftovers(run_dir: Path) -> list[dict[str, Any]]:
    """Processes of this host whose command line names the run directory."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
            state = (p / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and any(str(run_dir).encode() in a for a in argv):
            out.append({"pid": int(p.name), "cmd": b" ".join(argv)[:200].decode(errors="replace")})
    return out


def wait_gone(run_dir: Path, job_ids: list[str], timeout: float = 180) -> list[dict[str, Any]]:
    """Wait until no process names the run and no job of it is queued; what is left at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        left = leftovers(run_dir)
        queued = [j for j in sh("squeue", "-h", "-o", "%i %j", check=False, timeout=30).splitlines() if "tmslurm" in j]
        if not left and not queued:
            return []
        if time.monotonic() > deadline:
            return left + [{"job": q} for q in queued]
        time.sleep(1.0)


def abandon(job: SlurmJob) -> None:
    """After a failure: stop the run (its spares go with it), else cancel its main job."""
    try:
        job.stop(timeout=120)
    except TmslurmError as exc:
        say(f"run did not stop ({exc}); cancelling job {job.job_id}")
        sh("scancel", job.job_id, check=False, timeout=60)


def main(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out).resolve() / time.strftime("chaos-%Y%m%d-%H%M%S")
    run_dir = out / "chaos"
    say(f"chaos: {args.minutes:g} min of faults every {args.min_gap:g}-{args.max_gap:g}s ({args.kinds}) -> {run_dir}")
    job = SlurmJob(run_dir, overrides(args))
    try:
        job.warm_pool(2, timeout=SETTLE_S)
    except BaseException:
        abandon(job)
        raise
    chaos = Chaos(job, args, batch_host(job.job_id), lambda: controller_pid(run_dir) is not None)
    try:
        say(f"main job {job.job_id} on batch host {chaos.host}; both standbys warm")
        t0 = time.time()
        soak(chaos, args)
        soaked_s = time.time() - t0
        say("soak over: repairing every fault, then waiting for the pool to be whole and warm")
    except BaseException:
        heal_all(chaos)
        abandon(job)
        raise
    heal_all(chaos)
    try:  # a small lab may have no node left for a second standby (restarted ranks hold spare allocations)
        job.wait(lambda st: settled(st, 2), POOL_WAIT_S, "two warm standbys")
    except TmslurmError:
        say(f"the pool is not whole after {POOL_WAIT_S:.0f}s (no node for a standby?): settling without it")
        job.wait(lambda st: settled(st, 0), SETTLE_S, "the run to settle (no event in flight)")
    summary = job.stop()
    journal = read_journal(run_dir / "events.jsonl")
    left = wait_gone(run_dir, [job.job_id])
    say(f"run stopped at step {summary['steps']}; running the uninterrupted reference to that step")
    run_local(
        out / "reference",
        ["parallel.dp=2", "parallel.pp=2", f"model={args.model}", f"train.steps={summary['steps']}"],
        timeout=7200,
    )
    ref = read_reference(out / "reference" / "summary.json")  # typed, both hashes set
    pids = sorted(
        {
            int(e["pid"])
            for e in journal
            if e.get("type") in ("agent_up", "monitor_up") and isinstance(e.get("pid"), int)
        }
    )
    faults = [
        InjectedFault(**{**f.for_checker(), "ranks": tuple(f.ranks), "nodes": tuple(f.nodes)}) for f in chaos.faults
    ]
    (out / "faults.json").write_text(json.dumps([f.for_checker() for f in chaos.faults], indent=1))
    report = check_run(run_dir, reference=ref, faults=faults, pids=pids, max_lag_s=args.max_lag)
    print(format_report(report), flush=True)
    result = _result(args, chaos, summary, report, left, soaked_s, len(pids))
    write_json(Path(args.json), result)
    return result


def _result(
    args: argparse.Namespace,
    chaos: Chaos,
    summary: dict[str, Any],
    report: Any,
    left: list[dict[str, Any]],
    soaked_s: float,
    npids: int,
) -> dict[str, Any]:
    return {
        "command": recorded_command("chaos"),
        "commit": commit(),
        "date": datetime.date.today().isoformat(),
        "setup": {
            "cluster": f"local Slurm failure lab of {lab_nodes()} nodes (scripts/local-slurm up), "
            "one rank per node, one 2-core host",
            "layout": "DP2 x PP2",
            "model": args.model,
            "standbys": "2, replenished",
            "gap_s": [args.min_gap, args.max_gap],
            "hold_s": [args.min_hold, args.max_hold],
            "seed": args.seed,
            "step_delay_s": args.step_delay,
            "checkpoint_every": args.checkpoint_every,
        },
        "soak_minutes": round(soaked_s / 60, 2),
        "steps": summary["steps"],
        "median_step_s": summary.get("median_step_s"),
        "faults": len(chaos.faults),
        "faults_by_kind": dict(Counter(f.kind for f in chaos.faults)),
        "events_by_kind": report.events_by_kind,
        "switches": report.switches,
        "checkpoint_fallbacks": report.checkpoint_fallbacks,
        "downtime_s": report.downtime_s,
        "downtime_total_s": round(sum(e.get("downtime_s") or 0.0 for e in summary.get("events", [])), 3),
        "false_alarms": report.false_alarms,
        "pids_checked": npids,
        "leftover_processes": left,
        "checks": {
            c.name: {"status": c.status, "detail": c.detail, "offending": c.offending[:20]} for c in report.checks
        },
        "passed": report.passed and not left,
        "fault_list": [f.record() for f in chaos.faults],
    }


REFUSED_ADOPTION = "the controller restarted and could not adopt"
"""The cause of the checkpoint restart a refused adoption turns into (tmslurm/controller/adoption.py)."""


def handled_kills(st: dict[str, Any]) -> int:
    """Controller kills the run has dealt with: adopted (a completed ``controller_restart`` event) or
    refused and restarted from a checkpoint (a ``restart`` event with that cause)."""
    return sum(
        1
        for e in st.get("events", [])
        if e.get("status") == "done"
        and (
            e.get("kind") == "controller_restart"
            or (e.get("kind") == "restart" and str(e.get("cause", "")).startswith(REFUSED_ADOPTION))
        )
    )
