"""``python -m benchmarks NAME`` (also ``scripts/bench``), NAME one of
``{downtime,chaos,scaling,overhead,memory,roles,control,ckpt,soak,abortpoints,linkbw,statesize,zero,gray,project,
plots,tables}``."""

from __future__ import annotations

import argparse
import sys
import time

from benchmarks.chaosfaults import KINDS as CHAOS_KINDS


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    d = sub.add_parser("downtime", help="downtime: tmslurm vs in-job restart vs requeue restart (local Slurm)")
    d.add_argument("--model", default="small")
    d.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    d.add_argument("--repeats", type=int, default=10, help="events per cell")
    d.add_argument("--checkpoint-every", type=int, default=20)
    d.add_argument(
        "--heartbeat-timeout", type=float, default=None, help="detect.heartbeat_timeout_s (default: the run's)"
    )
    d.add_argument("--reference-steps", type=int, default=100, help="steps of the uninterrupted reference run")
    d.add_argument("--seed", type=int, default=0, help="seeds where in a checkpoint interval each event lands")
    d.add_argument(
        "--strategies",
        default="reference,tmslurm,injob_restart,requeue_restart",
        help="reference = the uninterrupted run whose median step every downtime subtracts",
    )
    d.add_argument(
        "--events",
        default="planned,power-off,partition,sigkill,sigstop,bh-drain,bh-power-off",
        help="tmslurm's events, in this order per repeat",
    )
    d.add_argument("--restart-events", default="planned,power-off", help="the restart baselines' events")
    d.add_argument("--fresh", action="store_true", help="replace --json instead of merging the cells measured into it")
    d.add_argument(
        "--append", action="store_true", help="add the events to the cells already in --json (same reference)"
    )
    d.add_argument("--json", default="docs/bench/downtime.json")
    s = sub.add_parser("scaling", help="phase 2 and downtime at 4, 8, 16 ranks: delta vs full rebuild (local)")
    s.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16])
    s.add_argument("--repeats", type=int, default=1)
    s.add_argument("--steps", type=int, default=30)
    s.add_argument("--json", default="docs/bench/scaling.json")
    o = sub.add_parser("overhead", help="steady-state cost of vote, heartbeats, watcher (local Slurm)")
    o.add_argument("--model", default="small")
    o.add_argument("--steps", type=int, default=60)
    o.add_argument("--repeats", type=int, default=3)
    o.add_argument("--step-delay-s", type=float, default=0.5, help="pace each step (bench.step_delay_s)")
    o.add_argument("--json", default="docs/bench/overhead.json")
    m = sub.add_parser("memory", help="stayer peak RSS around switches, standby RSS per role (local)")
    m.add_argument("--model", default="small")
    m.add_argument("--steps", type=int, default=60)
    m.add_argument("--json", default="docs/bench/memory.json")
    r = sub.add_parser(
        "roles", help="planned-join downtime per role and TP position, standby cost per shape class (local)"
    )
    r.add_argument("--model", default="tiny")
    r.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False)
    r.add_argument("--repeats", type=int, default=3)
    r.add_argument("--json", default="docs/bench/roles.json")
    c = sub.add_parser(
        "control", help="the real controller under N simulated agents: commit latency, CPU, threads (local)"
    )
    c.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024, 4096])
    c.add_argument("--pp", type=int, default=2)
    c.add_argument("--steps", type=int, default=50, help="measured steps per size")
    c.add_argument("--warmup", type=int, default=5)
    c.add_argument(
        "--max-measure-s", type=float, default=150.0, help="end the measured window after this even if short of --steps"
    )
    c.add_argument("--step-ms", type=float, default=50.0, help="simulated compute time of a step")
    c.add_argument("--heartbeat-s", type=float, default=0.2, help="detect.heartbeat_interval_s")
    c.add_argument("--window", type=int, default=16, help="hellos waiting for their welcome at once")
    c.add_argument(
        "--relay",
        type=int,
        default=0,
        metavar="K",
        help="K ranks per node, each node's agents behind one simulated node relay (0: every agent connects itself)",
    )
    c.add_argument(
        "--stall-s", type=float, default=30.0, help="fail a size whose admission makes no progress this long"
    )
    c.add_argument("--profile", type=int, default=0, help="run py-spy on the controller at this N")
    c.add_argument("--profile-s", type=float, default=15.0)
    c.add_argument("--override", action="append", default=[], help="one more Hydra override of the run")
    c.add_argument("--label", default="defaults", help="name of this series in the JSON rows")
    c.add_argument("--append", action="store_true", help="add the rows to those already in --json")
    c.add_argument("--json", default="docs/bench/control_scale.json")
    so = sub.add_parser(
        "soak", help="a long fault-free run with compile and two standbys: it must raise no alarm (local)"
    )
    so.add_argument("--minutes", type=float, default=10.0)
    so.add_argument("--model", default="small")
    so.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    so.add_argument("--dp", type=int, default=2)
    so.add_argument("--pp", type=int, default=2)
    so.add_argument("--standbys", type=int, default=2)
    so.add_argument("--override", action="append", default=[], help="one more Hydra override of the run")
    so.add_argument("--json", default="docs/bench/soak.json")
    k = sub.add_parser("ckpt", help="step stall of periodic checkpoints: off vs sync vs async (one process)")
    k.add_argument("--model", default="small")
    k.add_argument("--steps", type=int, default=60)
    k.add_argument("--every", type=int, default=5)
    k.add_argument("--repeats", type=int, default=2)
    k.add_argument("--warmup", type=int, default=3)
    k.add_argument("--json", default="docs/bench/ckpt.json")
    ap_ = sub.add_parser(
        "abortpoints", help="a step's time with the abort points between layers armed and disarmed (in process)"
    )
    ap_.add_argument("--model", default="tiny")
    ap_.add_argument("--repeats", type=int, default=200)
    ap_.add_argument("--json", default="docs/bench/abortpoints.json")
    lb = sub.add_parser(
        "linkbw", help="state transfer vs the raw link on one gloo pair, per model preset (two processes)"
    )
    lb.add_argument(
        "--models", default="small,base", help="model presets, comma-separated (tiny, small, medium, base, large)"
    )
    lb.add_argument("--repeats", type=int, default=5)
    lb.add_argument(
        "--lab-nodes",
        default="",
        help="two failure-lab nodes, e.g. node1,node2 (scripts/local-slurm up): "
        "measure between them instead of on loopback",
    )
    lb.add_argument("--port", type=int, default=29631, help="the store's port on the first lab node (--lab-nodes)")
    lb.add_argument("--json", default="docs/bench/linkbw.json")
    ss = sub.add_parser(
        "statesize",
        help="pause and downtime of planned (shadow or not), unexpected and in-job restart "
        "moves per state size, with link bandwidth and memory (local)",
    )
    ss.add_argument("--models", default="small,medium,base,large", help="model presets, smallest first")
    ss.add_argument("--repeats", type=int, default=5, help="events per cell")
    ss.add_argument("--link-repeats", type=int, default=5)
    ss.add_argument(
        "--cells",
        default="shadow,noshadow,unexpected,unexpected_overlap,injob_restart",
        help="the cells to measure per size (a subset leaves the others' figures null)",
    )
    ss.add_argument("--json", default="docs/bench/statesize.json")
    z = sub.add_parser(
        "zero",
        help="the sharded optimizer (parallel.zero=1): optimizer bytes, the buddy's cost per step, "
        "drain and SIGKILL downtime against zero=0 (local)",
    )
    z.add_argument("--layouts", default="dp4pp1,dp2pp2", help="dp4pp1, dp2pp2, comma-separated")
    z.add_argument("--models", default="small", help="model presets, comma-separated")
    z.add_argument("--repeats", type=int, default=5, help="drains and kills per zero level and layout")
    z.add_argument("--steps", type=int, default=40, help="steps of the run that times the buddy")
    z.add_argument("--json", default="docs/bench/zero.json")
    cr = sub.add_parser(
        "ctlrestart", help="kill -9 of the controller at random steps: downtime and its parts, exactness"
    )
    cr.add_argument("--kills", type=int, default=10)
    cr.add_argument("--steps", type=int, default=400)
    cr.add_argument("--dp", type=int, default=2)
    cr.add_argument("--pp", type=int, default=2)
    cr.add_argument("--model", default="tiny")
    cr.add_argument("--step-delay-s", type=float, default=0.05)
    cr.add_argument("--seed", type=int, default=0)
    cr.add_argument(
        "--cluster",
        choices=("local", "slurm"),
        default="local",
        help="where the interrupted run runs (slurm: the local cluster, scripts/local-slurm up)",
    )
    cr.add_argument("--json", default="docs/bench/ctlrestart.json")
    w = sub.add_parser(
        "watcher", help="the Slurm watcher's poll against a cluster that defines many nodes (local Slurm)"
    )
    w.add_argument("--polls", type=int, default=20)
    w.add_argument("--per-node-polls", type=int, default=3)
    w.add_argument("--watch", type=int, default=0, help="watch at most this many of the defined nodes (0: all)")
    w.add_argument("--idle-s", type=float, default=10.0, help="quiet window to measure slurmctld's idle CPU")
    w.add_argument("--json", default="docs/bench/watcher.json")
    sb = sub.add_parser("standby", help="a warm standby's CPU and memory while it waits, per shape class (local)")
    sb.add_argument("--model", default="small")
    sb.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False)
    sb.add_argument("--standbys", type=int, default=2)
    sb.add_argument("--idle-s", type=float, default=30.0, help="the sampling window once every standby is warm")
    sb.add_argument("--step-delay-s", type=float, default=0.5, help="pace each step (bench.step_delay_s)")
    sb.add_argument("--json", default="docs/bench/standby.json")
    g = sub.add_parser(
        "gray",
        help="a throttled node / a slow link on the lab: found and moved off?, detection, steps lost (local Slurm)",
    )
    g.add_argument("--kinds", default="throttle:30,slowlink:20mbit", help="kind:amount, comma-separated")
    g.add_argument("--model", default="small")
    g.add_argument("--repeats", type=int, default=3, help="runs per kind")
    g.add_argument("--baseline", type=int, default=30, help="committed steps before the node is slowed")
    g.add_argument("--observe", type=int, default=40, help="steps to watch a slowed node that is not moved off")
    g.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the eviction at most")
    g.add_argument("--json", default="docs/bench/gray.json")
    tl = sub.add_parser(
        "timelimit", help="a main job's time limit: pause and parts, slurm.on_limit requeue vs resubmit (local Slurm)"
    )
    tl.add_argument("--modes", default="requeue,resubmit")
    tl.add_argument("--boundaries", type=int, default=3, help="time-limit boundaries per mode (one 2-minute job each)")
    tl.add_argument("--model", default="small")
    tl.add_argument("--step-delay-s", type=float, default=0.2, help="pace each step (bench.step_delay_s)")
    tl.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for one boundary at most")
    tl.add_argument("--json", default="docs/bench/timelimit.json")
    ch = sub.add_parser(
        "chaos", help="random faults of every kind on the lab for --minutes, then the invariant checker (local Slurm)"
    )
    ch.add_argument("--minutes", type=float, default=60.0, help="how long faults are injected")
    ch.add_argument("--kinds", default=",".join(CHAOS_KINDS), help="fault kinds, comma-separated")
    ch.add_argument("--min-gap", type=float, default=20.0, help="least seconds between two faults")
    ch.add_argument("--max-gap", type=float, default=60.0, help="most seconds between two faults")
    ch.add_argument(
        "--min-hold", type=float, default=10.0, help="least seconds a throttle, slow link or slurmctld outage lasts"
    )
    ch.add_argument(
        "--max-hold", type=float, default=30.0, help="most seconds a throttle, slow link or slurmctld outage lasts"
    )
    ch.add_argument("--model", default="small")
    ch.add_argument(
        "--step-delay",
        type=float,
        default=0.5,
        help="pace each step (bench.step_delay_s): fewer steps for the reference",
    )
    ch.add_argument("--checkpoint-every", type=int, default=50)
    ch.add_argument("--max-controller-kills", type=int, default=50)
    ch.add_argument("--max-lag", type=float, default=60.0, help="longest fault-to-event delay the checker accepts (s)")
    ch.add_argument("--slurm-time", default="04:00:00", help="the main job's time limit")
    ch.add_argument("--seed", type=int, default=0)
    ch.add_argument("--json", default="docs/bench/chaos.json")
    pl = sub.add_parser(
        "plots", help="plot a downtime.json and/or a scaling.json: PNGs and bench.md in --out (needs matplotlib)"
    )
    pl.add_argument("--downtime-json", default=None, metavar="PATH", help="e.g. docs/bench/downtime.json")
    pl.add_argument("--scaling-json", default=None, metavar="PATH", help="e.g. docs/bench/scaling.json")
    pl.add_argument("--out", required=True, metavar="DIR", help="where the PNGs and bench.md go")
    t = sub.add_parser("tables", help="render docs/bench/*.json as markdown")
    t.add_argument("--dir", default="docs/bench")
    sub.add_parser(
        "project",
        help="wasted GPU-hours per week at scale, tmslurm's downtime modelled part by part; "
        "options are benchmarks.sim.projection's",
    )
    for sp in (d, s, o, m, r, c, k, so, cr, sb, ss, z, g, tl, ch):
        sp.add_argument("--out", default=f"runs/bench-{stamp}")
    return ap


def main(argv: list[str] | None = None) -> int:
    args, rest = parser().parse_known_args(argv)
    if args.cmd == "project":
        from benchmarks.sim.projection import main as project

        return project(rest or ["--out", "docs/bench/projection.json"])
    if rest:
        parser().error(f"unrecognized arguments: {' '.join(rest)}")
    module = __import__(f"benchmarks.{args.cmd}", fromlist=["main"])
    result = module.main(args)
    if isinstance(result, int):
        return result
    return 1 if isinstance(result, dict) and result.get("passed") is False else 0


if __name__ == "__main__":
    sys.exit(main())
