"""The demo: one training job that survives a planned drain and a node failure, exactly.

Contract: ``python -m tmslurm.tools.demo [--cluster local|slurm] [--out DIR]`` runs the same DP2 x PP2 job
twice: once uninterrupted (the reference) and once with a drain of one training node mid-run and,
later, the loss of another, with warm standbys. It prints each event with its downtime and parts
next to what a full in-job restart of the same job costs (measured in the same demo), writes the
report of the interrupted run, and exits 0 only if the interrupted run's final parameters hash equals
the reference's.

Progress (:mod:`tmslurm.core.progress`, plain lines, each flushed): after each of the three runs, ``demo:
runs 1/3, elapsed .., remaining ~..`` on stdout with the demo's other lines; during a run, every
``STEP_EVERY`` steps and at the last, ``demo reference: steps 20/60, elapsed .., remaining ~..`` on
stderr with the run's log, read from the run's ``snapshot.json`` by a thread (:class:`StepWatch`);
a snapshot not written yet or unreadable shows nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tmslurm.controller.events import describe
from tmslurm.core.config import compose_config
from tmslurm.core.progress import Progress
from tmslurm.core.rundir import RunDir

STEP_EVERY = 10
"""A step progress line every this many steps (and at the last)."""
POLL_S = 1.0
"""How often the step watcher reads the run's snapshot."""


def _run(overrides: list[str]) -> dict[str, Any]:
    from tmslurm.cli.launch import run_local

    return run_local(compose_config(overrides)).record()


def snapshot_step(run_dir: Path) -> int | None:
    """The steps the run has committed (its controller's latest snapshot), None if not readable yet."""
    try:
        step = json.loads(RunDir(run_dir).snapshot.read_text()).get("step")
    except (OSError, ValueError, AttributeError):
        return None
    return step if isinstance(step, int) else None


class StepWatch:
    """A run's steps through a :class:`Progress`: :meth:`poll` writes a line when the step crossed a
    multiple of ``every`` or reached the total since the last line."""

    def __init__(self, read_step: Callable[[], int | None], progress: Progress, every: int = STEP_EVERY) -> None:
        self.read_step = read_step
        self.progress = progress
        self.every = every
        self.shown = 0
        """The step of the last line written."""

    def poll(self) -> str | None:
        """The line written now, or None."""
        step = self.read_step()
        if step is None or step <= self.shown:
            return None
        last = self.progress.total is not None and step >= self.progress.total
        if step // self.every == self.shown // self.every and not last:
            return None
        self.shown = step
        return self.progress.update(step)


@contextlib.contextmanager
def follow_steps(run_dir: Path, total: int, name: str) -> Iterator[StepWatch]:
    """Watch ``run_dir``'s steps from a thread while the block runs (stderr, with the run's log lines)."""
    watch = StepWatch(
        lambda: snapshot_step(run_dir), Progress(total, "steps", sys.stderr, title=f"demo {name}", inplace=False)
    )
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(POLL_S):
            watch.poll()

    thread = threading.Thread(target=loop, name="demo-steps", daemon=True)
    thread.start()
    try:
        yield watch
    finally:
        stop.set()
        thread.join(5 * POLL_S)
        watch.poll()  # the last steps, committed since the thread's last look


def main(argv: list[str] | None = None) -> int:
    from tmslurm.agent.main import setup_logging

    ap = argparse.ArgumentParser(prog="tmslurm-demo")
    ap.add_argument("--cluster", choices=["local", "slurm"], default="slurm")
    ap.add_argument("--out", default=f"runs/demo-{time.strftime('%Y%m%d-%H%M%S')}")
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args(argv)
    setup_logging()
    if isinstance(sys.stdout, io.TextIOWrapper):  # every line reaches a CI log at once, in order with stderr's
        sys.stdout.reconfigure(line_buffering=True)
    out = Path(args.out).resolve()
    common = ["+experiment=demo", f"train.steps={args.steps}", "bench.step_delay_s=0.1", f"cluster={args.cluster}"]
    drain, kill = args.steps // 3, 2 * args.steps // 3
    kill_kind = "kill" if args.cluster == "local" else "node_down"
    faults = f"faults=[{{step:{drain},kind:drain,rank:1}},{{step:{kill},kind:{kill_kind},rank:2}}]"
    runs = Progress(3, "runs", sys.stdout, title="demo", inplace=False)
    print(f"== 1/3 reference run (uninterrupted) -> {out}/reference")
    with follow_steps(out / "reference", args.steps, "reference"):
        ref = _run([*[c for c in common if not c.startswith("cluster=")], "cluster=local", f"run_dir={out}/reference"])
    runs.advance(note="reference run done")
    loss = "power off rank 2's node (silent)" if args.cluster == "slurm" else "kill rank 2's process"
    print(f"== 2/3 tmslurm run: drain rank 1's node at step {drain}, {loss} at step {kill} -> {out}/tmslurm")
    with follow_steps(out / "tmslurm", args.steps, "tmslurm"):
        if args.cluster == "slurm":
            tm = _run_slurm(out / "tmslurm", [c for c in common if not c.startswith("cluster=")], drain, kill)
        else:
            tm = _run([*common, f"run_dir={out}/tmslurm", faults])
    runs.advance(note="tmslurm run done")
    print(
        f"== 3/3 the same events with an in-job restart (torchrun-style, local processes; its loss is a process kill,"
        f" detected at once) -> {out}/restart"
    )
    local = [c for c in common if not c.startswith("cluster=")] + ["cluster=local"]
    local_faults = faults.replace("node_down", "kill")
    with follow_steps(out / "restart", args.steps, "restart"):
        rs = _run(
            [*local, f"run_dir={out}/restart", local_faults, "bench.restart_mode=injob_restart", "standby.count=0"]
        )
    runs.advance(note="in-job restart run done")
    print(_compare(tm, rs))
    try:
        from tmslurm.cli.report import write_report

        report = write_report(out / "tmslurm")
        print(f"report: {report}")
    except Exception as exc:  # the report is a convenience; the verdict is the hash
        print(f"(report not written: {exc})")
    same = tm["final_params_sha256"] == ref["final_params_sha256"]
    print(
        f"reference hash {ref['final_params_sha256']}\ntmslurm   hash {tm['final_params_sha256']}\n"
        f"restart   hash {rs['final_params_sha256']}\n{'EXACT: same model bit for bit' if same else 'MISMATCH'}"
    )
    (out / "verdict.json").write_text(
        json.dumps({"exact": same, "reference": ref["final_params_sha256"], "tmslurm": tm["final_params_sha256"]})
    )
    return 0 if same else 1


def _run_slurm(run_dir: Path, common: list[str], drain: int, kill: int) -> dict[str, Any]:
    """Through Slurm: submit, drain rank 1's node (scontrol), power off rank 2's node (the failure lab:
    silent, no socket closes), finish."""
    from tmslurm.tools.slurm_job import SlurmJob, local_slurm, resume_node, sh

    # The power-off is injected by the run itself at step ``kill`` (the failure lab's ``power-off``),
    # so the controller knows the fault's moment and measures detection from it.
    fault = f"faults=[{{step:{kill},kind:power_off,rank:2}}]"
    job = SlurmJob(
        run_dir, [*common, "slurm.partition=debug", "slurm.time=00:20:00", "slurm.poll_interval_s=0.5", fault]
    )
    job.wait(lambda st: st.get("step", 0) >= drain, 600, f"step {drain}")
    node1, _ = job.node_of_rank(1)
    node2, _ = job.node_of_rank(2)
    print(f"   scontrol update nodename={node1} state=drain reason=demo-maintenance")
    sh("scontrol", "update", f"nodename={node1}", "state=drain", "reason=demo-maintenance")
    print(f"   at step {kill} the run calls: scripts/local-slurm power-off {node2}  ({fault})")
    summary_path = run_dir / "summary.json"
    deadline = time.monotonic() + 900
    while not summary_path.exists() and time.monotonic() < deadline:
        time.sleep(1)
    print(
        f"   main job {job.job_id}: "
        + " ".join(
            w
            for w in sh("scontrol", "show", "job", job.job_id).split()
            if w.startswith(("JobState=", "Restarts=", "NodeList="))
        )
    )
    print("   " + sh("sinfo", "-N", "-h", "-n", f"{node1},{node2}", "-o", "%N %T %E").strip().replace("\n", "\n   "))
    local_slurm("power-on", node2)
    for node in (node1, node2):
        resume_node(node)
    return json.loads(summary_path.read_text())


def _compare(tm: dict[str, Any], rs: dict[str, Any]) -> str:
    lines = ["", f"{'event':<12}{'tmslurm downtime':>18}{'in-job restart':>16}{'ratio':>8}"]
    for a, b in zip(tm["events"], rs["events"]):
        da, db = a.get("downtime_s") or 0.0, b.get("downtime_s") or 0.0
        ratio = f"{db / da:.0f}x" if da > 0 else "-"
        lines.append(f"{a['kind']:<12}{da:>17.3f}s{db:>15.3f}s{ratio:>8}")
        lines.append(f"    tmslurm:        {describe(a).split(' | ', 1)[-1]}")
        lines.append(f"    in-job restart: {describe(b).split(' | ', 1)[-1]}")
    lines.append("    (the parts and 'other' add up to the gap; downtime = gap - median step time)")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
